// cross_entropy on CUDA: the three vocab-parallel phases over bf16 logits,
// with fp32 statistics (row max, sum of exponentials, loss).
//
// Each phase is one block per row reading the bf16 logits directly: no fp32
// copy of the (rows, V_local) logits is ever made, and phase (c) overwrites
// the logits with their gradient in place, so the logits exist once, in bf16.
// A row is walked in 16-byte pieces from its first 16-byte boundary (a row of
// an odd V_local starts anywhere), with the few elements before and after
// taken one by one; V_local = 32000 is 4000 pieces, four per thread of a
// 1024-thread block. The reductions are warp shuffles then one shared slot
// per warp (gpu::block_reduce).
//
// exp uses the fast fp32 intrinsic (__expf, ex2.approx after one multiply):
// its error is a few ulp for the arguments that matter (x - max near 0; far
// below it the terms vanish), under bf16's rounding of the gradient, and it
// keeps the sum phase bound by memory rather than by the exponential's
// instruction count. log of the sum uses the accurate logf.
//
// Phase (c) reads the target logit (all threads, one broadcast load), waits
// at a barrier so that no thread overwrites it first, then writes p * scale
// for every element and (p - 1) * scale for the target, each rounded once.
// Targets are checked on the device before anything is written
// (gpu::first_invalid_id, which synchronises the stream), unless the caller
// checked them (ids_checked). Columns of a padded vocabulary are skipped by
// (a) and (b) and get a zero gradient in (c).
#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/cross_entropy/cross_entropy_check.h"
#include "kernels/cuda_common.cuh"

namespace weft::kernels {
namespace {

using gpu::Float8;
using gpu::kVec;
using gpu::nv_bf16;
using gpu::to_float;

constexpr int kMaxThreads = gpu::kMaxRowThreads;

// A row of n bf16 elements at `row`: [0, head) and [body_end, n) go one
// element at a time, [head, body_end) in 16-byte pieces.
struct RowSplit {
  int64_t head, body_end;
};
__device__ __forceinline__ RowSplit split_row(const nv_bf16* row, int64_t n) {
  const int64_t past = int64_t(reinterpret_cast<uintptr_t>(row) & 15u) / int64_t(sizeof(nv_bf16));
  const int64_t head = min(n, past == 0 ? int64_t{0} : kVec - past);
  return {head, head + (n - head) / kVec * kVec};
}

// f(j, value) for every element of the row this thread owns.
template <typename F>
__device__ __forceinline__ void row_for_each(const nv_bf16* row, int64_t n, F&& f) {
  const RowSplit s = split_row(row, n);
  for (int64_t j = threadIdx.x; j < s.head; j += blockDim.x) f(j, to_float(row[j]));
  for (int64_t j = s.head + int64_t(threadIdx.x) * kVec; j < s.body_end; j += int64_t(blockDim.x) * kVec) {
    const Float8 v = gpu::load8(row + j);
#pragma unroll
    for (int e = 0; e < kVec; ++e) f(j + e, v.v[e]);
  }
  for (int64_t j = s.body_end + threadIdx.x; j < n; j += blockDim.x) f(j, to_float(row[j]));
}

__global__ void __launch_bounds__(kMaxThreads)
    row_max_kernel(int64_t V_local, int64_t valid,  // columns [valid, V_local) are padding
                   const nv_bf16* logits,  // (rows, V_local)
                   float* row_max) {       // (rows)
  const int64_t row = blockIdx.x;
  float m = -INFINITY;
  row_for_each(logits + row * V_local, V_local, [&](int64_t j, float x) {
    if (j < valid) m = fmaxf(m, x);
  });
  m = gpu::block_reduce(m, gpu::MaxOp{}, -INFINITY);
  if (threadIdx.x == 0) row_max[row] = m;
}

__global__ void __launch_bounds__(kMaxThreads)
    sum_exp_kernel(int64_t V_local, int64_t valid,  // columns [valid, V_local) are padding
                   const nv_bf16* logits,  // (rows, V_local)
                   const float* row_max,   // (rows) over all shards
                   float* sum_exp) {       // (rows) this shard's
  const int64_t row = blockIdx.x;
  const float m = row_max[row];
  float s = 0;
  row_for_each(logits + row * V_local, V_local, [&](int64_t j, float x) {
    if (j < valid) s += __expf(x - m);
  });
  s = gpu::block_reduce(s, gpu::SumOp{}, 0.0f);
  if (threadIdx.x == 0) sum_exp[row] = s;
}

__global__ void __launch_bounds__(kMaxThreads)
    loss_grad_kernel(int64_t vocab_start, int64_t V_local, int64_t valid,  // [valid, V_local): padding
                     nv_bf16* logits,         // (rows, V_local) logits in, gradient out
                     const int32_t* targets,  // (rows)
                     const float* row_max,    // (rows)
                     const float* sum_exp,    // (rows)
                     float* loss,             // (rows) or null
                     float scale, int32_t ignore_index) {
  const int64_t row = blockIdx.x;
  nv_bf16* x = logits + row * V_local;
  const int32_t target = targets[row];
  const RowSplit split = split_row(x, V_local);
  if (target == ignore_index) {
    const nv_bf16 zero = gpu::to_bf16(0.0f);
    for (int64_t j = threadIdx.x; j < split.head; j += blockDim.x) x[j] = zero;
    for (int64_t j = split.head + int64_t(threadIdx.x) * kVec; j < split.body_end;
         j += int64_t(blockDim.x) * kVec)
      *reinterpret_cast<uint4*>(x + j) = make_uint4(0, 0, 0, 0);
    for (int64_t j = split.body_end + threadIdx.x; j < V_local; j += blockDim.x) x[j] = zero;
    if (loss != nullptr && threadIdx.x == 0) loss[row] = 0;
    return;
  }
  const int64_t local = int64_t(target) - vocab_start;
  const bool owner = local >= 0 && local < V_local;
  const float m = row_max[row], inv_sum = 1.0f / sum_exp[row];
  const float target_logit = owner ? to_float(x[local]) : 0.0f;
  __syncthreads();  // every thread has read the target logit before any overwrites it
  if (loss != nullptr && threadIdx.x == 0)
    loss[row] = owner ? logf(sum_exp[row]) + m - target_logit : 0.0f;
  // (p - 1) * scale from the saved logit rounds once, where adjusting the
  // stored p * scale would round twice.
  const float target_grad = (__expf(target_logit - m) * inv_sum - 1.0f) * scale;
  auto grad = [&](int64_t j, float v) {
    return j == local ? target_grad : j < valid ? __expf(v - m) * inv_sum * scale : 0.0f;
  };
  for (int64_t j = threadIdx.x; j < split.head; j += blockDim.x) x[j] = gpu::to_bf16(grad(j, to_float(x[j])));
  for (int64_t j = split.head + int64_t(threadIdx.x) * kVec; j < split.body_end;
       j += int64_t(blockDim.x) * kVec) {
    Float8 v = gpu::load8(x + j);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v.v[e] = grad(j + e, v.v[e]);
    gpu::store8(x + j, v);
  }
  for (int64_t j = split.body_end + threadIdx.x; j < V_local; j += blockDim.x)
    x[j] = gpu::to_bf16(grad(j, to_float(x[j])));
}

int threads_for(int64_t V_local) { return gpu::row_threads((V_local + kVec - 1) / kVec, kMaxThreads); }

// The grid limit, then the shared rules (cross_entropy_check.h).
Status check(const CrossEntropyMaxParams<bf16>& p) {
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

Status check(const CrossEntropySumExpParams<bf16>& p) {
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

Status check(const CrossEntropyLossGradParams<bf16>& p) {
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

int64_t scratch(const CrossEntropyMaxParams<bf16>&) { return 0; }
int64_t scratch(const CrossEntropySumExpParams<bf16>&) { return 0; }
int64_t scratch(const CrossEntropyLossGradParams<bf16>&) { return gpu::kIdCheckBytes; }

Status run(const CrossEntropyMaxParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  row_max_kernel<<<p.rows, threads_for(p.V_local), 0, stream>>>(
      p.V_local, valid_columns(p.valid, p.V_local), gpu::dev(p.logits), p.row_max);
  WEFT_LAUNCH_CHECK(stream, "row_max_kernel");
  return Status::ok;
}

Status run(const CrossEntropySumExpParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  sum_exp_kernel<<<p.rows, threads_for(p.V_local), 0, stream>>>(
      p.V_local, valid_columns(p.valid, p.V_local), gpu::dev(p.logits), p.row_max, p.sum_exp);
  WEFT_LAUNCH_CHECK(stream, "sum_exp_kernel");
  return Status::ok;
}

Status run(const CrossEntropyLossGradParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  const gpu::InvalidId bad = p.ids_checked ? gpu::InvalidId{}
                                           : gpu::first_invalid_id(p.targets, p.rows, p.V, p.ignore_index,
                                                                   ws.data, stream);
  if (bad.position >= 0)
    throw InputError("cross_entropy: target id " + std::to_string(bad.id) + " at position " +
                     std::to_string(bad.position) +
                     " is outside [0, V) for the model's vocabulary size V = " + std::to_string(p.V) +
                     " and is not the ignore index " + std::to_string(p.ignore_index));
  loss_grad_kernel<<<p.rows, threads_for(p.V_local), 0, stream>>>(
      p.vocab_start, p.V_local, valid_columns(p.V, p.vocab_start, p.V_local), gpu::dev(p.logits), p.targets,
      p.row_max, p.sum_exp, p.loss,
      float(p.grad_scale), p.ignore_index);
  WEFT_LAUNCH_CHECK(stream, "loss_grad_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(CrossEntropyMaxParams)
WEFT_CUDA_INSTANTIATE(CrossEntropySumExpParams)
WEFT_CUDA_INSTANTIATE(CrossEntropyLossGradParams)

}  // namespace weft::kernels
