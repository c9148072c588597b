// Elementwise math for the CPU kernels' fp32 loops, written so that GCC
// vectorizes the loops that call it. std::exp does not vectorize without
// -ffast-math, and the softmax, SwiGLU and cross-entropy passes call it once
// per element. Not part of the public API.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace weft::kernels::cpu {

// e^x in fp32 for x <= 88 (every caller passes x <= 0). x = n ln2 + r with
// |r| <= ln2 / 2, ln2 split in two so that n * hi is exact; e^r by its
// Taylor series to r^7, whose remainder is under 1e-8 relative, below fp32
// rounding; 2^n goes straight into the exponent bits.
// The rounding and the x < -87 test (where 2^n would leave the normal range
// and the result is 0) work on the bits: ordered float compares and
// float-to-int conversions may trap under the default -ftrapping-math,
// which keeps GCC from vectorizing the loop. NaN stays NaN.
inline float exp_fast(float x) {
  // Adding 1.5 * 2^23 rounds x log2(e) to an integer n, held in the low bits.
  const float shifted = x * 1.44269504f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const int32_t n_int = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(12582912.0f);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float e = 1.0f / 5040;
  e = e * r + 1.0f / 720;
  e = e * r + 1.0f / 120;
  e = e * r + 1.0f / 24;
  e = e * r + 1.0f / 6;
  e = e * r + 0.5f;
  e = e * r + 1.0f;
  e = e * r + 1.0f;
  const float y = e * std::bit_cast<float>((n_int + 127) << 23);
  // Negative floats order like their bits as int32, from -0 up to -inf.
  constexpr int32_t kMinus87 = std::bit_cast<int32_t>(-87.0f);
  constexpr int32_t kMinusInf = std::bit_cast<int32_t>(-std::numeric_limits<float>::infinity());
  const int32_t bits = std::bit_cast<int32_t>(x);
  const int32_t keep = int32_t((bits > kMinus87) & (bits <= kMinusInf)) - 1;  // 0 below -87
  return std::bit_cast<float>(std::bit_cast<int32_t>(y) & keep);
}

// e^x for x <= 0 in the accumulator type: exp_fast in fp32; std::exp in
// double, which serves the gradient checks, where only accuracy counts.
template <typename A>
A exp_nonpositive(A x) {
  if constexpr (std::is_same_v<A, float>)
    return exp_fast(x);
  else
    return std::exp(x);
}

// 1 / (1 + e^-g) from e = e^-|g| (in (0, 1], so nothing overflows):
// 1 / (1 + e) for g >= 0 and e / (1 + e) below, chosen by g's sign bit.
// Below g = -87 the result is 0 (std::exp's would be under 2e-38).
inline float sigmoid_fast(float g) {
  const uint32_t bits = std::bit_cast<uint32_t>(g);
  const float e = exp_fast(std::bit_cast<float>(bits | 0x80000000u));
  const float pos = 1.0f / (1.0f + e);
  const float neg = e * pos;
  const uint32_t negative = uint32_t(int32_t(bits) >> 31);  // all ones when the sign bit is set
  return std::bit_cast<float>((std::bit_cast<uint32_t>(neg) & negative) | (std::bit_cast<uint32_t>(pos) & ~negative));
}

template <typename A>
A sigmoid(A g) {
  if constexpr (std::is_same_v<A, float>)
    return sigmoid_fast(g);
  else
    return A(1) / (A(1) + std::exp(-g));
}

}  // namespace weft::kernels::cpu
