// References for the FP8 GEMM tests, CPU (test_fp8_ops) and CUDA
// (test_gpu_fp8): operands cast to codes through the host rules of fp8.h,
// the fp64 product of the decoded values, and the elementwise error bound of
// an FP8 GEMM against the product of the unquantised values.
//
// The bound. An operand value a is stored as a^ = decode(code) / scale with
//   |a^ - a| <= u |a| + h,   u = 2^-(mantissa + 1) (the unit roundoff:
//   2^-4 in E4M3, 2^-3 in E5M2), h = (smallest subnormal / 2) / scale
// (values below the smallest normal round to a multiple of the subnormal
// step, an absolute error), and a value past the format's range would be
// clamped, which scale = max / amax rules out. The fp32 roundings of
// x * scale and of code * scale_inv add a few 2^-24 to u; 2^-22 covers them.
// So for C = A B^T
//   |C^ - C|_ij <= sum_l (e(a_il) |b^_jl| + |a_il| e(b_jl)) + acc_ij,
// with e(v) = u |v| + h the operand's bound, and acc_ij the accumulation's
// own error, at most gamma_k sum_l |a^_il b^_jl| for fp32 sums of k terms
// (gamma_k = k 2^-24 / (1 - k 2^-24)). This holds element by element for
// any inputs, with no statistical assumption, so a test can demand it of
// every element.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/fp8/fp8.h"

namespace weft::kernels::test {

inline double fp8_unit_roundoff(Fp8Format f) { return f == Fp8Format::e4m3 ? 1.0 / 16 : 1.0 / 8; }

// The codes of a (rows, cols) row-major tensor under scale, and their decoded
// values code * (1 / scale) (fp8_qdq's), in double.
struct Fp8Operand {
  std::vector<Fp8> codes;
  std::vector<double> decoded;
  float scale = 1, scale_inv = 1;
  Fp8Format format = Fp8Format::e4m3;
};

inline Fp8Operand fp8_operand(const std::vector<float>& x, Fp8Format f) {
  Fp8Operand op;
  op.format = f;
  op.scale = fp8_scale(fp8_amax(x.data(), int64_t(x.size())), f);
  op.scale_inv = 1.0f / op.scale;
  op.codes.resize(x.size());
  op.decoded.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    op.codes[i].bits = fp8_quantize(x[i], op.scale, f);
    op.decoded[i] = double(fp8_decode(op.codes[i].bits, f) * op.scale_inv);
  }
  return op;
}

// C (m, n) = A (m, k) B (n, k)^T in fp64, all row-major and contiguous.
inline std::vector<double> gemm_nt_f64(const std::vector<double>& a, const std::vector<double>& b, int64_t m,
                                       int64_t n, int64_t k) {
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += a[i * k + l] * b[j * k + l];
      c[i * n + j] = s;
    }
  return c;
}

// The bound above for each element of C, given the unquantised operands
// (as doubles) and their FP8 forms.
inline std::vector<double> fp8_gemm_bound(const std::vector<double>& a, const Fp8Operand& qa,
                                          const std::vector<double>& b, const Fp8Operand& qb, int64_t m,
                                          int64_t n, int64_t k) {
  const double fp32_steps = std::ldexp(1.0, -22);
  const double ua = fp8_unit_roundoff(qa.format) + fp32_steps;
  const double ub = fp8_unit_roundoff(qb.format) + fp32_steps;
  const double ha = fp8_min_subnormal(qa.format) / 2 / qa.scale * (1 + fp32_steps);
  const double hb = fp8_min_subnormal(qb.format) / 2 / qb.scale * (1 + fp32_steps);
  const double u32 = std::ldexp(1.0, -24), gamma = double(k) * u32 / (1 - double(k) * u32);
  std::vector<double> bound(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t l = 0; l < k; ++l) {
        const double av = a[i * k + l], bv = b[j * k + l];
        const double aq = qa.decoded[i * k + l], bq = qb.decoded[j * k + l];
        s += (ua * std::fabs(av) + ha) * std::fabs(bq) + std::fabs(av) * (ub * std::fabs(bv) + hb);
        mag += std::fabs(aq * bq);
      }
      bound[i * n + j] = s + gamma * mag;
    }
  return bound;
}

}  // namespace weft::kernels::test
