// The FP8 formats on the host (kernels/fp8/fp8.h): the reference the CUDA
// casts and the emulated-FP8 CPU trainer share.
#include "kernels/fp8/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

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

// What rounding a float onto a format's grid takes, so that
// quantise-dequantise never forms the code: decode(encode(s)) is s rounded
// to nearest even on the format's grid, which for normal values is the
// float with its mantissa cut to the format's bits, and below the smallest
// normal a multiple of the subnormal step.
struct Grid {
  uint32_t max;         // bits of the largest finite value (448 or 57344)
  uint32_t min_normal;  // bits of 2^(1 - bias)
  int shift;            // 23 - mantissa bits: the float mantissa bits dropped
  float sub_magic;      // 1.5 * 2^23 * the subnormal step: adding and taking it away rounds to that step
  uint32_t over_at;     // bits of overflow_at
};

Grid grid_of(Fp8Format f) {
  // E4M3: step 2^-9, magic 1.5 * 2^14; E5M2: step 2^-16, magic 1.5 * 2^7.
  const bool e4 = f == Fp8Format::e4m3;
  return {std::bit_cast<uint32_t>(fp8_max(f)), std::bit_cast<uint32_t>(e4 ? 0x1p-6f : 0x1p-14f), e4 ? 20 : 21,
          e4 ? 0x1.8p14f : 0x1.8p7f, std::bit_cast<uint32_t>(overflow_at(f))};
}

constexpr uint32_t kAbs = 0x7fffffffu, kInf = 0x7f800000u;

// decode(fp8_quantize) of s = v * scale, on the float's bits and without
// branches or float comparisons (so the loop below vectorises without
// relaxing IEEE semantics): clamp |s| to max (infinity clamps, NaN passes),
// round the mantissa nearest even (a carry moves into the exponent; at most
// max, which is on the grid) or, below the smallest normal, to the
// subnormal step (exact in float: the sum stays in the magic's binade), and
// put the sign back (-0 stays -0). tests/unit/kernels/test_fp8.cpp checks
// it against encode and decode; it was also checked over all 2^32 floats.
inline uint32_t round_to_grid(uint32_t s, const Grid& g) {
  const uint32_t mag = s & kAbs;
  const uint32_t clamp = 0u - uint32_t((mag > g.max) & (mag <= kInf));
  const uint32_t a = (g.max & clamp) | (mag & ~clamp);
  const uint32_t half = (1u << (g.shift - 1)) - 1 + ((a >> g.shift) & 1u);
  const uint32_t normal = (a + half) & ~((1u << g.shift) - 1);
  const float af = std::bit_cast<float>(a);
  const uint32_t subnormal = std::bit_cast<uint32_t>((af + g.sub_magic) - g.sub_magic);
  // Selected by masks, not ?:, which would let the compiler move the float
  // sum under a branch (an FP operation may trap, so it would not turn
  // the branch back into a select and the loop would not vectorise).
  const uint32_t use_normal = 0u - uint32_t(a >= g.min_normal), nan = 0u - uint32_t(a > kInf);
  const uint32_t r = (a & nan) | (((normal & use_normal) | (subnormal & ~use_normal)) & ~nan);
  return r | (s & ~kAbs);
}

// One value through the format under scale k (k_inv = 1 / k), counting its
// health: past overflow_at before the clamp, and nonzero values that became
// zero. Branchless over floats and 32-bit integers, so that the loops over
// it below vectorise.
inline float qdq_value(float v, float k, float k_inv, const Grid& g, int32_t& over, int32_t& under) {
  const uint32_t s = std::bit_cast<uint32_t>(v * k);
  over += int32_t(((s & kAbs) > g.over_at) & ((s & kAbs) <= kInf));
  const uint32_t r = round_to_grid(s, g);
  under += int32_t((r & kAbs) == 0) & int32_t((std::bit_cast<uint32_t>(v) & kAbs) != 0);
  return std::bit_cast<float>(r) * k_inv;
}

// n < 2^31 values (a chunk of fp8_qdq's range, or a row) under one scale,
// or each under its column's. y may alias x.
Fp8Health qdq_span(const float* x, float* y, int64_t n, float k, float k_inv, const Grid g) {
  int32_t over = 0, under = 0;
  for (int64_t i = 0; i < n; ++i) y[i] = qdq_value(x[i], k, k_inv, g, over, under);
  return {over, under};
}

Fp8Health qdq_span(const float* x, float* y, int64_t n, const float* k, const float* k_inv, const Grid g) {
  int32_t over = 0, under = 0;
  for (int64_t i = 0; i < n; ++i) y[i] = qdq_value(x[i], k[i], k_inv[i], g, over, under);
  return {over, under};
}

}  // namespace

Fp8Health fp8_qdq(const float* x, float* y, int64_t n, float scale, Fp8Format f) {
  const float scale_inv = 1.0f / scale;
  const Grid g = grid_of(f);
  constexpr int64_t kChunk = 1 << 14;
  int64_t over = 0, under = 0;
#pragma omp parallel for reduction(+ : over, under) schedule(static)
  for (int64_t at = 0; at < n; at += kChunk) {
    const Fp8Health h = qdq_span(x + at, y + at, std::min(kChunk, n - at), scale, scale_inv, g);
    over += h.overflow;
    under += h.underflow;
  }
  return {over, under};
}

Fp8Health fp8_qdq_tiles(const float* x, float* y, int64_t rows, int64_t cols, int64_t tile_rows,
                        int64_t tile_cols, Fp8Format f) {
  if (rows <= 0 || cols <= 0) return {};
  const int64_t bands = (rows + tile_rows - 1) / tile_rows, grid_cols = (cols + tile_cols - 1) / tile_cols;
  const Grid g = grid_of(f);
  // Narrow tiles (128 x 1: down the tokens) take each value's scale from
  // its column's; wide ones one scale per run of the row.
  const bool per_column = tile_cols < 16;
  int64_t over = 0, under = 0;
  // A band of tile_rows rows at a time, read along the rows, so that every
  // loop runs over contiguous values and vectorises, whatever the tile's
  // shape: the largest magnitude's bits per column over the band (for
  // floats of one sign their bits order as they do; a NaN's are above
  // infinity's, so a tile is finite when its largest is below infinity's),
  // each tile's scale from its columns', then every value under its scale.
#pragma omp parallel reduction(+ : over, under)
  {
    const auto n = static_cast<size_t>(cols);
    std::vector<uint32_t> top(n);
    const auto tiles = static_cast<size_t>(grid_cols);
    std::vector<float> k(tiles), k_inv(tiles), col_k, col_k_inv;
    if (per_column) {
      col_k.resize(n);
      col_k_inv.resize(n);
    }
#pragma omp for schedule(static)
    for (int64_t band = 0; band < bands; ++band) {
      const int64_t r0 = band * tile_rows, r1 = std::min(rows, r0 + tile_rows);
      std::fill(top.begin(), top.end(), 0u);
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = x + r * cols;
        for (size_t c = 0; c < n; ++c) {
          const uint32_t a = std::bit_cast<uint32_t>(row[c]) & kAbs;
          top[c] = a > top[c] ? a : top[c];
        }
      }
      for (int64_t t = 0; t < grid_cols; ++t) {
        const int64_t c0 = t * tile_cols, c1 = std::min(cols, c0 + tile_cols);
        uint32_t m = 0;
        for (int64_t c = c0; c < c1; ++c) m = top[size_t(c)] > m ? top[size_t(c)] : m;
        k[size_t(t)] = fp8_scale(m < kInf ? std::bit_cast<float>(m) : NAN, f);
        k_inv[size_t(t)] = 1.0f / k[size_t(t)];
        if (per_column) {
          std::fill(col_k.begin() + c0, col_k.begin() + c1, k[size_t(t)]);
          std::fill(col_k_inv.begin() + c0, col_k_inv.begin() + c1, k_inv[size_t(t)]);
        }
      }
      for (int64_t r = r0; r < r1; ++r) {
        const float* in = x + r * cols;
        float* out = y + r * cols;
        Fp8Health h;
        if (per_column) {
          h = qdq_span(in, out, cols, col_k.data(), col_k_inv.data(), g);
        } else {
          for (int64_t t = 0; t < grid_cols; ++t) {
            const int64_t c0 = t * tile_cols, c1 = std::min(cols, c0 + tile_cols);
            h += qdq_span(in + c0, out + c0, c1 - c0, k[size_t(t)], k_inv[size_t(t)], g);
          }
        }
        over += h.overflow;
        under += h.underflow;
      }
    }
  }
  return {over, under};
}

void fp8_column_amax(const float* x, int64_t rows, int64_t cols, const int64_t* tile_of, int32_t* table) {
  // Rows in order (two rows of one tile write the same entries); each row's
  // loop runs over contiguous values and vectorises.
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    int32_t* top = table + tile_of[r] * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const auto a = int32_t(std::bit_cast<uint32_t>(row[c]) & kAbs);
      top[c] = a > top[c] ? a : top[c];
    }
  }
}

Fp8Health fp8_qdq_column_tiles(const float* x, float* y, int64_t rows, int64_t cols, const int64_t* tile_of,
                               const int32_t* table, int64_t tiles, Fp8Format f) {
  if (rows <= 0 || cols <= 0) return {};
  const Grid g = grid_of(f);
  // Every entry's scale once, then each row under its tile's row of them.
  const auto n = static_cast<size_t>(tiles * cols);
  std::vector<float> k(n), k_inv(n);
  for (size_t i = 0; i < n; ++i) {
    const auto m = uint32_t(table[i]);
    k[i] = fp8_scale(m < kInf ? std::bit_cast<float>(m) : NAN, f);
    k_inv[i] = 1.0f / k[i];
  }
  int64_t over = 0, under = 0;
#pragma omp parallel for reduction(+ : over, under) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = tile_of[r] * cols;
    const Fp8Health h = qdq_span(x + r * cols, y + r * cols, cols, k.data() + at, k_inv.data() + at, g);
    over += h.overflow;
    under += h.underflow;
  }
  return {over, under};
}

}  // namespace weft::kernels
