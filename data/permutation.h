// A seeded pseudo-random permutation of [0, n), evaluated one point at a time.
//
// A balanced Feistel network over the smallest even number of bits that
// covers n, with cycle walking: a value that lands outside [0, n) is pushed
// through the network again until it lands inside. Because the network is a
// bijection of the larger domain, walking from a point of [0, n) always comes
// back into [0, n), and the result is a bijection of [0, n). Each evaluation
// costs a few dozen multiplies (at most 4x domain overshoot, so ~4 passes in
// the worst case on average) and no memory, so the loader can shuffle
// billions of windows without an index array and any rank can ask for any
// position without the others.
#pragma once

#include <cstdint>

namespace weft::data {

// splitmix64's finalizer: a bijective 64-bit mixer with full avalanche.
uint64_t mix64(uint64_t x);

class Permutation {
 public:
  Permutation(int64_t n, uint64_t key);
  int64_t size() const { return n_; }
  // The image of i in [0, n).
  int64_t at(int64_t i) const;

 private:
  static constexpr int kRounds = 6;
  uint64_t network(uint64_t x) const;
  int64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round_keys_[kRounds];
};

}  // namespace weft::data
