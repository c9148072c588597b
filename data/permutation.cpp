#include "data/permutation.h"

#include <bit>

#include "core/error.h"

namespace weft::data {

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

Permutation::Permutation(int64_t n, uint64_t key) : n_(n) {
  WEFT_ASSERT(n >= 1);
  const int bits = std::bit_width(static_cast<uint64_t>(n - 1));  // bits to write n - 1
  half_bits_ = bits <= 2 ? 1 : (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < kRounds; ++r)
    round_keys_[r] = mix64(key + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(r + 1));
}

uint64_t Permutation::network(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (const uint64_t k : round_keys_) {
    const uint64_t next = left ^ (mix64(right ^ k) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t Permutation::at(int64_t i) const {
  WEFT_ASSERT(i >= 0 && i < n_);
  uint64_t x = static_cast<uint64_t>(i);
  do x = network(x);
  while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

}  // namespace weft::data
