// Shared by weft's flash attention kernels (attention_flash.cu: forward,
// attention_flash_backward.cu: backward): the PTX wrappers they are built
// from (cp.async, ldmatrix, mma.sync bf16, ex2.approx) and the tile loader.
//
// Tiles and resources (ptxas -v, nvcc 13.0; no kernel spills or uses a stack
// frame). Rows of a shared tile are D + 8 elements, so the 8 rows one
// ldmatrix reads fall in distinct 16-byte bank groups. Query and key blocks
// are 64 rows; smaller blocks waste less of the masked diagonal, larger ones
// reuse each shared tile over more rows.
//   forward   D 64: 27 KB shared, 156 / 153 registers (sm_80 / sm_90), 4 warps
//             D 128: 51 KB shared, 233 / 238 registers, 4 warps
//   backward  D 64: 73 KB shared, 128 / 128 registers (capped), 8 warps
//             D 128: 121 KB shared, 218 / 226 registers, 8 warps
// Registers, not shared memory, bound the forward: 3 blocks (12 warps) per SM
// at D 64 and 2 (8 warps) at D 128 on both chips; capping D 128 at 168
// registers for a third block spills 180 bytes. A warp holds 16 rows: O is
// 16 x D fp32 (D / 2 registers a thread), S 16 x 64 (32), Q fragments D / 4;
// FlashAttention-2's 32 rows per warp would halve the shared-memory reads per
// MMA but needs twice the accumulators. The backward runs one block per SM at
// D 128 (121 KB, 57 K registers) and two at D 64 (capped at 128 registers,
// which costs no spills); each warp keeps a 16 x D/2 slice of dK and of dV
// (D / 4 registers each).
// Taking blocks of the sequence (offsets, Tk, strides) cost the sm_90 forward
// at D 64 22 registers (131 before), still 3 blocks per SM; the rest moved by
// at most 4.
// Small kernels (delta, softmax rows, conversions, pointer arrays) use 10-40.
#pragma once

#include <cstdint>

#include "kernels/attention/attention_cuda.cuh"

namespace weft::kernels::attention_cuda::flash {

using gpu::dev;
using gpu::nv_bf16;

inline constexpr float kLog2e = 1.4426950408889634f;

// ------------------------------------------------------------- device primitives

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zeros when !valid (src unread).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most n of this thread's committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// and each lane receives (row lane/4, columns 2 (lane%4) + {0,1}) of each.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// The same with each 8x8 matrix transposed: a lane receives rows 2 (lane%4)
// + {0,1} of column lane/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// D += A B for a 16x16 bf16 A (row), 16x8 bf16 B (col), fp32 16x8 D. With
// g = lane / 4 and t = lane % 4: A registers hold (g, 2t..2t+1), (g+8, 2t..),
// (g, 2t+8..), (g+8, 2t+8..); B registers (k 2t..2t+1, n g), (k 2t+8.., n g);
// D holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16 in one register, the first in the low half (the lower
// column of a fragment pair).

// 2^x in one instruction (relative error ~2^-22); 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A tile of kRows rows x kD bf16 from global rows [row0, row0 + kRows) (row
// stride ld elements) into shared rows of kStride elements; rows at or past T
// are zero-filled.
template <int kRows, int kD, int kStride, int kThreads>
__device__ __forceinline__ void load_tile(nv_bf16* tile, const nv_bf16* base, int64_t ld,
                                          int64_t row0, int64_t T, int tid) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int chunk = tid + i * kThreads;
    const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * 8;
    const int64_t row = row0 + r;
    const bool valid = row < T;
    cp_async_16(smem_u32(tile + r * kStride + c), base + (valid ? row : 0) * ld + c, valid);
  }
}

}  // namespace weft::kernels::attention_cuda::flash
