// elementwise and reduce on CUDA, bf16 storage with fp32 arithmetic; fill,
// scale, axpy and the sum of squares also on fp32 storage, the main
// gradients of bf16 training (elementwise_fp32_cuda.h: the CPU backend's
// float launches on a CUDA stream come here).
//
// Add, scale, axpy, fill and the two casts are one grid-stride pass each
// (for_each8 in kernels/cuda_common.cuh): a thread moves 8 elements of every
// operand per step (one 16-byte access of bf16, two of fp32) when all
// pointers are 16-byte aligned, element by element otherwise and for the
// tail. The grid is capped at what the SMs hold at once, so a thread keeps
// several independent 16-byte loads in flight across iterations instead of
// the scheduler launching millions of blocks. Scalars round to fp32 once, as
// the CPU rounds them to Acc; nvcc contracts axpy's multiply and add into an
// fma, so fp32 axpy may differ from the CPU's in the last bit.
//
// The sum of squares keeps the CPU's contract: partial sums per kSumChunk
// elements in the workspace (one block per chunk, double accumulators, a
// block reduction by shuffles), then one block adds the partials in a fixed
// order into *sum. The result is the same on every run, for any grid, which
// a grid-wide atomicAdd of doubles would not give. Every square is exact (a
// bf16 one in fp32, an fp32 one in double); the adds run in double, as the
// CPU's do, since a gradient norm sums 10^9 squares.
#include <type_traits>

#include "kernels/cuda_common.cuh"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/elementwise_check.h"
#include "kernels/elementwise/elementwise_fp32_cuda.h"

namespace weft::kernels {
namespace {

using gpu::Float8;
using gpu::Floats;
using gpu::kVec;
using gpu::load;
using gpu::load8;
using gpu::nv_bf16;
using gpu::store;
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

// Scale, axpy and fill take either storage type: nv_bf16 (the bf16
// instantiation) or float (the fp32 main gradients of bf16 training,
// elementwise_fp32_cuda.h). One body serves the 16-byte form (N = kVec) and
// the element-by-element one (N = 1).
template <typename T>
struct ScaleOp {
  float alpha;
  const T* x;  // (n)
  T* out;      // (n)
  template <int N>
  __device__ void apply(int64_t i) const {
    Floats<N> v = load<N>(x + i);
#pragma unroll
    for (int j = 0; j < N; ++j) v.v[j] *= alpha;
    store<N>(out + i, v);
  }
  __device__ void vec(int64_t i) const { apply<kVec>(i); }
  __device__ void one(int64_t i) const { apply<1>(i); }
};

template <typename T>
struct AxpyOp {
  float alpha;
  const T* x;  // (n)
  T* y;        // (n)
  template <int N>
  __device__ void apply(int64_t i) const {
    const Floats<N> xv = load<N>(x + i);
    Floats<N> yv = load<N>(y + i);
#pragma unroll
    for (int j = 0; j < N; ++j) yv.v[j] += alpha * xv.v[j];
    store<N>(y + i, yv);
  }
  __device__ void vec(int64_t i) const { apply<kVec>(i); }
  __device__ void one(int64_t i) const { apply<1>(i); }
};

// value is already a T value, so the store rounds nothing.
template <typename T>
struct FillOp {
  float value;
  T* x;  // (n)
  template <int N>
  __device__ void apply(int64_t i) const {
    Floats<N> v;
#pragma unroll
    for (int j = 0; j < N; ++j) v.v[j] = value;
    store<N>(x + i, v);
  }
  __device__ void vec(int64_t i) const { apply<kVec>(i); }
  __device__ void one(int64_t i) const { apply<1>(i); }
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

// x^2, exactly, in double: a bf16 square is exact in fp32 (8 significant bits
// squared), an fp32 one needs double's 53 bits (and matches the CPU's
// double(x) * double(x)).
template <typename T>
__device__ __forceinline__ double square(float v) {
  if constexpr (std::is_same_v<T, nv_bf16>)
    return double(v * v);
  else
    return double(v) * double(v);
}

// One block per chunk of kSumChunk elements: partial[chunk] = sum of x^2.
template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    sum_squares_chunk_kernel(int64_t n, bool vec,
                             const T* x,         // (n)
                             double* partial) {  // (chunks)
  const int64_t begin = int64_t(blockIdx.x) * kSumChunk;
  const int64_t end = min(n, begin + kSumChunk);
  // Chunks start at multiples of kSumChunk, so an aligned x stays aligned.
  const int64_t vec_end = vec ? begin + (end - begin) / kVec * kVec : begin;
  double s = 0;
  for (int64_t i = begin + int64_t(threadIdx.x) * kVec; i < vec_end; i += int64_t(blockDim.x) * kVec) {
    const Float8 v = load8(x + i);
#pragma unroll
    for (int j = 0; j < kVec; ++j) s += square<T>(v.v[j]);
  }
  for (int64_t i = vec_end + threadIdx.x; i < end; i += blockDim.x) s += square<T>(load<1>(x + i).v[0]);
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

// The device type of an element (T of the ops above), and a params pointer
// as that type.
template <typename Elem>
using Storage = std::conditional_t<std::is_same_v<Elem, bf16>, nv_bf16, Elem>;
const nv_bf16* storage(const bf16* p) { return gpu::dev(p); }
nv_bf16* storage(bf16* p) { return gpu::dev(p); }
const float* storage(const float* p) { return p; }
float* storage(float* p) { return p; }

int64_t scratch(const AddParams<bf16>&) { return 0; }
int64_t scratch(const WidenParams<bf16>&) { return 0; }
int64_t scratch(const NarrowParams<bf16>&) { return 0; }
template <typename Elem>
int64_t scratch(const ScaleParams<Elem>&) {
  return 0;
}
template <typename Elem>
int64_t scratch(const AxpyParams<Elem>&) {
  return 0;
}
template <typename Elem>
int64_t scratch(const FillParams<Elem>&) {
  return 0;
}
template <typename Elem>
int64_t scratch(const SumSquaresParams<Elem>& p) {
  return cpu::piece_bytes<double>(chunks(p.n));
}

Status run(const AddParams<bf16>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.a, p.b, p.out), AddOp{gpu::dev(p.a), gpu::dev(p.b), gpu::dev(p.out)},
                 stream, "add");
  return Status::ok;
}

// alpha rounds to fp32 once, as the CPU rounds it to Acc.
template <typename Elem>
Status run(const ScaleParams<Elem>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x, p.out),
                 ScaleOp<Storage<Elem>>{float(p.alpha), storage(p.x), storage(p.out)}, stream, "scale");
  return Status::ok;
}

template <typename Elem>
Status run(const AxpyParams<Elem>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x, p.y),
                 AxpyOp<Storage<Elem>>{float(p.alpha), storage(p.x), storage(p.y)}, stream, "axpy");
  return Status::ok;
}

// The value rounds from double to the element type directly (one rounding,
// not two), as the CPU's Elem(value) does.
float fill_value(const FillParams<bf16>& p) { return __bfloat162float(__double2bfloat16(p.value)); }
float fill_value(const FillParams<float>& p) { return float(p.value); }

template <typename Elem>
Status run(const FillParams<Elem>& p, Workspace, cudaStream_t stream) {
  gpu::for_each8(p.n, aligned(p.x), FillOp<Storage<Elem>>{fill_value(p), storage(p.x)}, stream,
                 "fill");
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

template <typename Elem>
Status run(const SumSquaresParams<Elem>& p, Workspace ws, cudaStream_t stream) {
  if (p.n == 0) return Status::ok;
  const int64_t n_chunks = chunks(p.n);
  double* partial = cpu::WorkspaceCarver(ws).take<double>(n_chunks);
  sum_squares_chunk_kernel<Storage<Elem>><<<n_chunks, kSumThreads, 0, stream>>>(
      p.n, aligned(p.x), storage(p.x), partial);
  WEFT_LAUNCH_CHECK(stream, "sum_squares_chunk_kernel");
  sum_squares_total_kernel<<<1, kTotalThreads, 0, stream>>>(n_chunks, partial, p.sum);
  WEFT_LAUNCH_CHECK(stream, "sum_squares_total_kernel");
  return Status::ok;
}

// The fp32 launches' front, as WEFT_CUDA_INSTANTIATE's for bf16: a CUDA
// stream, the shared params rules, then the workspace.
template <typename P>
Status fp32_launch(const P& p, Workspace ws, Stream stream) {
  if (stream.backend != Backend::cuda) return Status::unsupported;
  const Status checked = check(p);
  if (Status s = gpu::preflight(checked, checked == Status::ok ? scratch(p) : 0, ws); s != Status::ok)
    return s;
  return run(p, ws, cuda_stream(stream));
}

}  // namespace

WEFT_CUDA_INSTANTIATE(AddParams)
WEFT_CUDA_INSTANTIATE(ScaleParams)
WEFT_CUDA_INSTANTIATE(AxpyParams)
WEFT_CUDA_INSTANTIATE(FillParams)
WEFT_CUDA_INSTANTIATE(SumSquaresParams)
WEFT_CUDA_INSTANTIATE(WidenParams)
WEFT_CUDA_INSTANTIATE(NarrowParams)

namespace fp32_cuda {

bool available() { return true; }

Status launch(const FillParams<float>& p, Workspace ws, Stream stream) { return fp32_launch(p, ws, stream); }
Status launch(const AxpyParams<float>& p, Workspace ws, Stream stream) { return fp32_launch(p, ws, stream); }
Status launch(const ScaleParams<float>& p, Workspace ws, Stream stream) { return fp32_launch(p, ws, stream); }
Status launch(const SumSquaresParams<float>& p, Workspace ws, Stream stream) {
  return fp32_launch(p, ws, stream);
}

}  // namespace fp32_cuda

}  // namespace weft::kernels
