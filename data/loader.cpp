#include "data/loader.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::data {

namespace {

int64_t windows_of(const TokenSource& source, int64_t seq) {
  if (source.size() < seq + 1)
    throw InputError(fmt::format(
        "sequence length {} needs at least {} tokens (seq + 1) but {} is shorter; use a "
        "shorter --seq or more data",
        seq, seq + 1, source.describe()));
  return (source.size() - 1) / seq;
}

// A blend's parts shuffle with seeds of their own, so that two parts of the
// same size do not visit their windows in the same order. A lone source
// keeps the run's seed.
uint64_t part_seed(uint64_t seed, size_t part, size_t parts) {
  if (parts == 1) return seed;
  return mix64(seed ^ mix64(0x626C656E64ull /* "blend" */ + part));
}

}  // namespace

Loader::Loader(const TokenSource& source, int64_t seq, uint64_t seed, Order order)
    : seq_(seq), order_(order) {
  if (seq < 1) throw InputError(fmt::format("sequence length {} must be positive", seq));
  const auto parts = source.blend_parts();
  std::vector<double> weights;
  for (size_t p = 0; p < parts.size(); ++p) {
    const WeightedPart& w = parts[p];
    parts_.push_back({w.source, w.weight > 0 ? windows_of(*w.source, seq) : 0,
                      part_seed(seed, p, parts.size())});
    weights.push_back(w.weight);
  }
  if (parts_.size() > 1) schedule_.emplace(weights);
}

int64_t Loader::windows() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += p.windows;
  return n;
}

BlendSchedule::Pick Loader::pick(int64_t global_index) const {
  WEFT_ASSERT(global_index >= 0);
  if (!schedule_) return {0, global_index};
  return schedule_->pick(global_index);
}

int64_t Loader::epoch(int64_t global_index) const {
  const auto [part, index] = pick(global_index);
  return index / parts_[static_cast<size_t>(part)].windows;
}

int64_t Loader::window(int64_t global_index) const { return part_window(pick(global_index)); }

int64_t Loader::part_window(BlendSchedule::Pick pick) const {
  const Part& p = parts_[static_cast<size_t>(pick.part)];
  const int64_t e = pick.index / p.windows;
  const int64_t pos = pick.index % p.windows;
  if (order_ == Order::sequential) return pos;
  // A fresh, unrelated key per (seed, epoch).
  const Permutation perm(p.windows, mix64(mix64(p.seed) + static_cast<uint64_t>(e)));
  return perm.at(pos);
}

void Loader::sample(int64_t global_index, int32_t* inputs, int32_t* targets) const {
  const auto pk = pick(global_index);
  const TokenSource& source = *parts_[static_cast<size_t>(pk.part)].source;
  const int64_t start = part_window(pk) * seq_;
  source.tokens_copy(start, seq_, inputs);
  source.tokens_copy(start + 1, seq_, targets);
}

void Loader::batch(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const {
  for (int64_t b = 0; b < count; ++b) sample(first + b, inputs + b * seq_, targets + b * seq_);
}

Loader validation_loader(const TokenSource& val, int64_t seq) {
  return Loader(val, seq, kValidationSeed, Loader::Order::shuffled);
}

ValidationSamples validation_samples(const TokenSource& val, int64_t seq, int64_t asked, const std::string& flag) {
  ValidationSamples v;
  v.windows = validation_loader(val, seq).windows();
  v.samples = std::min(asked, v.windows);
  if (v.samples < asked)
    v.note = fmt::format("the data holds {} window{} of {} tokens; {} {} asked for more", v.windows,
                         v.windows == 1 ? "" : "s", seq + 1, flag, asked);
  return v;
}

}  // namespace weft::data
