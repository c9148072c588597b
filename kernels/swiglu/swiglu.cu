// swiglu on CUDA, bf16 storage with fp32 arithmetic: one grid-stride pass each
// way (for_each8 in kernels/cuda_common.cuh), 16-byte accesses when every
// pointer is aligned.
//
// The forward fuses silu and the product, so silu(gate) never reaches memory;
// the backward recomputes sigmoid(gate) rather than reading a saved one, the
// same trade as the CPU backend: 2 bytes less to keep per element for one
// exponential, which is free in a pass bound by memory. sigmoid uses the
// fast exponential (__expf, a few ulp in fp32, far under bf16's rounding);
// 1 / (1 + exp(-g)) saturates cleanly to 0 or 1 for large |g|.
//
// With a row scale (an MoE expert's rows, swiglu.h) a block takes a row:
// the forward scales it, the backward sums the row's dw (block_reduce, the
// same order on every run) and scales its gradients.
#include "kernels/cuda_common.cuh"
#include "kernels/swiglu/swiglu.h"
#include "kernels/swiglu/swiglu_check.h"

namespace weft::kernels {
namespace {

using gpu::Float8;
using gpu::kVec;
using gpu::nv_bf16;
using gpu::to_bf16;
using gpu::to_float;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

struct ForwardOp {
  const nv_bf16* gate;  // (rows, F)
  const nv_bf16* up;    // (rows, F)
  nv_bf16* act;         // (rows, F)
  __device__ void vec(int64_t i) const {
    Float8 g = gpu::load8(gate + i);
    const Float8 u = gpu::load8(up + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) g.v[j] = g.v[j] * sigmoid(g.v[j]) * u.v[j];
    gpu::store8(act + i, g);
  }
  __device__ void one(int64_t i) const {
    const float g = to_float(gate[i]);
    act[i] = to_bf16(g * sigmoid(g) * to_float(up[i]));
  }
};

// dgate and dup may alias gate and up: each thread reads an element's inputs
// before it writes that element's outputs.
struct BackwardOp {
  const nv_bf16* gate;  // (rows, F)
  const nv_bf16* up;    // (rows, F)
  const nv_bf16* dact;  // (rows, F)
  nv_bf16* dgate;       // (rows, F)
  nv_bf16* dup;         // (rows, F)
  __device__ static void grads(float g, float u, float da, float& dg, float& du) {
    const float s = sigmoid(g);
    du = da * g * s;
    dg = da * u * s * (1.0f + g * (1.0f - s));
  }
  __device__ void vec(int64_t i) const {
    const Float8 g = gpu::load8(gate + i), u = gpu::load8(up + i), da = gpu::load8(dact + i);
    Float8 dg, du;
#pragma unroll
    for (int j = 0; j < kVec; ++j) grads(g.v[j], u.v[j], da.v[j], dg.v[j], du.v[j]);
    gpu::store8(dup + i, du);
    gpu::store8(dgate + i, dg);
  }
  __device__ void one(int64_t i) const {
    float dg, du;
    grads(to_float(gate[i]), to_float(up[i]), to_float(dact[i]), dg, du);
    dup[i] = to_bf16(du);
    dgate[i] = to_bf16(dg);
  }
};

constexpr int kRowThreads = 256;

__global__ void __launch_bounds__(kRowThreads)
    scaled_forward_kernel(int64_t F, const nv_bf16* gate, const nv_bf16* up, const float* row_scale, nv_bf16* act) {
  const int64_t at = int64_t(blockIdx.x) * F;
  const float w = row_scale[blockIdx.x];
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
    const float g = to_float(gate[at + f]);
    act[at + f] = to_bf16(w * (g * sigmoid(g) * to_float(up[at + f])));
  }
}

// dgate and dup may alias gate and up: each thread reads its elements'
// inputs before it writes their outputs.
__global__ void __launch_bounds__(kRowThreads)
    scaled_backward_kernel(int64_t F, const nv_bf16* gate, const nv_bf16* up, const nv_bf16* dact,
                           const float* row_scale, nv_bf16* dgate, nv_bf16* dup, float* drow_scale) {
  const int64_t at = int64_t(blockIdx.x) * F;
  const float w = row_scale[blockIdx.x];
  float dw = 0.0f;
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
    const float g = to_float(gate[at + f]), u = to_float(up[at + f]), da = to_float(dact[at + f]);
    float dg, du;
    BackwardOp::grads(g, u, w * da, dg, du);
    dw += da * (g * sigmoid(g) * u);
    dup[at + f] = to_bf16(du);
    dgate[at + f] = to_bf16(dg);
  }
  dw = gpu::block_reduce(dw, gpu::SumOp{}, 0.0f);
  if (drow_scale && threadIdx.x == 0) drow_scale[blockIdx.x] = dw;
}

// The shared rules (swiglu_check.h); a scaled pass takes a block per row.
Status check(const SwigluForwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return !p.row_scale || p.rows <= gpu::kMaxGridX ? Status::ok : Status::unsupported;
}
Status check(const SwigluBackwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  return !p.row_scale || p.rows <= gpu::kMaxGridX ? Status::ok : Status::unsupported;
}

int64_t scratch(const SwigluForwardParams<bf16>&) { return 0; }
int64_t scratch(const SwigluBackwardParams<bf16>&) { return 0; }

Status run(const SwigluForwardParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.row_scale) {
    if (p.rows == 0) return Status::ok;
    scaled_forward_kernel<<<unsigned(p.rows), gpu::row_threads(p.F, kRowThreads), 0, stream>>>(
        p.F, gpu::dev(p.gate), gpu::dev(p.up), p.row_scale, gpu::dev(p.act));
    gpu::launch_check(stream, "swiglu_forward scaled", __FILE__, __LINE__);
    return Status::ok;
  }
  const bool vec = gpu::aligned16(p.gate) && gpu::aligned16(p.up) && gpu::aligned16(p.act);
  gpu::for_each8(p.rows * p.F, vec, ForwardOp{gpu::dev(p.gate), gpu::dev(p.up), gpu::dev(p.act)},
                 stream, "swiglu_forward");
  return Status::ok;
}

Status run(const SwigluBackwardParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.row_scale) {
    if (p.rows == 0) return Status::ok;
    scaled_backward_kernel<<<unsigned(p.rows), gpu::row_threads(p.F, kRowThreads), 0, stream>>>(
        p.F, gpu::dev(p.gate), gpu::dev(p.up), gpu::dev(p.dact), p.row_scale, gpu::dev(p.dgate), gpu::dev(p.dup),
        p.drow_scale);
    gpu::launch_check(stream, "swiglu_backward scaled", __FILE__, __LINE__);
    return Status::ok;
  }
  const bool vec = gpu::aligned16(p.gate) && gpu::aligned16(p.up) && gpu::aligned16(p.dact) &&
                   gpu::aligned16(p.dgate) && gpu::aligned16(p.dup);
  gpu::for_each8(p.rows * p.F, vec,
                 BackwardOp{gpu::dev(p.gate), gpu::dev(p.up), gpu::dev(p.dact), gpu::dev(p.dgate),
                            gpu::dev(p.dup)},
                 stream, "swiglu_backward");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(SwigluForwardParams)
WEFT_CUDA_INSTANTIATE(SwigluBackwardParams)

}  // namespace weft::kernels
