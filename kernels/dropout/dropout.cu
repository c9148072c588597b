// dropout on CUDA, bf16 storage with fp32 arithmetic (the scale 1 / (1 - p)
// rounded as the CPU's fp32 kernel rounds it): a grid-stride pass,
// one element per thread step; the mask is the CPU's (dropout.h), drawn in
// 64-bit integer arithmetic on the device.
#include "kernels/cuda_common.cuh"
#include "kernels/dropout/dropout.h"
#include "kernels/dropout/dropout_check.h"

namespace weft::kernels {
namespace {

using gpu::nv_bf16;

__global__ void dropout_kernel(DropoutParams<bf16> p, const nv_bf16* x, nv_bf16* y, float scale, bool add) {
  const int64_t n = p.rows * p.cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.cols, c = i % p.cols;
    const float v = dropout_keep(p.key, dropout_index(p, r, c), p.p) ? gpu::to_float(x[i]) * scale : 0.0f;
    y[i] = gpu::to_bf16(add ? gpu::to_float(y[i]) + v : v);
  }
}

template <typename P>
Status check(const P& p) {
  return params_check(p);
}

int64_t scratch(const DropoutParams<bf16>&) { return 0; }

Status run(const DropoutParams<bf16>& p, Workspace, cudaStream_t stream) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return Status::ok;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  dropout_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(p, gpu::dev(p.x), gpu::dev(p.y),
                                                            1.0f / (1.0f - float(p.p)), p.write == Write::accumulate);
  WEFT_LAUNCH_CHECK(stream, "dropout_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(DropoutParams)

}  // namespace weft::kernels
