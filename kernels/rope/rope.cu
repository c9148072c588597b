// rope on CUDA, in place on bf16 q and k with fp32 arithmetic.
//
// Two launches. The first fills the (T, D/2) cos and sin tables in the
// workspace; the second rotates, one block per token row (b, t) covering the
// q heads and then the k heads of that row, so one launch serves both tensors
// and each row's table entries are read from L1 by all its heads. A thread
// takes 8 consecutive pairs (16 bytes of the low half, 16 of the high half,
// 32 of each table) when D/2 is a multiple of 8 and q and k are aligned,
// one pair otherwise.
//
// The table follows the CPU backend's fp32 arithmetic (Hugging Face's):
// inv_freq = 1 / theta^(2i / D) and angle = position * inv_freq, each rounded
// to fp32; a scaled model's inv_freq is that value through
// rope_scaled_inv_freq in double (core/rope_scaling.h, the CPU's function),
// rounded once. pow, cos and sin are evaluated in double and rounded once, so the
// table is the correctly rounded fp32 value where the CPU's libm is within an
// ulp of it; the fast fp32 intrinsics would lose accuracy on the large angles
// of long positions. It costs T * D/2 entries once per launch. The backward
// uses the table with sin negated: exactly the transposed rotation.
#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/rope/rope.h"
#include "kernels/rope/rope_check.h"

namespace weft::kernels {
namespace {

using gpu::Float8;
using gpu::kVec;
using gpu::nv_bf16;

constexpr int kTableThreads = 256;
constexpr int kMaxRotateThreads = 256;

__global__ void __launch_bounds__(kTableThreads)
    rope_table_kernel(int64_t T, int64_t half, int64_t D, int64_t position_offset, float theta,
                      RopeScaling scaling, float sign,
                      float* cos_table,    // (T, D/2)
                      float* sin_table) {  // (T, D/2)
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < T * half; idx += stride) {
    const int64_t t = idx / half, i = idx % half;
    const float exponent = float(2 * i) / float(D);
    float inv_freq = 1.0f / float(pow(double(theta), double(exponent)));
    if (scaling.enabled()) inv_freq = float(rope_scaled_inv_freq(double(inv_freq), scaling));
    const float angle = float(position_offset + t) * inv_freq;
    cos_table[idx] = float(cos(double(angle)));
    sin_table[idx] = sign * float(sin(double(angle)));
  }
}

template <bool kVectorized>
__global__ void __launch_bounds__(kMaxRotateThreads)
    rope_rotate_kernel(int64_t T, int64_t H, int64_t H_kv, int64_t D,
                       nv_bf16* q,                // (B, T, H, D)
                       nv_bf16* k,                // (B, T, H_kv, D)
                       const float* cos_table,    // (T, D/2)
                       const float* sin_table) {  // (T, D/2)
  const int64_t row = blockIdx.x, t = row % T, half = D / 2;
  const int64_t per_head = kVectorized ? half / kVec : half;
  const float* cos_t = cos_table + t * half;
  const float* sin_t = sin_table + t * half;
  for (int64_t u = threadIdx.x; u < (H + H_kv) * per_head; u += blockDim.x) {
    const int64_t head = u / per_head, i = (u % per_head) * (kVectorized ? kVec : 1);
    nv_bf16* lo = head < H ? q + (row * H + head) * D : k + (row * H_kv + head - H) * D;
    nv_bf16* hi = lo + half;
    if constexpr (kVectorized) {
      Float8 a = gpu::load8(lo + i), b = gpu::load8(hi + i);
      const Float8 c = gpu::load8(cos_t + i), s = gpu::load8(sin_t + i);
      Float8 out_lo, out_hi;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        out_lo.v[j] = a.v[j] * c.v[j] - b.v[j] * s.v[j];
        out_hi.v[j] = b.v[j] * c.v[j] + a.v[j] * s.v[j];
      }
      gpu::store8(lo + i, out_lo);
      gpu::store8(hi + i, out_hi);
    } else {
      const float a = gpu::to_float(lo[i]), b = gpu::to_float(hi[i]);
      lo[i] = gpu::to_bf16(a * cos_t[i] - b * sin_t[i]);
      hi[i] = gpu::to_bf16(b * cos_t[i] + a * sin_t[i]);
    }
  }
}

// The grid limit, then the shared rules (rope_check.h).
Status check(const RopeParams<bf16>& p) {
  if (p.B * p.T > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

int64_t scratch(const RopeParams<bf16>& p) { return 2 * cpu::piece_bytes<float>(p.T * (p.D / 2)); }

Status run(const RopeParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  const int64_t half = p.D / 2, rows = p.B * p.T;
  if (rows == 0) return Status::ok;
  cpu::WorkspaceCarver carve(ws);
  float* cos_table = carve.take<float>(p.T * half);
  float* sin_table = carve.take<float>(p.T * half);
  const float sign = p.direction == RopeDirection::forward ? 1.0f : -1.0f;
  rope_table_kernel<<<gpu::grid_blocks(p.T * half, kTableThreads), kTableThreads, 0, stream>>>(
      p.T, half, p.D, p.position_offset, float(p.theta), p.scaling, sign, cos_table, sin_table);
  WEFT_LAUNCH_CHECK(stream, "rope_table_kernel");
  const bool vec = half % kVec == 0 && gpu::aligned16(p.q) && gpu::aligned16(p.k);
  const int64_t units = (p.H + p.H_kv) * (vec ? half / kVec : half);
  const int threads = gpu::row_threads(units, kMaxRotateThreads);
  if (vec)
    rope_rotate_kernel<true><<<rows, threads, 0, stream>>>(p.T, p.H, p.H_kv, p.D, gpu::dev(p.q),
                                                           gpu::dev(p.k), cos_table, sin_table);
  else
    rope_rotate_kernel<false><<<rows, threads, 0, stream>>>(p.T, p.H, p.H_kv, p.D, gpu::dev(p.q),
                                                            gpu::dev(p.k), cos_table, sin_table);
  WEFT_LAUNCH_CHECK(stream, "rope_rotate_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(RopeParams)

}  // namespace weft::kernels
