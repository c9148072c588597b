// adamw on CUDA: the update of every tensor of a step in one launch (one per
// kTensorsPerLaunch tensors), mixed precision: fp32 master weights and
// moments, fp32 or bf16 gradients (grad:bf16; widened as they are read), and
// the bf16 weights the model computes with.
//
// Each tensor is cut into chunks of kChunk elements and the chunks of all
// tensors are numbered in one sequence. A grid sized to fill the SMs walks
// that sequence (grid-stride); a block finds its chunk's tensor by binary
// search over the launch's table of tensors, which travels as the kernel's
// __grid_constant__ parameter (up to 32 KB since CUDA 12.1 on sm_70+), so
// there is no host-to-device copy and the launch can be captured in a graph.
// Every thread of a block searches the same chunk, so the table reads
// broadcast from the constant cache.
//
// The update fuses decay, both moments and the step on the fp32 master, in
// the CPU backend's (PyTorch's) order of operations, and writes the bf16
// param as the master's rounding to nearest even in the same pass, so no
// separate narrowing pass over the weights is needed. Each element's master,
// m and v are read and written once, its grad read once and its param
// written once (never read): 30 bytes an element (28 with bf16 gradients),
// the minimum. 16-byte
// accesses where a tensor's five pointers are aligned (the arena aligns to
// 64 bytes), element by element otherwise and for each tensor's tail. The
// per-step scalars are computed once in double, as the CPU backend and
// PyTorch compute them, then rounded to fp32.
#include <cmath>
#include <type_traits>

#include "kernels/adamw/adamw.h"
#include "kernels/adamw/adamw_check.h"
#include "kernels/cuda_common.cuh"

namespace weft::kernels {
namespace {

using gpu::Float8;
using gpu::kVec;
using gpu::nv_bf16;

// 4096 elements: two 16-byte steps of a 256-thread block, few enough that the
// last chunks of a step spread over many SMs.
constexpr int64_t kChunk = 4096;
constexpr int kThreads = 256;
// 480 tensors of 64 bytes, a 30 KB parameter: one launch for Llama-13B's 363
// tensors (9 a block), two for Llama-65B's 723.
constexpr int kTensorsPerLaunch = 480;

struct Scalars {
  float step_size, bias2_sqrt, beta2, one_minus_beta1, one_minus_beta2, eps, grad_scale,
      decay_factor;
};

// G: the gradients' device type, float or nv_bf16.
template <typename G>
struct TensorArg {
  nv_bf16* param;     // (n) written, never read
  float* master;      // (n)
  const G* grad;      // (n)
  float* m;           // (n)
  float* v;           // (n)
  int64_t n;
  int64_t first_chunk;  // chunks of the launch's earlier tensors
  int32_t decay;        // apply weight decay
  int32_t vec;          // all five pointers 16-byte aligned
};

template <typename G>
struct Batch {
  Scalars s;
  int32_t count = 0;
  int64_t chunks = 0;
  TensorArg<G> t[kTensorsPerLaunch];
};

// CUDA 12.1+ takes kernel parameters up to 32764 bytes on sm_70 and newer.
static_assert(sizeof(Batch<float>) <= 32764 && sizeof(Batch<nv_bf16>) <= 32764,
              "the tensor table must fit a kernel parameter");

__device__ __forceinline__ void adam_update(float& param, float grad, float& m, float& v,
                                            const Scalars& s, bool decay) {
  const float g = grad * s.grad_scale;
  if (decay) param *= s.decay_factor;
  // torch: m.lerp_(g, 1 - beta1); v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
  m = m + s.one_minus_beta1 * (g - m);
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  param -= s.step_size * (m / (sqrtf(v) / s.bias2_sqrt + s.eps));
}

template <typename G>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const __grid_constant__ Batch<G> b) {
  for (int64_t chunk = blockIdx.x; chunk < b.chunks; chunk += gridDim.x) {
    int lo = 0, hi = b.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (b.t[mid].first_chunk <= chunk)
        lo = mid;
      else
        hi = mid - 1;
    }
    const TensorArg<G>& t = b.t[lo];
    const bool decay = t.decay != 0;
    const int64_t begin = (chunk - t.first_chunk) * kChunk;
    const int64_t end = min(t.n, begin + kChunk);
    // Chunks start at multiples of kChunk, so aligned tensors stay aligned.
    const int64_t vec_end = t.vec ? begin + (end - begin) / kVec * kVec : begin;
    for (int64_t i = begin + int64_t(threadIdx.x) * kVec; i < vec_end; i += int64_t(kThreads) * kVec) {
      Float8 master = gpu::load8(t.master + i), m = gpu::load8(t.m + i), v = gpu::load8(t.v + i);
      const Float8 grad = gpu::load8(t.grad + i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) adam_update(master.v[j], grad.v[j], m.v[j], v.v[j], b.s, decay);
      gpu::store8(t.master + i, master);
      gpu::store8(t.param + i, master);  // rounds to nearest even
      gpu::store8(t.m + i, m);
      gpu::store8(t.v + i, v);
    }
    for (int64_t i = vec_end + threadIdx.x; i < end; i += kThreads) {
      float master = t.master[i], m = t.m[i], v = t.v[i];
      adam_update(master, gpu::to_float(t.grad[i]), m, v, b.s, decay);
      t.master[i] = master;
      t.param[i] = gpu::to_bf16(master);
      t.m[i] = m;
      t.v[i] = v;
    }
  }
}

// The shared rules (adamw_check.h); this backend adds no limits.
template <typename G>
Status check(const AdamwParams<bf16, G>& p) {
  return params_check(p);
}

template <typename G>
int64_t scratch(const AdamwParams<bf16, G>&) {
  return 0;
}

template <typename G>
void flush(Batch<G>& batch, cudaStream_t stream) {
  if (batch.count == 0) return;
  adamw_kernel<G><<<gpu::grid_blocks(batch.chunks * kThreads, kThreads), kThreads, 0, stream>>>(batch);
  WEFT_LAUNCH_CHECK(stream, "adamw_kernel");
  batch.count = 0;
  batch.chunks = 0;
}

template <typename G>
Status run(const AdamwParams<bf16, G>& p, Workspace, cudaStream_t stream) {
  const double t = static_cast<double>(p.step);
  const double bias1 = 1.0 - std::pow(p.beta1, t);
  const double bias2 = 1.0 - std::pow(p.beta2, t);
  using DeviceGrad = std::conditional_t<std::is_same_v<G, bf16>, nv_bf16, float>;
  Batch<DeviceGrad> batch;
  batch.s = Scalars{.step_size = float(p.lr / bias1),
                    .bias2_sqrt = float(std::sqrt(bias2)),
                    .beta2 = float(p.beta2),
                    .one_minus_beta1 = float(1.0 - p.beta1),
                    .one_minus_beta2 = float(1.0 - p.beta2),
                    .eps = float(p.eps),
                    .grad_scale = float(p.grad_scale),
                    .decay_factor = float(1.0 - p.lr * p.weight_decay)};
  for (const AdamwTensor<bf16, G>& tensor : p.tensors) {
    if (tensor.n == 0) continue;
    TensorArg<DeviceGrad>& a = batch.t[batch.count++];
    a = TensorArg<DeviceGrad>{.param = gpu::dev(tensor.param),
                              .master = tensor.master,
                              .grad = gpu::dev(tensor.grad),
                              .m = tensor.m,
                              .v = tensor.v,
                              .n = tensor.n,
                              .first_chunk = batch.chunks,
                              .decay = tensor.decay == WeightDecay::apply && p.weight_decay != 0,
                              .vec = gpu::aligned16(tensor.param) && gpu::aligned16(tensor.master) &&
                                     gpu::aligned16(tensor.grad) && gpu::aligned16(tensor.m) &&
                                     gpu::aligned16(tensor.v)};
    batch.chunks += (tensor.n + kChunk - 1) / kChunk;
    if (batch.count == kTensorsPerLaunch) flush(batch, stream);
  }
  flush(batch, stream);
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(AdamwParams)
WEFT_CUDA_INSTANTIATE_BF16_GRAD(AdamwParams)

}  // namespace weft::kernels
