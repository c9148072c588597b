// The fp8 ops' params rules (Status::invalid_argument), defined once for both
// backends: fp8_ops_cpu.cpp, fp8.cu and fp8_gemm.cu apply them, then their
// own limits. Free of CUDA, so nvcc compiles it too.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/fp8/fp8_ops.h"

namespace weft::kernels::fp8_detail {

inline bool present(const void* p, int64_t count) { return count == 0 || p != nullptr; }

template <typename Elem>
Status params_check(const Fp8CastParams<Elem>& p) {
  if (p.rows < 0 || p.cols < 0) return Status::invalid_argument;
  const int64_t n = p.rows * p.cols;
  if (!present(p.x, n) || !present(p.out, n) || !present(p.scale, n)) return Status::invalid_argument;
  if (p.ld_t != 0 && (p.out_t == nullptr || p.ld_t < p.rows)) return Status::invalid_argument;
  // The amax is written even for an empty tensor (0), so it needs no scale.
  return Status::ok;
}

template <typename Elem>
Status params_check(const Fp8BlockCastParams<Elem>& p) {
  if (p.rows < 0 || p.cols < 0 || p.tiles == Fp8Tiles::tensor) return Status::invalid_argument;
  const int64_t n = p.rows * p.cols;
  if (!present(p.x, n) || !present(p.out, n) || !present(p.scale_inv, n)) return Status::invalid_argument;
  if (p.out_t && !present(p.scale_inv_t, n)) return Status::invalid_argument;
  return Status::ok;
}

template <typename Elem>
Status params_check(const Fp8AmaxParams<Elem>& p) {
  if (p.n < 0 || !present(p.x, p.n) || p.amax == nullptr) return Status::invalid_argument;
  return Status::ok;
}

template <typename Elem>
Status params_check(const Fp8ScaleUpdateParams<Elem>& p) {
  if (p.count < 0 || p.history_len < 1 || p.scale_inv_stride < 1) return Status::invalid_argument;
  for (const void* q : {static_cast<const void*>(p.amax), static_cast<const void*>(p.history),
                        static_cast<const void*>(p.scale), static_cast<const void*>(p.scale_inv)})
    if (!present(q, p.count)) return Status::invalid_argument;
  return Status::ok;
}

// Fp8GemmParams and Fp8GemmAccParams share every field but C's type.
template <typename P>
Status gemm_check(const P& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return Status::invalid_argument;
  if (p.lda < std::max<int64_t>(1, p.k) || p.ldb < std::max<int64_t>(1, p.k) ||
      p.ldc < std::max<int64_t>(1, p.n))
    return Status::invalid_argument;
  if (p.a_format == Fp8Format::e5m2 && p.b_format == Fp8Format::e5m2) return Status::invalid_argument;
  // Tiles on both operands or neither, at most one of them 128 x 128, and
  // split accumulation (Fp8Tiles: the pairs cuBLASLt's Hopper kernels take).
  const bool tiled_a = p.a_tiles != Fp8Tiles::tensor, tiled_b = p.b_tiles != Fp8Tiles::tensor;
  if (tiled_a != tiled_b) return Status::invalid_argument;
  if (tiled_a && (p.a_tiles == Fp8Tiles::block128) && (p.b_tiles == Fp8Tiles::block128))
    return Status::invalid_argument;
  if (tiled_a && p.accumulation != Fp8Accumulation::split) return Status::invalid_argument;
  const bool empty_c = p.m == 0 || p.n == 0;
  const bool empty_ab = empty_c || p.k == 0;
  if (!empty_c && p.c == nullptr) return Status::invalid_argument;
  if (!empty_ab && (p.a == nullptr || p.b == nullptr || p.a_scale_inv == nullptr || p.b_scale_inv == nullptr))
    return Status::invalid_argument;
  return Status::ok;
}

template <typename Elem>
Status params_check(const Fp8GemmParams<Elem>& p) {
  return gemm_check(p);
}
template <typename Elem>
Status params_check(const Fp8GemmAccParams<Elem>& p) {
  return gemm_check(p);
}

}  // namespace weft::kernels::fp8_detail
