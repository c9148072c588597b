#include "trainer/data/loader.h"

#include <fmt/format.h>

#include "core/error.h"

namespace weft::data {

Loader::Loader(const TokenSource& source, int64_t seq, uint64_t seed, Order order)
    : source_(source), seq_(seq), seed_(seed), order_(order) {
  if (seq < 1) throw InputError(fmt::format("sequence length {} must be positive", seq));
  if (source.size() < seq + 1)
    throw InputError(fmt::format(
        "sequence length {} needs at least {} tokens (seq + 1) but {} is shorter; use a "
        "shorter --seq or more data",
        seq, seq + 1, source.describe()));
  windows_ = (source.size() - 1) / seq;
}

int64_t Loader::window(int64_t global_index) const {
  WEFT_ASSERT(global_index >= 0);
  const int64_t e = global_index / windows_;
  const int64_t pos = global_index % windows_;
  if (order_ == Order::sequential) return pos;
  // A fresh, unrelated key per (seed, epoch).
  const Permutation perm(windows_, mix64(mix64(seed_) + static_cast<uint64_t>(e)));
  return perm.at(pos);
}

void Loader::sample(int64_t global_index, int32_t* inputs, int32_t* targets) const {
  const int64_t start = window(global_index) * seq_;
  source_.tokens_copy(start, seq_, inputs);
  source_.tokens_copy(start + 1, seq_, targets);
}

void Loader::batch(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const {
  for (int64_t b = 0; b < count; ++b) sample(first + b, inputs + b * seq_, targets + b * seq_);
}

Loader validation_loader(const TokenSource& val, int64_t seq) {
  return Loader(val, seq, kValidationSeed, Loader::Order::shuffled);
}

}  // namespace weft::data
