// The gemm params' rules (Status::invalid_argument), defined once for both
// backends: gemm_cpu.cpp and gemm.cu apply them, then their own size limits
// (BLAS's 32-bit sizes, cuBLASLt's 32-bit batch). Free of CUDA and fmt, so
// nvcc compiles it too.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/gemm/gemm.h"

namespace weft::kernels {
namespace gemm_detail {

// GemmParams and GemmAccParams share every field but C's type.
template <typename P>
Status fields_check(const P& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 1) return Status::invalid_argument;
  if (p.stride_a < 0 || p.stride_b < 0 || p.stride_c < 0) return Status::invalid_argument;
  const int64_t a_cols = p.trans_a == Trans::no ? p.k : p.m;
  const int64_t b_cols = p.trans_b == Trans::no ? p.n : p.k;
  if (p.lda < std::max<int64_t>(1, a_cols) || p.ldb < std::max<int64_t>(1, b_cols) ||
      p.ldc < std::max<int64_t>(1, p.n))
    return Status::invalid_argument;
  const bool empty_c = p.m == 0 || p.n == 0;
  const bool empty_ab = empty_c || p.k == 0;
  if (!empty_c && p.c == nullptr) return Status::invalid_argument;
  if (!empty_ab && (p.a == nullptr || p.b == nullptr)) return Status::invalid_argument;
  if (p.batch > 1 && !empty_c && p.stride_c < (p.m - 1) * p.ldc + p.n) return Status::invalid_argument;
  return Status::ok;
}

}  // namespace gemm_detail

template <typename Elem>
Status params_check(const GemmParams<Elem>& p) {
  return gemm_detail::fields_check(p);
}

template <typename Elem>
Status params_check(const GemmAccParams<Elem>& p) {
  return gemm_detail::fields_check(p);
}

// A grouped GEMM: a list in host memory (none when count is 0) of entries
// that each pass the GEMM's rules with batch 1.
template <typename P>
Status grouped_check(const P& p) {
  if (p.count < 0 || (p.count > 0 && p.gemms == nullptr)) return Status::invalid_argument;
  for (int64_t i = 0; i < p.count; ++i) {
    if (p.gemms[i].batch != 1) return Status::invalid_argument;
    if (Status s = params_check(p.gemms[i]); s != Status::ok) return s;
  }
  return Status::ok;
}

}  // namespace weft::kernels
