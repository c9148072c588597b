// The FP8 formats on the host (kernels/fp8/fp8.h): the reference the CUDA
// casts and the emulated-FP8 CPU trainer share.
#include "kernels/fp8/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace weft::kernels {
namespace {

struct FormatBits {
  int mantissa;   // mantissa bits
  int bias;       // exponent bias
  uint8_t max;    // code of the largest finite
  bool has_inf;   // E5M2: exponent all ones, mantissa 0
};

constexpr FormatBits bits_of(Fp8Format f) {
  return f == Fp8Format::e4m3 ? FormatBits{3, 7, 0x7e, false} : FormatBits{2, 15, 0x7b, true};
}

}  // namespace

const char* to_string(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

uint8_t fp8_encode(float x, Fp8Format f) {
  const FormatBits b = bits_of(f);
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint8_t sign = uint8_t((u >> 31) << 7);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7f;  // NaN (both formats' NaN is S.1111111)
  const uint8_t overflow = b.has_inf ? uint8_t(0x7c) : b.max;
  if (mag == 0x7f800000u) return sign | overflow;
  // Normal fp8 values have a float exponent of at least 1 - bias.
  const uint32_t min_normal_exp = uint32_t(127 + 1 - b.bias);
  uint32_t code;
  if ((mag >> 23) >= min_normal_exp) {
    // Round the float's mantissa to b.mantissa bits, nearest even; a carry
    // out of the mantissa moves into the exponent, as it should.
    const int shift = 23 - b.mantissa;
    const uint32_t rounded = (mag + ((1u << (shift - 1)) - 1) + ((mag >> shift) & 1u)) >> shift;
    code = rounded - ((min_normal_exp - 1) << b.mantissa);
  } else {
    // Subnormal (or zero): a multiple of 2^(1 - bias - mantissa), rounded to
    // nearest even; the scaling by a power of two is exact in double, and a
    // result of 2^mantissa is the smallest normal's code, as it should be.
    const double units = std::ldexp(double(std::fabs(x)), b.bias - 1 + b.mantissa);
    code = uint32_t(std::nearbyint(units));
  }
  if (code > b.max) code = overflow;
  return sign | uint8_t(code);
}

namespace {

float decode_bits(uint8_t bits, Fp8Format f) {
  const FormatBits b = bits_of(f);
  const bool negative = bits & 0x80;
  const int exp = (bits & 0x7f) >> b.mantissa;
  const int mant = bits & ((1 << b.mantissa) - 1);
  const int exp_all_ones = (1 << (7 - b.mantissa)) - 1;
  float v;
  if (b.has_inf && exp == exp_all_ones)
    v = mant == 0 ? INFINITY : NAN;
  else if (!b.has_inf && (bits & 0x7f) == 0x7f)
    v = NAN;
  else if (exp == 0)
    v = std::ldexp(float(mant), 1 - b.bias - b.mantissa);
  else
    v = std::ldexp(float((1 << b.mantissa) + mant), exp - b.bias - b.mantissa);
  return negative ? -v : v;
}

struct DecodeTable {
  float v[2][256];
  DecodeTable() {
    for (int c = 0; c < 256; ++c) {
      v[0][c] = decode_bits(uint8_t(c), Fp8Format::e4m3);
      v[1][c] = decode_bits(uint8_t(c), Fp8Format::e5m2);
    }
  }
};
const DecodeTable kDecode;

}  // namespace

float fp8_decode(uint8_t bits, Fp8Format f) { return kDecode.v[f == Fp8Format::e5m2][bits]; }

float fp8_scale(float amax, Fp8Format f, float previous) {
  if (!std::isfinite(amax)) return previous;
  if (amax == 0.0f) return 1.0f;
  const float s = fp8_max(f) / amax;
  // An amax below max / FLT_MAX would overflow the scale; keep it finite.
  return std::isfinite(s) ? s : previous;
}

float fp8_amax(const float* x, int64_t n) {
  float m = 0.0f;
  bool nan = false;
#pragma omp parallel for reduction(max : m) reduction(|| : nan) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) nan = true;
    m = a > m ? a : m;
  }
  return nan ? NAN : m;
}

uint8_t fp8_quantize(float x, float scale, Fp8Format f) {
  const float mx = fp8_max(f);
  float s = x * scale;
  if (s > mx) s = mx;
  if (s < -mx) s = -mx;
  return fp8_encode(s, f);  // NaN passes the clamps and stays NaN
}

namespace {

// Past max plus half a step, a value no longer rounds to max: 464 in E4M3,
// 61440 in E5M2. amax * (max / amax) may land an ulp above max; that is no
// overflow.
float overflow_at(Fp8Format f) { return f == Fp8Format::e4m3 ? 464.0f : 61440.0f; }

// One value through the format under scale, counting its health.
inline float qdq_one(float v, float scale, float scale_inv, float over_at, Fp8Format f, int64_t& over,
                     int64_t& under) {
  if (std::fabs(v * scale) > over_at) ++over;
  const uint8_t code = fp8_quantize(v, scale, f);
  if ((code & 0x7f) == 0 && v != 0.0f) ++under;
  return fp8_decode(code, f) * scale_inv;
}

}  // namespace

Fp8Health fp8_qdq(const float* x, float* y, int64_t n, float scale, Fp8Format f) {
  const float scale_inv = 1.0f / scale, over_at = overflow_at(f);
  int64_t over = 0, under = 0;
#pragma omp parallel for reduction(+ : over, under) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = qdq_one(x[i], scale, scale_inv, over_at, f, over, under);
  return {over, under};
}

Fp8Health fp8_qdq_tiles(const float* x, float* y, int64_t rows, int64_t cols, int64_t tile_rows,
                        int64_t tile_cols, Fp8Format f) {
  if (rows <= 0 || cols <= 0) return {};
  const int64_t grid_rows = (rows + tile_rows - 1) / tile_rows, grid_cols = (cols + tile_cols - 1) / tile_cols;
  const float over_at = overflow_at(f);
  int64_t over = 0, under = 0;
#pragma omp parallel for reduction(+ : over, under) schedule(static)
  for (int64_t t = 0; t < grid_rows * grid_cols; ++t) {
    const int64_t r0 = (t / grid_cols) * tile_rows, c0 = (t % grid_cols) * tile_cols;
    const int64_t r1 = std::min(rows, r0 + tile_rows), c1 = std::min(cols, c0 + tile_cols);
    const float scale = fp8_tile_scale(x, cols, r0, r1, c0, c1, f), scale_inv = 1.0f / scale;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        y[r * cols + c] = qdq_one(x[r * cols + c], scale, scale_inv, over_at, f, over, under);
  }
  return {over, under};
}

}  // namespace weft::kernels
