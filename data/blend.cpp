#include "data/blend.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::data {

namespace {

// Shares are fixed-point with 53 fractional bits: exact for every double in
// [0, 1], and the walk is integer arithmetic, so every rank and every build
// (with or without fused multiply-adds) routes a sample the same way.
constexpr int kShareBits = 53;
constexpr uint64_t kShareOne = uint64_t{1} << kShareBits;

double weight_sum(const std::vector<double>& w, int64_t lo, int64_t hi) {
  double s = 0;
  for (int64_t i = lo; i < hi; ++i) s += w[static_cast<size_t>(i)];
  return s;
}

// How many of a node's first n samples go left: floor(share * n + 1/2).
uint64_t left_count(uint64_t share, uint64_t n) {
  const unsigned __int128 x =
      static_cast<unsigned __int128>(share) * n + (static_cast<unsigned __int128>(1) << (kShareBits - 1));
  return static_cast<uint64_t>(x >> kShareBits);
}

}  // namespace

BlendSchedule::BlendSchedule(const std::vector<double>& weights)
    : parts_(static_cast<int64_t>(weights.size())) {
  WEFT_ASSERT(!weights.empty());
  for (const double w : weights) WEFT_ASSERT(std::isfinite(w) && w >= 0);
  WEFT_ASSERT(weight_sum(weights, 0, parts_) > 0);
  nodes_.reserve(static_cast<size_t>(2 * parts_));
  build(weights, 0, parts_);
}

int64_t BlendSchedule::build(const std::vector<double>& weights, int64_t lo, int64_t hi) {
  const auto at = static_cast<int64_t>(nodes_.size());
  nodes_.emplace_back();
  if (hi - lo == 1) {
    nodes_[static_cast<size_t>(at)].part = lo;
    return at;
  }
  const int64_t mid = lo + (hi - lo) / 2;
  const double left = weight_sum(weights, lo, mid), all = weight_sum(weights, lo, hi);
  // A subtree of weight 0 is never reached, whatever its share says.
  const double p = all > 0 ? left / all : 0.5;
  const int64_t l = build(weights, lo, mid);
  const int64_t r = build(weights, mid, hi);
  Node& n = nodes_[static_cast<size_t>(at)];
  n.left = l;
  n.right = r;
  n.share = static_cast<uint64_t>(std::llround(std::ldexp(p, kShareBits)));
  return at;
}

BlendSchedule::Pick BlendSchedule::pick(int64_t global_index) const {
  WEFT_ASSERT(global_index >= 0);
  // i: the sample's index among those the current node receives.
  auto i = static_cast<uint64_t>(global_index);
  const Node* n = &nodes_[0];
  while (n->part < 0) {
    const uint64_t before = left_count(n->share, i);
    if (left_count(n->share, i + 1) > before) {
      i = before;
      n = &nodes_[static_cast<size_t>(n->left)];
    } else {
      i -= before;
      n = &nodes_[static_cast<size_t>(n->right)];
    }
  }
  return {n->part, static_cast<int64_t>(i)};
}

// ---- BlendTokenSource -------------------------------------------------------

BlendTokenSource::BlendTokenSource(std::vector<std::unique_ptr<TokenSource>> parts,
                                   std::vector<double> weights)
    : all_(std::move(parts)), weights_(std::move(weights)) {
  WEFT_ASSERT(static_cast<int64_t>(weights_.size()) == all_.parts());
}

std::string BlendTokenSource::describe() const {
  std::vector<std::string> items;
  for (int64_t p = 0; p < all_.parts(); ++p)
    items.push_back(fmt::format("{} x {}", weights_[static_cast<size_t>(p)], all_.part(p).describe()));
  return fmt::format("blend of {}", fmt::join(items, ", "));
}

std::vector<WeightedPart> BlendTokenSource::blend_parts() const {
  std::vector<WeightedPart> parts;
  for (int64_t p = 0; p < all_.parts(); ++p)
    parts.push_back({&all_.part(p), weights_[static_cast<size_t>(p)]});
  return parts;
}

}  // namespace weft::data
