#include "data/checksum.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace weft::data {

namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t P2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t P3 = 0x165667B19E3779F9ull;
constexpr uint64_t P4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t P5 = 0x27D4EB2F165667C5ull;

static_assert(std::endian::native == std::endian::little,
              "weft reads little-endian files in place and needs a little-endian host");

uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * P2;
  return std::rotl(acc, 31) * P1;
}
uint64_t merge(uint64_t acc, uint64_t lane) {
  acc ^= round(0, lane);
  return acc * P1 + P4;
}
void stripe(uint64_t lanes[4], const uint8_t* p) {
  for (int i = 0; i < 4; ++i) lanes[i] = round(lanes[i], load64(p + 8 * i));
}

}  // namespace

void Checksum64::update(const void* data, int64_t bytes) {
  if (!started_) {
    lanes_[0] = P1 + P2;
    lanes_[1] = P2;
    lanes_[2] = 0;
    lanes_[3] = 0 - P1;
    started_ = true;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += bytes;
  if (pending_bytes_ > 0) {
    const int64_t take = std::min<int64_t>(32 - pending_bytes_, bytes);
    std::memcpy(pending_ + pending_bytes_, p, static_cast<size_t>(take));
    pending_bytes_ += take;
    p += take;
    bytes -= take;
    if (pending_bytes_ < 32) return;
    stripe(lanes_, pending_);
    pending_bytes_ = 0;
  }
  for (; bytes >= 32; p += 32, bytes -= 32) stripe(lanes_, p);
  std::memcpy(pending_, p, static_cast<size_t>(bytes));
  pending_bytes_ = bytes;
}

uint64_t Checksum64::digest() const {
  uint64_t h;
  if (total_bytes_ >= 32) {
    h = std::rotl(lanes_[0], 1) + std::rotl(lanes_[1], 7) + std::rotl(lanes_[2], 12) +
        std::rotl(lanes_[3], 18);
    for (uint64_t lane : lanes_) h = merge(h, lane);
  } else {
    h = P5;
  }
  h += static_cast<uint64_t>(total_bytes_);
  const uint8_t* p = pending_;
  int64_t n = pending_bytes_;
  for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round(0, load64(p)), 27) * P1 + P4;
  if (n >= 4) {
    h = std::rotl(h ^ (uint64_t{load32(p)} * P1), 23) * P2 + P3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = std::rotl(h ^ (uint64_t{*p} * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t checksum64(const void* data, int64_t bytes) {
  Checksum64 c;
  c.update(data, bytes);
  return c.digest();
}

}  // namespace weft::data
