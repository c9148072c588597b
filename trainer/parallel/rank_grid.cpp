#include "trainer/parallel/rank_grid.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/layout.h"

namespace weft::parallel {

namespace {

size_t idx(Axis a) { return static_cast<size_t>(a); }

std::string degrees(int64_t tp, int64_t cp, int64_t pp, int64_t dp) {
  return cp == 1 ? fmt::format("tp{}-pp{}-dp{}", tp, pp, dp) : fmt::format("tp{}-cp{}-pp{}-dp{}", tp, cp, pp, dp);
}

}  // namespace

const char* to_string(Axis a) {
  switch (a) {
    case Axis::tp: return "tp";
    case Axis::pp: return "pp";
    case Axis::dp: return "dp";
    case Axis::cp: return "cp";
  }
  return "?";
}

RankOrder RankOrder::parse(const std::string& text) {
  std::vector<Axis> axes;
  std::array<bool, 4> seen{};
  size_t start = 0;
  bool ok = true;
  while (ok) {
    const size_t dash = text.find('-', start);
    const std::string part =
        text.substr(start, dash == std::string::npos ? std::string::npos : dash - start);
    Axis a;
    if (part == "tp") {
      a = Axis::tp;
    } else if (part == "cp") {
      a = Axis::cp;
    } else if (part == "pp") {
      a = Axis::pp;
    } else if (part == "dp") {
      a = Axis::dp;
    } else {
      ok = false;
      break;
    }
    if (axes.size() == 4 || seen[idx(a)]) {
      ok = false;
      break;
    }
    seen[idx(a)] = true;
    axes.push_back(a);
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  // Three axes: cp goes right after tp, where it stays inside tp's node.
  if (ok && axes.size() == 3 && !seen[idx(Axis::cp)])
    for (size_t i = 0; i < axes.size(); ++i)
      if (axes[i] == Axis::tp) {
        axes.insert(axes.begin() + long(i) + 1, Axis::cp);
        break;
      }
  if (!ok || axes.size() != 4) {
    throw InputError(
        fmt::format("rank order '{}' is not a permutation of tp, cp, dp and pp (or of tp, dp and pp) written "
                    "fastest first, e.g. 'tp-cp-dp-pp'",
                    text));
  }
  RankOrder o;
  std::copy(axes.begin(), axes.end(), o.fastest_first.begin());
  return o;
}

std::string RankOrder::to_string() const {
  return fmt::format("{}-{}-{}-{}", parallel::to_string(fastest_first[0]), parallel::to_string(fastest_first[1]),
                     parallel::to_string(fastest_first[2]), parallel::to_string(fastest_first[3]));
}

const std::vector<int64_t>& RankGroups::members(Axis a) const {
  return a == Axis::tp ? tp : a == Axis::pp ? pp : a == Axis::dp ? dp : cp;
}

int64_t RankGroups::group_index(Axis a) const {
  return a == Axis::tp ? tp_group : a == Axis::pp ? pp_group : a == Axis::dp ? dp_group : cp_group;
}

RankGrid::RankGrid(int64_t world, int64_t tp, int64_t pp, int64_t dp, RankOrder order, int64_t cp)
    : world_(world), order_(order) {
  if (tp < 1 || cp < 1 || pp < 1 || dp < 1 || world < 1) {
    throw InputError(fmt::format(
        "rank grid {} over a world of {}: every degree and the world size must be at least 1",
        degrees(tp, cp, pp, dp), world));
  }
  int64_t product = 0;
  const bool overflow = __builtin_mul_overflow(tp, cp, &product) || __builtin_mul_overflow(product, pp, &product) ||
                        __builtin_mul_overflow(product, dp, &product);
  if (overflow || product != world) {
    throw InputError(fmt::format("rank grid {} needs {} = {} ranks, but the world has {}", degrees(tp, cp, pp, dp),
                                 cp == 1 ? "tp * pp * dp" : "tp * cp * pp * dp",
                                 overflow ? std::string("more than 2^63") : std::to_string(product), world));
  }
  sizes_[idx(Axis::tp)] = tp;
  sizes_[idx(Axis::cp)] = cp;
  sizes_[idx(Axis::pp)] = pp;
  sizes_[idx(Axis::dp)] = dp;
}

RankGrid RankGrid::of_layout(const Layout& layout, int64_t world, RankOrder order) {
  return RankGrid(world, layout.tp, layout.pp, layout.dp, order, layout.cp);
}

int64_t RankGrid::size(Axis a) const { return sizes_[idx(a)]; }

int64_t RankGrid::stride(Axis a) const {
  int64_t s = 1;
  for (Axis b : order_.fastest_first) {
    if (b == a) return s;
    s *= sizes_[idx(b)];
  }
  WEFT_ASSERT(false);
  return 0;
}

RankCoords RankGrid::coords(int64_t rank) const {
  WEFT_ASSERT(rank >= 0 && rank < world_);
  RankCoords c;
  int64_t rest = rank;
  for (Axis a : order_.fastest_first) {
    const int64_t v = rest % sizes_[idx(a)];
    rest /= sizes_[idx(a)];
    (a == Axis::tp ? c.tp : a == Axis::pp ? c.pp : a == Axis::dp ? c.dp : c.cp) = v;
  }
  return c;
}

int64_t RankGrid::rank_of(const RankCoords& c) const {
  int64_t rank = 0;
  for (Axis a : {Axis::tp, Axis::cp, Axis::pp, Axis::dp}) {
    WEFT_ASSERT(c[a] >= 0 && c[a] < size(a));
    rank += c[a] * stride(a);
  }
  return rank;
}

std::vector<int64_t> RankGrid::group(Axis a, int64_t rank) const {
  const int64_t s = stride(a);
  const int64_t first = rank - coords(rank)[a] * s;
  std::vector<int64_t> members(size_t(size(a)));
  for (int64_t i = 0; i < size(a); ++i) members[size_t(i)] = first + i * s;
  return members;
}

int64_t RankGrid::group_index(Axis a, int64_t rank) const {
  // Number the groups by the remaining coordinates, nested in the grid's order.
  const RankCoords c = coords(rank);
  int64_t index = 0;
  int64_t scale = 1;
  for (Axis b : order_.fastest_first) {
    if (b == a) continue;
    index += c[b] * scale;
    scale *= size(b);
  }
  return index;
}

std::vector<int64_t> RankGrid::dpcp_group(int64_t rank) const {
  const RankCoords c = coords(rank);
  const int64_t base = rank - c.cp * stride(Axis::cp) - c.dp * stride(Axis::dp);
  std::vector<int64_t> members;
  members.reserve(size_t(size(Axis::cp) * size(Axis::dp)));
  for (int64_t d = 0; d < size(Axis::dp); ++d)
    for (int64_t k = 0; k < size(Axis::cp); ++k) members.push_back(base + k * stride(Axis::cp) + d * stride(Axis::dp));
  return members;
}

int64_t RankGrid::dpcp_group_index(int64_t rank) const {
  // Number the groups by tp and pp, nested in the grid's order.
  const RankCoords c = coords(rank);
  int64_t index = 0;
  int64_t scale = 1;
  for (Axis b : order_.fastest_first) {
    if (b == Axis::cp || b == Axis::dp) continue;
    index += c[b] * scale;
    scale *= size(b);
  }
  return index;
}

std::vector<std::vector<int64_t>> RankGrid::all_groups(Axis a) const {
  std::vector<std::vector<int64_t>> groups(size_t(world_ / size(a)));
  for (int64_t r = 0; r < world_; ++r) {
    if (coords(r)[a] == 0) groups[size_t(group_index(a, r))] = group(a, r);
  }
  return groups;
}

int64_t RankGrid::shift(Axis a, int64_t rank, int64_t delta) const {
  const int64_t n = size(a);
  const int64_t from = coords(rank)[a];
  const int64_t to = ((from + delta) % n + n) % n;
  return rank + (to - from) * stride(a);
}

RankGroups RankGrid::groups_of(int64_t rank) const {
  RankGroups g;
  g.rank = rank;
  g.coords = coords(rank);
  g.tp = group(Axis::tp, rank);
  g.pp = group(Axis::pp, rank);
  g.dp = group(Axis::dp, rank);
  g.cp = group(Axis::cp, rank);
  g.dpcp = dpcp_group(rank);
  g.tp_group = group_index(Axis::tp, rank);
  g.pp_group = group_index(Axis::pp, rank);
  g.dp_group = group_index(Axis::dp, rank);
  g.cp_group = group_index(Axis::cp, rank);
  g.dpcp_group = dpcp_group_index(rank);
  return g;
}

RankGroups rank_groups(int64_t world, int64_t tp, int64_t pp, int64_t dp, int64_t rank, RankOrder order,
                       int64_t cp) {
  return RankGrid(world, tp, pp, dp, order, cp).groups_of(rank);
}

std::vector<RingChannel> ring_channels(int64_t size, int64_t rank) {
  WEFT_ASSERT(size >= 1 && rank >= 0 && rank < size);
  std::vector<RingChannel> out;
  if (size == 1) return out;
  const int64_t edges = size == 2 ? 1 : size;
  for (int64_t e = 0; e < edges; ++e) {
    const int64_t a = e, b = (e + 1) % size;
    if (rank != a && rank != b) continue;
    out.push_back({a, b});
    out.push_back({b, a});
  }
  return out;
}

}  // namespace weft::parallel
