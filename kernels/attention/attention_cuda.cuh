// What the two CUDA attention files share: attention.cu (the routing and the
// materialized variant) and attention_flash.cu (weft's own flash kernels).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/attention/attention.h"
#include "kernels/cpu_common.h"
#include "kernels/cuda_common.cuh"

namespace weft::kernels::attention_cuda {

// Workspace pieces are 64-byte aligned.
inline int64_t piece(int64_t bytes) { return cpu::align_up(bytes); }

// Blocks for a grid-stride kernel over `threads` threads' work.
inline unsigned blocks(int64_t threads, int block) { return unsigned(gpu::grid_blocks(threads, block)); }

// Two floats as a bf16 pair (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

// out (n) = bf16(scale * in), on the stream.
void scale_to_bf16(const float* in, gpu::nv_bf16* out, int64_t n, float scale, cudaStream_t stream);

// Flash attention for D of 64 or 128 (attention.cu checks what it handles).
void flash_forward(const AttentionForwardParams<bf16>& p, cudaStream_t stream);
// Workspace of the backward: delta (B, H, T) fp32, then the dQ sums
// (B, T, H, D) fp32, each a piece.
int64_t flash_backward_workspace(const AttentionBackwardParams<bf16>& p);
void flash_backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream);

}  // namespace weft::kernels::attention_cuda
