// Small stable hashes shared by specs and initialisation (not cryptographic).
#pragma once

#include <cstdint>
#include <string_view>

namespace weft {

// FNV-1a, 64-bit: stable across platforms and runs.
constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// splitmix64: a bijective mixer with full avalanche, for counter-based draws.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace weft
