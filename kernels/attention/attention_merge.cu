// attention_merge on CUDA, bf16 outputs and fp32 lse: one thread per
// (sequence, head, query) row, the weights in fp32, the row's D values read,
// blended and rounded once.
#include <cmath>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_check.h"
#include "kernels/cuda_common.cuh"

namespace weft::kernels {
namespace {

using gpu::nv_bf16;
using gpu::to_bf16;
using gpu::to_float;

__global__ void merge_kernel(int64_t B, int64_t T, int64_t H, int64_t D, nv_bf16* out, float* lse,
                             const nv_bf16* part_out, const float* part_lse, int64_t qr, int64_t lr) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= B * H * T) return;
  const int64_t t = row % T, h = (row / T) % H, b = row / (T * H);
  const int64_t li = (b * H + h) * lr + t;
  const float l1 = lse[li], l2 = part_lse[li];
  if (l2 == -INFINITY) return;  // the part saw no key
  const float hi = fmaxf(l1, l2);
  const float l = hi + logf((l1 == -INFINITY ? 0.f : expf(l1 - hi)) + expf(l2 - hi));
  const float w1 = l1 == -INFINITY ? 0.f : expf(l1 - l), w2 = expf(l2 - l);
  nv_bf16* o = out + ((b * qr + t) * H + h) * D;
  const nv_bf16* po = part_out + ((b * qr + t) * H + h) * D;
  for (int64_t d = 0; d < D; ++d) o[d] = to_bf16(w1 * to_float(o[d]) + w2 * to_float(po[d]));
  lse[li] = l;
}

Status check(const AttentionMergeParams<bf16>& p) { return params_check(p); }
int64_t scratch(const AttentionMergeParams<bf16>&) { return 0; }

Status run(const AttentionMergeParams<bf16>& p, Workspace, cudaStream_t stream) {
  const int64_t rows = p.B * p.H * p.T;
  if (rows == 0) return Status::ok;
  merge_kernel<<<gpu::grid_blocks(rows, 256), 256, 0, stream>>>(
      p.B, p.T, p.H, p.D, gpu::dev(p.out), p.lse, gpu::dev(p.part_out), p.part_lse,
      p.q_batch_rows ? p.q_batch_rows : p.T, p.lse_batch_rows ? p.lse_batch_rows : p.T);
  WEFT_LAUNCH_CHECK(stream, "attention merge_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(AttentionMergeParams)

}  // namespace weft::kernels
