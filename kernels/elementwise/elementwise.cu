// elementwise and reduce on CUDA, bf16 storage with fp32 arithmetic.
//
// Add, scale, axpy, fill and the two casts are one grid-stride pass each
// (for_each8 in kernels/cuda_common.cuh): a thread moves 16 bytes of every
// operand per step when all pointers are 16-byte aligned, element by element
// otherwise and for the tail. The grid is capped at what the SMs hold at
// once, so a thread keeps several independent 16-byte loads in flight across
// iterations instead of the scheduler launching millions of blocks.
//
// The sum of squares keeps the CPU's contract: partial sums per kSumChunk
// elements in the workspace (one block per chunk, double accumulators, a
// block reduction by shuffles), then one block adds the partials in a fixed
// order into *sum. The result is the same on every run, for any grid, which
// a grid-wide atomicAdd of doubles would not give. A bf16 square is exact in
// fp32 (8 significant bits squared); the adds run in double, as the CPU's do,
// since a gradient norm sums 10^9 squares.
#include "kernels/cuda_common.cuh"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/elementwise_check.h"

namespace weft::kernels {
namespace {

using gpu::Float8;
using gpu::kVec;
using gpu::load8;
using gpu::nv_bf16;
using gpu::store8;
using gpu::to_bf16;
using gpu::to_float;

bool aligned(const void* a, const void* b = nullptr, const void* c = nullptr) {
  return gpu::aligned16(a) && (b == nullptr || gpu::aligned16(b)) && (c == nullptr || gpu::aligned16(c));
}

struct AddOp {
  const nv_bf16* a;  // (n)
  const nv_bf16* b;  // (n)
  nv_bf16* out;      // (n)
  __device__ void vec(int64_t i) const {
    Float8 x = load8(a + i);
    const Float8 y = load8(b + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) x.v[j] += y.v[j];
    store8(out + i, x);
  }
  __device__ void one(int64_t i) const { out[i] = to_bf16(to_float(a[i]) + to_float(b[i])); }
};

struct ScaleOp {
  float alpha;
  const nv_bf16* x;  // (n)
  nv_bf16* out;      // (n)
  __device__ void vec(int64_t i) const {
    Float8 v = load8(x + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v.v[j] *= alpha;
    store8(out + i, v);
  }
  __device__ void one(int64_t i) const { out[i] = to_bf16(alpha * to_float(x[i])); }
};

struct AxpyOp {
  float alpha;
  const nv_bf16* x;  // (n)
  nv_bf16* y;        // (n)
  __device__ void vec(int64_t i) const {
    const Float8 xv = load8(x + i);
    Float8 yv = load8(y + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) yv.v[j] += alpha * xv.v[j];
    store8(y + i, yv);
  }
  __device__ void one(int64_t i) const { y[i] = to_bf16(to_float(y[i]) + alpha * to_float(x[i])); }
};

struct FillOp {
  nv_bf16 value;
  nv_bf16* x;  // (n)
  __device__ void vec(int64_t i) const {
    uint4 raw;
    nv_bf16* h = reinterpret_cast<nv_bf16*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) h[j] = value;
    *reinterpret_cast<uint4*>(x + i) = raw;
  }
  __device__ void one(int64_t i) const { x[i] = value; }
};

struct WidenOp {
  const nv_bf16* x;  // (n)
  float* out;        // (n)
  bool accumulate;
  __device__ void vec(int64_t i) const {
    Float8 v = load8(x + i);
    if (accumulate) {
      const Float8 o = load8(out + i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v.v[j] += o.v[j];
    }
    store8(out + i, v);
  }
  __device__ void one(int64_t i) const {
    out[i] = accumulate ? out[i] + to_float(x[i]) : to_float(x[i]);
  }
};

struct NarrowOp {
  const float* x;  // (n)
  nv_bf16* out;    // (n)
  __device__ void vec(int64_t i) const { store8(out + i, load8(x + i)); }
  __device__ void one(int64_t i) const { out[i] = to_bf16(x[i]); }
};

constexpr int kSumThreads = 256;
constexpr int kTotalThreads = 1024;

// One block per chunk of kSumChunk elements: partial[chunk] = sum of x^2.
__global__ void __launch_bounds__(kSumThreads)
    sum_squares_chunk_kernel(int64_t n, bool vec,
                             const nv_bf16* x,  // (n)
                             double* partial) {  // (chunks)
  const int64_t begin = int64_t(blockIdx.x) * kSumChunk;
  const int64_t end = min(n, begin + kSumChunk);
  // Chunks start at multiples of kSumChunk, so an aligned x stays aligned.
  const int64_t vec_end = vec ? begin + (end - begin) / kVec * kVec : begin;
  double s = 0;
  for (int64_t i = begin + int64_t(threadIdx.x) * kVec; i < vec_end; i += int64_t(blockDim.x) * kVec) {
    const Float8 v = load8(x + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) s += double(v.v[j] * v.v[j]);
  }
  for (int64_t i = vec_end + threadIdx.x; i < end; i += blockDim.x) {
    const float v = to_float(x[i]);
    s += double(v * v);
  }
  s = gpu::block_reduce(s, gpu::SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: *sum += the partials, in a fixed order.
__global__ void __launch_bounds__(kTotalThreads)
    sum_squares_total_kernel(int64_t chunks,
                             const double* partial,  // (chunks)
                             double* sum) {          // one value
  double s = 0;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) s += partial[c];
  s = gpu::block_reduce(s, gpu::SumOp{}, 0.0);
  if (threadIdx.x == 0) *sum += s;
}

int64_t chunks(int64_t n) { return (n + kSumChunk - 1) / kSumChunk; }

// The shared rules (elementwise_check.h); this backend adds no limits.
template <typename P>
Status check(const P& p) {
  return params_check(p);
}

int64_t scratch(const AddParams<bf16>&) { return 0; }
int64_t scratch(const ScaleParams<bf16>&) { return 0; }
int64_t scratch(const AxpyParams<bf16>&) { return 0; }
int64_t scratch(const FillParams<bf16>&) { return 0; }
int64_t scratch(const WidenParams<bf16>&) { return 0; }
int64_t scratch(const NarrowParams<bf16>&) { return 0; }
int64_t scratch(const SumSquaresParams<bf16>& p) { return cpu::piece_bytes<double>(chunks(p.n)); }

Status run(const AddParams<bf16>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.a, p.b, p.out), AddOp{gpu::dev(p.a), gpu::dev(p.b), gpu::dev(p.out)},
                 stream, "add");
  return Status::ok;
}

// alpha rounds to fp32 once, as the CPU rounds it to Acc.
Status run(const ScaleParams<bf16>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x, p.out), ScaleOp{float(p.alpha), gpu::dev(p.x), gpu::dev(p.out)},
                 stream, "scale");
  return Status::ok;
}

Status run(const AxpyParams<bf16>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x, p.y), AxpyOp{float(p.alpha), gpu::dev(p.x), gpu::dev(p.y)},
                 stream, "axpy");
  return Status::ok;
}

// The value rounds from double to bf16 directly (one rounding, not two).
Status run(const FillParams<bf16>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x), FillOp{__double2bfloat16(p.value), gpu::dev(p.x)}, stream, "fill");
  return Status::ok;
}

Status run(const WidenParams<bf16>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x, p.out),
                 WidenOp{gpu::dev(p.x), p.out, p.write == Write::accumulate}, stream, "widen");
  return Status::ok;
}

Status run(const NarrowParams<bf16>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x, p.out), NarrowOp{p.x, gpu::dev(p.out)}, stream, "narrow");
  return Status::ok;
}

Status run(const SumSquaresParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.n == 0) return Status::ok;
  const int64_t n_chunks = chunks(p.n);
  double* partial = cpu::WorkspaceCarver(ws).take<double>(n_chunks);
  sum_squares_chunk_kernel<<<n_chunks, kSumThreads, 0, stream>>>(p.n, aligned(p.x), gpu::dev(p.x),
                                                                  partial);
  WEFT_LAUNCH_CHECK(stream, "sum_squares_chunk_kernel");
  sum_squares_total_kernel<<<1, kTotalThreads, 0, stream>>>(n_chunks, partial, p.sum);
  WEFT_LAUNCH_CHECK(stream, "sum_squares_total_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(AddParams)
WEFT_CUDA_INSTANTIATE(ScaleParams)
WEFT_CUDA_INSTANTIATE(AxpyParams)
WEFT_CUDA_INSTANTIATE(FillParams)
WEFT_CUDA_INSTANTIATE(SumSquaresParams)
WEFT_CUDA_INSTANTIATE(WidenParams)
WEFT_CUDA_INSTANTIATE(NarrowParams)

}  // namespace weft::kernels
