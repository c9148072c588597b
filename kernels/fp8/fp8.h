// fp8: the two 8-bit float formats of FP8 training (OCP FP8, as Hopper's
// tensor cores and PyTorch's float8_e4m3fn / float8_e5m2 define them) and
// the scaled quantisation weft's FP8 GEMMs use.
//
//   E4M3 (e4m3fn): 4 exponent bits (bias 7), 3 mantissa bits, no infinity;
//                  largest finite 448, smallest subnormal 2^-9. Forward
//                  operands: activations and weights.
//   E5M2:          5 exponent bits (bias 15), 2 mantissa bits, with infinity;
//                  largest finite 57344, smallest subnormal 2^-16. Gradients.
//
// fp8_encode is PyTorch's cast bit for bit: round to nearest even
// (subnormals included); NaN becomes the format's NaN with the input's sign;
// in E4M3, finite overflow and +-inf saturate to +-448 (it has no infinity);
// in E5M2, values that round past 57344 and +-inf become +-inf.
//
// Training never leans on the overflow rules: a tensor is multiplied by its
// scale and clamped to +-max before the cast (fp8_quantize), the saturating
// cast of cuBLASLt's and Transformer Engine's kernels, so an over-range value
// becomes +-max in both formats and is counted as an overflow. The GEMM then
// sees code * scale_inv, scale_inv = 1/scale in fp32 (cuBLASLt's A/B scale
// pointers), which fp8_qdq reproduces on the CPU.
//
// Scaling rules (fp8_scale): scale = max / amax (fp32), so the largest value
// maps to the format's largest finite; amax 0 (an all-zero tensor) gives
// scale 1; a non-finite amax keeps the previous scale (a NaN step is then
// caught by the loss, not by a scale of 0 or NaN that would zero every later
// step).
#pragma once

#include <cmath>
#include <cstdint>

namespace weft::kernels {

enum class Fp8Format { e4m3, e5m2 };
const char* to_string(Fp8Format f);

// One FP8 value's bits, the storage type of FP8 tensors on the GPU.
struct Fp8 {
  uint8_t bits = 0;
};

constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }
// The smallest positive (subnormal) value: 2^-9 and 2^-16.
constexpr float fp8_min_subnormal(Fp8Format f) {
  return f == Fp8Format::e4m3 ? 1.0f / 512.0f : 1.0f / 65536.0f;
}

uint8_t fp8_encode(float x, Fp8Format f);
float fp8_decode(uint8_t bits, Fp8Format f);

// Scale for a tensor whose largest magnitude is amax (rules above).
float fp8_scale(float amax, Fp8Format f, float previous = 1.0f);

// Largest |x| over n values; NaN if any value is NaN.
float fp8_amax(const float* x, int64_t n);

// Overflow and underflow counts of one quantisation: values whose scaled
// magnitude is past what rounds to the format's max (clamped to it), and
// nonzero values that became zero.
struct Fp8Health {
  int64_t overflow = 0;
  int64_t underflow = 0;
  Fp8Health& operator+=(const Fp8Health& o) {
    overflow += o.overflow;
    underflow += o.underflow;
    return *this;
  }
};

// The code of one value under a scale: encode(clamp(x * scale, -max, max)).
uint8_t fp8_quantize(float x, float scale, Fp8Format f);

// Quantise-dequantise (the CPU's emulated FP8): y[i] = decode(quantize(x[i]))
// * (1 / scale), the value an FP8 GEMM multiplies. y may alias x. Returns the
// health counts. Bit-identical for any thread count.
Fp8Health fp8_qdq(const float* x, float* y, int64_t n, float scale, Fp8Format f);

// Block scaling: the same quantise-dequantise of x (rows x cols, row-major)
// tile by tile, each tile of tile_rows x tile_cols (those at the right and
// bottom edges may be smaller) with its own current scale, fp8_scale(the
// tile's amax, f): a tile of zeros or with a non-finite value takes scale 1.
// 1 x 128 tiles scale each row's runs of 128 columns, 128 x 1 each column's
// runs of 128 rows, 128 x 128 square blocks (DeepSeek-V3's and Transformer
// Engine's block recipe). y may alias x. Bit-identical for any thread count.
Fp8Health fp8_qdq_tiles(const float* x, float* y, int64_t rows, int64_t cols, int64_t tile_rows,
                        int64_t tile_cols, Fp8Format f);

// Block scaling's 128 x 1 tiles when a tile's rows are not consecutive
// (an MoE expert's tokens, whose rows of one micro-batch arrive in several
// runs or on several ranks): row r of x (rows x cols, row-major) belongs to
// tile tile_of[r]. fp8_column_amax raises `table` (tiles x cols, one entry
// per tile and column) to the magnitude bits of x's values: a float's bits
// with the sign cleared, as int32, so that a NaN's lie above infinity's and
// tables of several ranks combine by an integer max. fp8_qdq_column_tiles
// then quantises-dequantises each value of x under its tile's column scale,
// fp8_scale(the entry as a float, or NaN past infinity's bits) into y (which
// may alias x). With tile_of[r] = r / 128, one table and x whole, the two
// give fp8_qdq_tiles(x, y, rows, cols, 128, 1, f) bit for bit.
void fp8_column_amax(const float* x, int64_t rows, int64_t cols, const int64_t* tile_of, int32_t* table);
Fp8Health fp8_qdq_column_tiles(const float* x, float* y, int64_t rows, int64_t cols, const int64_t* tile_of,
                               const int32_t* table, int64_t tiles, Fp8Format f);

// One tile's scale under that rule: rows [r0, r1) and columns [c0, c1) of x
// (row-major, `cols` wide), each value rounded to float first.
template <typename T>
float fp8_tile_scale(const T* x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1, Fp8Format f) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const float a = std::fabs(float(x[r * cols + c]));
      finite = finite && std::isfinite(a);
      amax = a > amax ? a : amax;
    }
  return fp8_scale(finite ? amax : NAN, f);
}

}  // namespace weft::kernels
