// Block scaling's cast on CUDA (Fp8BlockCastParams, kernels/fp8/fp8_ops.h):
// bf16 x to FP8 codes with a scale per tile, in both layouts, from one read
// of x.
//
// One thread block per 128 x 128 tile of x, which it stages in shared memory
// as bf16 (rows padded by two elements, so that reading a column touches
// every bank once). From the staged tile it takes each row's amax over its
// 128 columns (a warp per row: the 1 x 128 tiles of out), each column's
// over its 128 rows (a thread per column: out_t's tiles under row128) or the
// whole tile's (block128), turns each into a scale with fp8_scale's rule
// (amax 0, a non-finite value in the tile, or a scale that overflows:
// scale 1), and writes the codes of both layouts eight at a time (8-byte
// stores) and each tile's 1 / scale where fp8_tile_scale_at puts it. The
// codes are fp8_device::quantize's, the CPU's bit for bit; the divisions
// are IEEE round-to-nearest (__fdiv_rn), as the CPU's are, so the scales
// are too. Each tile is a block's alone, so nothing here depends on the
// order blocks run in; the health counts are exact integer atomics.
//
// What this backend supports: rows and cols multiples of 128 (whole tiles:
// fp8:blockwise keeps every other GEMM in bf16, memory::fp8_block_dims), x
// 16-byte and the codes 8-byte aligned, the scale arrays 4-byte aligned.
#include <cuda_bf16.h>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8/fp8_check.h"
#include "kernels/fp8/fp8_device.cuh"
#include "kernels/fp8/fp8_ops.h"

namespace weft::kernels {
namespace {

using gpu::nv_bf16;
using namespace fp8_device;

constexpr int kTile = 128, kPitch = kTile + 2, kThreads = 256, kWarps = kThreads / 32;

// fp8_scale(amax) from the amax's bits (NaN's above infinity's, as the
// cast's statistics order them): 1 for 0 or a non-finite amax, and where
// max / amax overflows.
template <Fp8Format F>
__device__ __forceinline__ float tile_scale(uint32_t amax_bits) {
  if (amax_bits == 0 || amax_bits >= 0x7f800000u) return 1.0f;
  const float s = __fdiv_rn(Format<F>::kMax, __uint_as_float(amax_bits));
  return isfinite(s) ? s : 1.0f;
}

__device__ __forceinline__ int64_t pad4(int64_t n) { return (n + 3) / 4 * 4; }

template <Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    block_cast_kernel(int64_t rows, int64_t cols, bool square, const nv_bf16* __restrict__ x,  // (rows, cols)
                      uint8_t* __restrict__ out, float* __restrict__ scale_inv,                 // (rows, cols)
                      uint8_t* __restrict__ out_t, float* __restrict__ scale_inv_t,             // (cols, rows)
                      Fp8Health* health) {
  __shared__ nv_bf16 tile[kTile * kPitch];
  __shared__ float row_scale[kTile], col_scale[kTile];
  __shared__ uint32_t row_amax[kTile];
  const int64_t tr = blockIdx.y, tc = blockIdx.x, r0 = tr * kTile, c0 = tc * kTile;

  // Stage the tile: 16-byte loads of 8 bf16, 2048 of them.
  for (int i = threadIdx.x; i < kTile * kTile / gpu::kVec; i += kThreads) {
    const int r = i / (kTile / gpu::kVec), c = (i % (kTile / gpu::kVec)) * gpu::kVec;
    const uint4 v = *reinterpret_cast<const uint4*>(x + (r0 + r) * cols + c0 + c);
    const nv_bf16* e = reinterpret_cast<const nv_bf16*>(&v);
#pragma unroll
    for (int j = 0; j < gpu::kVec; ++j) tile[r * kPitch + c + j] = e[j];
  }
  __syncthreads();

  // Each row's amax over the tile's 128 columns, a warp per row.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int r = warp; r < kTile; r += kWarps) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kTile / 32; ++j)
      m = max(m, __float_as_uint(gpu::to_float(tile[r * kPitch + lane + 32 * j])) & 0x7fffffffu);
    for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) row_amax[r] = m;
  }
  __syncthreads();
  if (square) {
    // The whole tile's amax, for both layouts.
    uint32_t m = threadIdx.x < kTile ? row_amax[threadIdx.x] : 0u;
    m = gpu::block_reduce(m, UMaxOp{}, 0u);
    const float s = tile_scale<F>(m);
    if (threadIdx.x < kTile) row_scale[threadIdx.x] = col_scale[threadIdx.x] = s;
    if (threadIdx.x == 0) {
      const float inv = __fdiv_rn(1.0f, s);
      scale_inv[tr * pad4(cols / kTile) + tc] = inv;
      if (out_t) scale_inv_t[tc * pad4(rows / kTile) + tr] = inv;
    }
  } else if (threadIdx.x < kTile) {
    const int i = threadIdx.x;
    const float s = tile_scale<F>(row_amax[i]);
    row_scale[i] = s;
    scale_inv[tc * rows + r0 + i] = __fdiv_rn(1.0f, s);
    if (out_t) {
      // Column i's amax down the tile's 128 rows.
      uint32_t m = 0;
      for (int r = 0; r < kTile; ++r) m = max(m, __float_as_uint(gpu::to_float(tile[r * kPitch + i])) & 0x7fffffffu);
      const float st = tile_scale<F>(m);
      col_scale[i] = st;
      scale_inv_t[tr * cols + c0 + i] = __fdiv_rn(1.0f, st);
    }
  }
  __syncthreads();

  // The codes, 8 to a store: out's rows, then out_t's (x's columns).
  Stats st, st_t;
  for (int i = threadIdx.x; i < kTile * kTile / 8; i += kThreads) {
    const int r = i / (kTile / 8), c = (i % (kTile / 8)) * 8;
    const float s = row_scale[r];
    uint64_t codes = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      codes |= uint64_t(quantize<F>(gpu::to_float(tile[r * kPitch + c + j]), s, st)) << (8 * j);
    *reinterpret_cast<uint64_t*>(out + (r0 + r) * cols + c0 + c) = codes;
  }
  if (out_t) {
    for (int i = threadIdx.x; i < kTile * kTile / 8; i += kThreads) {
      const int c = i / (kTile / 8), r = (i % (kTile / 8)) * 8;
      const float s = col_scale[c];
      uint64_t codes = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        codes |= uint64_t(quantize<F>(gpu::to_float(tile[(r + j) * kPitch + c]), s, st_t)) << (8 * j);
      *reinterpret_cast<uint64_t*>(out_t + (c0 + c) * rows + r0 + r) = codes;
    }
  }
  // Under block128 the transposed codes are out's again: counted once.
  if (!square) {
    st.over += st_t.over;
    st.under += st_t.under;
  }
  stats_flush(st, nullptr, health);
}

Status check(const Fp8BlockCastParams<bf16>& p) {
  if (Status s = fp8_detail::params_check(p); s != Status::ok) return s;
  if (p.rows % kTile || p.cols % kTile) return Status::unsupported;
  const auto aligned = [](const void* q, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(q) % bytes == 0; };
  if (!aligned(p.x, 16) || !aligned(p.out, 8) || !aligned(p.scale_inv, 4)) return Status::unsupported;
  if (p.out_t && (!aligned(p.out_t, 8) || !aligned(p.scale_inv_t, 4))) return Status::unsupported;
  return Status::ok;
}
int64_t scratch(const Fp8BlockCastParams<bf16>&) { return 0; }
Status run(const Fp8BlockCastParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return Status::ok;
  const dim3 grid(unsigned(p.cols / kTile), unsigned(p.rows / kTile));
  const bool square = p.tiles == Fp8Tiles::block128;
  const auto* x = reinterpret_cast<const nv_bf16*>(p.x);
  auto* out = reinterpret_cast<uint8_t*>(p.out);
  auto* out_t = reinterpret_cast<uint8_t*>(p.out_t);
  if (p.format == Fp8Format::e4m3)
    block_cast_kernel<Fp8Format::e4m3><<<grid, kThreads, 0, stream>>>(p.rows, p.cols, square, x, out, p.scale_inv,
                                                                      out_t, p.scale_inv_t, p.health);
  else
    block_cast_kernel<Fp8Format::e5m2><<<grid, kThreads, 0, stream>>>(p.rows, p.cols, square, x, out, p.scale_inv,
                                                                      out_t, p.scale_inv_t, p.health);
  WEFT_LAUNCH_CHECK(stream, "fp8 block_cast_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(Fp8BlockCastParams)

}  // namespace weft::kernels
