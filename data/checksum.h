// XXH64 (seed 0) of a byte stream, fed in pieces of any size. weft's token
// files store it for their payload: a standard, fast (several GB/s) hash that
// anyone can check without weft: `tail -c +65 train.tok | xxhsum -H1`.
// Written from the published algorithm description.
#pragma once

#include <cstdint>

namespace weft::data {

class Checksum64 {
 public:
  void update(const void* data, int64_t bytes);
  uint64_t digest() const;

 private:
  uint64_t lanes_[4] = {0, 0, 0, 0};
  uint8_t pending_[32] = {};  // bytes not yet forming a whole 32-byte stripe
  int64_t pending_bytes_ = 0;
  int64_t total_bytes_ = 0;
  bool started_ = false;
};

// One-shot convenience.
uint64_t checksum64(const void* data, int64_t bytes);

}  // namespace weft::data
