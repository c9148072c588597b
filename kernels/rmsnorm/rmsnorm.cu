// rmsnorm on CUDA, bf16 rows, fp32 statistics and arithmetic, dweight in fp32
// or bf16.
//
// Fused forward: one block per row. The first pass adds the residual (writing
// the rounded sum, the next residual stream) and accumulates the sum of
// squares; a block reduction (warp shuffles, then one shared slot per warp)
// gives rstd; the second pass re-reads the row, which is still in L1/L2 (a
// 16 KB row at C = 8192), and writes y = w * bf16(x * rstd), Hugging Face's
// rounding. DRAM traffic is the minimum: x (and residual) read once, sum and
// y written once.
//
// Fused backward: with g = dy * w and x_hat = x * rstd,
//   dx = rstd * g - x * (sum(g * x) * rstd^3 / C)
// per row (one reduction), written or added to the residual gradient in the
// same pass. dweight = sum over rows of dy * x_hat must not race between
// blocks, so a fixed grid of at most kMaxPartials blocks walks the rows
// (grid-stride), each block summing its rows' dweight terms in shared memory
// (one slot per column, owned by one thread) and writing them as one partial
// row; a second kernel adds the partials in a fixed order, 32 x 32 threads
// per 32 columns, and adds the total to dweight: fp32 main gradients by
// default, so a norm weight's gradient is not rounded to bf16 once per
// micro-batch; with bf16 gradients (grad:bf16) the entry is read, the fp32
// total added and the sum rounded once. Deterministic on every run; the
// partials (512 x C fp32, written and read back) add about 4% to the row
// traffic at 16k rows.
//
// Unfused: the same math as separate launches with materialised fp32
// intermediates (rstd; x_hat; y / dweight; g; mean(g * x_hat); dx), the
// shape an eager framework gives it and the traffic the layout's norm:unfused
// knob pays for, so the tuner measures the real difference.
//
// Every row loop moves 16 bytes per thread per step when C is a multiple of 8
// and the row pointers are aligned (N = 8), element by element otherwise
// (N = 1); blocks have one 16-byte piece per thread up to 1024 threads.
#include "kernels/cuda_common.cuh"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rmsnorm/rmsnorm_check.h"

#include <initializer_list>

namespace weft::kernels {
namespace {

using gpu::Floats;
using gpu::kVec;
using gpu::load;
using gpu::nv_bf16;
using gpu::round_bf16;
using gpu::store;

constexpr int kMaxThreads = gpu::kMaxRowThreads;
constexpr int64_t kMaxPartials = 512;
// The backward keeps a block's dweight terms for all C columns in shared
// memory: 40960 fp32 columns are 160 KiB, under the 163 KiB an sm_80 block
// may opt into (227 KiB on sm_90).
constexpr int64_t kMaxBackwardC = 40960;
constexpr int kReduceTile = 32;

int64_t partials(int64_t rows) { return rows < kMaxPartials ? rows : kMaxPartials; }

template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    fused_forward_kernel(int64_t C, float eps,
                         const nv_bf16* x,         // (rows, C)
                         const nv_bf16* residual,  // (rows, C) or null
                         nv_bf16* sum,             // (rows, C) with residual
                         const nv_bf16* w,         // (C)
                         nv_bf16* y,               // (rows, C)
                         float* rstd) {            // (rows)
  const int64_t row = blockIdx.x, step = int64_t(blockDim.x) * N;
  const nv_bf16* in = x + row * C;
  float ss = 0;
  if (residual != nullptr) {
    nv_bf16* s_row = sum + row * C;
    for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step) {
      Floats<N> a = load<N>(in + c);
      const Floats<N> b = load<N>(residual + row * C + c);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        a.v[j] = round_bf16(a.v[j] + b.v[j]);
        ss += a.v[j] * a.v[j];
      }
      store<N>(s_row + c, a);
    }
    in = s_row;  // each thread re-reads only what it wrote
  } else {
    for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step) {
      const Floats<N> a = load<N>(in + c);
#pragma unroll
      for (int j = 0; j < N; ++j) ss += a.v[j] * a.v[j];
    }
  }
  ss = gpu::block_reduce(ss, gpu::SumOp{}, 0.0f);
  const float rs = 1.0f / sqrtf(ss / float(C) + eps);
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step) {
    Floats<N> a = load<N>(in + c);
    const Floats<N> wv = load<N>(w + c);
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] = wv.v[j] * round_bf16(a.v[j] * rs);
    store<N>(y + row * C + c, a);
  }
  if (threadIdx.x == 0) rstd[row] = rs;
}

// The shared-memory slot of element j of a thread's piece starting at column
// c: piece-major per element, so a warp's slots are consecutive words.
template <int N>
__device__ __forceinline__ int64_t slot(int64_t C, int64_t c, int j) {
  return int64_t(j) * (C / N) + c / N;
}

template <int N>
__device__ __forceinline__ void partial_write(int64_t C, const float* acc, float* partial_row) {
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += int64_t(blockDim.x) * N) {
    Floats<N> f;
#pragma unroll
    for (int j = 0; j < N; ++j) f.v[j] = acc[slot<N>(C, c, j)];
    store<N>(partial_row + c, f);
  }
}

template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    fused_backward_kernel(int64_t rows, int64_t C,
                          const nv_bf16* x,     // (rows, C)
                          const nv_bf16* w,     // (C)
                          const float* rstd,    // (rows)
                          const nv_bf16* dy,    // (rows, C)
                          nv_bf16* dx,          // (rows, C)
                          bool accumulate,
                          float* partial) {     // (gridDim.x, C)
  extern __shared__ float acc[];  // (C) this block's dweight terms
  const int64_t step = int64_t(blockDim.x) * N;
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[slot<N>(C, c, j)] = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float rs = rstd[row];
    const nv_bf16* x_row = x + row * C;
    const nv_bf16* dy_row = dy + row * C;
    float dot = 0;
    for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step) {
      const Floats<N> xv = load<N>(x_row + c), wv = load<N>(w + c), g = load<N>(dy_row + c);
#pragma unroll
      for (int j = 0; j < N; ++j) dot += g.v[j] * wv.v[j] * xv.v[j];
    }
    dot = gpu::block_reduce(dot, gpu::SumOp{}, 0.0f);
    // mean(g * x_hat) * rstd, folded into one coefficient on x.
    const float coeff = dot * rs * rs * rs / float(C);
    for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step) {
      const Floats<N> xv = load<N>(x_row + c), wv = load<N>(w + c), g = load<N>(dy_row + c);
      Floats<N> out;
      if (accumulate) out = load<N>(dx + row * C + c);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float d = rs * g.v[j] * wv.v[j] - coeff * xv.v[j];
        out.v[j] = accumulate ? out.v[j] + d : d;
        acc[slot<N>(C, c, j)] += g.v[j] * (xv.v[j] * rs);
      }
      store<N>(dx + row * C + c, out);
    }
  }
  partial_write<N>(C, acc, partial + int64_t(blockIdx.x) * C);
}

// dweight[c] += sum over the parts of partial[part, c], in part order: thread
// (tx, ty) sums parts ty, ty + 32, ... of column tx, then row ty = 0 adds the
// 32 sums in order. G: float, or nv_bf16 (one rounding, of the final sum).
template <typename G>
__global__ void __launch_bounds__(kReduceTile* kReduceTile)
    dweight_reduce_kernel(int64_t C, int64_t parts,
                          const float* partial,  // (parts, C)
                          G* dweight) {          // (C)
  __shared__ float sums[kReduceTile][kReduceTile + 1];
  const int64_t c = int64_t(blockIdx.x) * kReduceTile + threadIdx.x;
  float s = 0;
  if (c < C)
    for (int64_t part = threadIdx.y; part < parts; part += kReduceTile) s += partial[part * C + c];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0;
    for (int i = 0; i < kReduceTile; ++i) total += sums[i][threadIdx.x];
    gpu::put(dweight[c], gpu::to_float(dweight[c]) + total);
  }
}

// Unfused forward, op 1: rstd per row.
template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    rstd_kernel(int64_t C, float eps,
                const nv_bf16* x,  // (rows, C)
                float* rstd) {     // (rows)
  const int64_t row = blockIdx.x;
  float ss = 0;
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += int64_t(blockDim.x) * N) {
    const Floats<N> a = load<N>(x + row * C + c);
#pragma unroll
    for (int j = 0; j < N; ++j) ss += a.v[j] * a.v[j];
  }
  ss = gpu::block_reduce(ss, gpu::SumOp{}, 0.0f);
  if (threadIdx.x == 0) rstd[row] = 1.0f / sqrtf(ss / float(C) + eps);
}

// Unfused forward, op 2: x_hat = x * rstd.
template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    x_hat_kernel(int64_t C,
                 const nv_bf16* x,    // (rows, C)
                 const float* rstd,   // (rows)
                 float* x_hat) {      // (rows, C)
  const int64_t row = blockIdx.x;
  const float rs = rstd[row];
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += int64_t(blockDim.x) * N) {
    Floats<N> a = load<N>(x + row * C + c);
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] *= rs;
    store<N>(x_hat + row * C + c, a);
  }
}

// Unfused forward, op 3: y = w * bf16(x_hat).
template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    scale_by_weight_kernel(int64_t C,
                           const float* x_hat,  // (rows, C)
                           const nv_bf16* w,    // (C)
                           nv_bf16* y) {        // (rows, C)
  const int64_t row = blockIdx.x;
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += int64_t(blockDim.x) * N) {
    Floats<N> a = load<N>(x_hat + row * C + c);
    const Floats<N> wv = load<N>(w + c);
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] = wv.v[j] * round_bf16(a.v[j]);
    store<N>(y + row * C + c, a);
  }
}

// Unfused backward, op 1: the partial dweight sums of dy * x_hat.
template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    dweight_partial_kernel(int64_t rows, int64_t C,
                           const nv_bf16* dy,    // (rows, C)
                           const float* x_hat,   // (rows, C)
                           float* partial) {     // (gridDim.x, C)
  extern __shared__ float acc[];  // (C)
  const int64_t step = int64_t(blockDim.x) * N;
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step)
#pragma unroll
    for (int j = 0; j < N; ++j) acc[slot<N>(C, c, j)] = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x)
    for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += step) {
      const Floats<N> g = load<N>(dy + row * C + c), xh = load<N>(x_hat + row * C + c);
#pragma unroll
      for (int j = 0; j < N; ++j) acc[slot<N>(C, c, j)] += g.v[j] * xh.v[j];
    }
  partial_write<N>(C, acc, partial + int64_t(blockIdx.x) * C);
}

// Unfused backward, op 2: g = dy * w.
template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    dy_times_weight_kernel(int64_t C,
                           const nv_bf16* dy,  // (rows, C)
                           const nv_bf16* w,   // (C)
                           float* g) {         // (rows, C)
  const int64_t row = blockIdx.x;
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += int64_t(blockDim.x) * N) {
    Floats<N> a = load<N>(dy + row * C + c);
    const Floats<N> wv = load<N>(w + c);
#pragma unroll
    for (int j = 0; j < N; ++j) a.v[j] *= wv.v[j];
    store<N>(g + row * C + c, a);
  }
}

// Unfused backward, op 3: mean(g * x_hat) per row.
template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    row_mean_kernel(int64_t C,
                    const float* g,       // (rows, C)
                    const float* x_hat,   // (rows, C)
                    float* mean) {        // (rows)
  const int64_t row = blockIdx.x;
  float s = 0;
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += int64_t(blockDim.x) * N) {
    const Floats<N> a = load<N>(g + row * C + c), b = load<N>(x_hat + row * C + c);
#pragma unroll
    for (int j = 0; j < N; ++j) s += a.v[j] * b.v[j];
  }
  s = gpu::block_reduce(s, gpu::SumOp{}, 0.0f);
  if (threadIdx.x == 0) mean[row] = s / float(C);
}

// Unfused backward, op 4: dx (+)= rstd * (g - x_hat * mean).
template <int N>
__global__ void __launch_bounds__(kMaxThreads)
    unfused_dx_kernel(int64_t C,
                      const float* g,       // (rows, C)
                      const float* x_hat,   // (rows, C)
                      const float* mean,    // (rows)
                      const float* rstd,    // (rows)
                      nv_bf16* dx,          // (rows, C)
                      bool accumulate) {
  const int64_t row = blockIdx.x;
  const float rs = rstd[row], m = mean[row];
  for (int64_t c = int64_t(threadIdx.x) * N; c < C; c += int64_t(blockDim.x) * N) {
    const Floats<N> a = load<N>(g + row * C + c), b = load<N>(x_hat + row * C + c);
    Floats<N> out;
    if (accumulate) out = load<N>(dx + row * C + c);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float d = rs * (a.v[j] - b.v[j] * m);
      out.v[j] = accumulate ? out.v[j] + d : d;
    }
    store<N>(dx + row * C + c, out);
  }
}

// Pointers and C allow the 16-byte form.
bool vectorizable(int64_t C, std::initializer_list<const void*> pointers) {
  if (C % kVec != 0) return false;
  for (const void* p : pointers)
    if (p != nullptr && !gpu::aligned16(p)) return false;
  return true;
}

int threads_for(int64_t C, bool vec) { return gpu::row_threads(vec ? C / kVec : C, kMaxThreads); }

// Launches kernel<8> or kernel<1> with the given geometry.
#define WEFT_RMSNORM_LAUNCH(kernel, vec, grid, threads, smem, stream, ...)        \
  do {                                                                             \
    if (vec)                                                                       \
      kernel<kVec><<<grid, threads, smem, stream>>>(__VA_ARGS__);                  \
    else                                                                           \
      kernel<1><<<grid, threads, smem, stream>>>(__VA_ARGS__);                     \
    WEFT_LAUNCH_CHECK(stream, #kernel);                                            \
  } while (0)

// A kernel with C fp32 of dynamic shared memory; past the default 48 KiB the
// kernel must opt in first. The 48 KiB hold its static shared memory too
// (block_reduce's slots in the fused backward), so the dynamic part alone
// may not reach 48 KiB without the opt-in.
template <typename Kernel>
void allow_shared(Kernel kernel, int64_t bytes) {
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  if (bytes + int64_t(attributes.sharedSizeBytes) > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// dweight += the partial sums (parts, C).
template <typename G>
void dweight_reduce(int64_t C, int64_t parts, const float* partial, G* dweight,
                    cudaStream_t stream) {
  const dim3 threads(kReduceTile, kReduceTile);
  dweight_reduce_kernel<<<(C + kReduceTile - 1) / kReduceTile, threads, 0, stream>>>(
      C, parts, partial, dweight);
  WEFT_LAUNCH_CHECK(stream, "dweight_reduce_kernel");
}

// This backend's limits, then the shared rules (rmsnorm_check.h).
Status check(const RmsnormForwardParams<bf16>& p) {
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

template <typename G>
Status check(const RmsnormBackwardParams<bf16, G>& p) {
  if (p.C > kMaxBackwardC) return Status::unsupported;
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

Status check(const RmsnormUnfusedForwardParams<bf16>& p) {
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

template <typename G>
Status check(const RmsnormUnfusedBackwardParams<bf16, G>& p) {
  if (p.C > kMaxBackwardC) return Status::unsupported;
  if (p.rows > gpu::kMaxGridX) return Status::unsupported;
  return params_check(p);
}

int64_t scratch(const RmsnormForwardParams<bf16>&) { return 0; }
int64_t scratch(const RmsnormUnfusedForwardParams<bf16>&) { return 0; }

// The partial dweight rows.
template <typename G>
int64_t scratch(const RmsnormBackwardParams<bf16, G>& p) {
  return cpu::piece_bytes<float>(partials(p.rows) * p.C);
}

// As the header says, g (rows, C) and mean(g * x_hat) (rows), then the
// partial dweight rows.
template <typename G>
int64_t scratch(const RmsnormUnfusedBackwardParams<bf16, G>& p) {
  return cpu::piece_bytes<float>(p.rows * p.C) + cpu::piece_bytes<float>(p.rows) +
         cpu::piece_bytes<float>(partials(p.rows) * p.C);
}

Status run(const RmsnormForwardParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  const bool vec = vectorizable(p.C, {p.x, p.residual, p.sum, p.weight, p.y});
  WEFT_RMSNORM_LAUNCH(fused_forward_kernel, vec, p.rows, threads_for(p.C, vec), 0, stream, p.C,
                      float(p.eps), gpu::dev(p.x), p.residual ? gpu::dev(p.residual) : nullptr,
                      p.residual ? gpu::dev(p.sum) : nullptr, gpu::dev(p.weight), gpu::dev(p.y),
                      p.rstd);
  return Status::ok;
}

template <typename G>
Status run(const RmsnormBackwardParams<bf16, G>& p, Workspace ws, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  const int64_t parts = partials(p.rows);
  float* partial = cpu::WorkspaceCarver(ws).take<float>(parts * p.C);
  const bool vec = vectorizable(p.C, {p.x, p.weight, p.dy, p.dx, partial});
  const int64_t smem = p.C * int64_t(sizeof(float));
  allow_shared(fused_backward_kernel<kVec>, smem);
  allow_shared(fused_backward_kernel<1>, smem);
  WEFT_RMSNORM_LAUNCH(fused_backward_kernel, vec, parts, threads_for(p.C, vec), smem, stream,
                      p.rows, p.C, gpu::dev(p.x), gpu::dev(p.weight), p.rstd, gpu::dev(p.dy),
                      gpu::dev(p.dx), p.dx_write == Write::accumulate, partial);
  if (p.dweight) dweight_reduce(p.C, parts, partial, gpu::dev(p.dweight), stream);
  return Status::ok;
}

Status run(const RmsnormUnfusedForwardParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  const bool vec = vectorizable(p.C, {p.x, p.weight, p.y, p.x_hat});
  const int threads = threads_for(p.C, vec);
  WEFT_RMSNORM_LAUNCH(rstd_kernel, vec, p.rows, threads, 0, stream, p.C, float(p.eps),
                      gpu::dev(p.x), p.rstd);
  WEFT_RMSNORM_LAUNCH(x_hat_kernel, vec, p.rows, threads, 0, stream, p.C, gpu::dev(p.x), p.rstd,
                      p.x_hat);
  WEFT_RMSNORM_LAUNCH(scale_by_weight_kernel, vec, p.rows, threads, 0, stream, p.C, p.x_hat,
                      gpu::dev(p.weight), gpu::dev(p.y));
  return Status::ok;
}

template <typename G>
Status run(const RmsnormUnfusedBackwardParams<bf16, G>& p, Workspace ws, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok;
  const int64_t parts = partials(p.rows);
  cpu::WorkspaceCarver carve(ws);
  float* g = carve.take<float>(p.rows * p.C);
  float* mean = carve.take<float>(p.rows);
  float* partial = carve.take<float>(parts * p.C);
  const bool vec = vectorizable(p.C, {p.x_hat, p.weight, p.dy, p.dx, g, partial});
  const int threads = threads_for(p.C, vec);
  const int64_t smem = p.C * int64_t(sizeof(float));
  allow_shared(dweight_partial_kernel<kVec>, smem);
  allow_shared(dweight_partial_kernel<1>, smem);
  WEFT_RMSNORM_LAUNCH(dweight_partial_kernel, vec, parts, threads, smem, stream, p.rows, p.C,
                      gpu::dev(p.dy), p.x_hat, partial);
  if (p.dweight) dweight_reduce(p.C, parts, partial, gpu::dev(p.dweight), stream);
  WEFT_RMSNORM_LAUNCH(dy_times_weight_kernel, vec, p.rows, threads, 0, stream, p.C, gpu::dev(p.dy),
                      gpu::dev(p.weight), g);
  WEFT_RMSNORM_LAUNCH(row_mean_kernel, vec, p.rows, threads, 0, stream, p.C, g, p.x_hat, mean);
  WEFT_RMSNORM_LAUNCH(unfused_dx_kernel, vec, p.rows, threads, 0, stream, p.C, g, p.x_hat, mean,
                      p.rstd, gpu::dev(p.dx), p.dx_write == Write::accumulate);
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(RmsnormForwardParams)
WEFT_CUDA_INSTANTIATE(RmsnormBackwardParams)
WEFT_CUDA_INSTANTIATE(RmsnormUnfusedForwardParams)
WEFT_CUDA_INSTANTIATE(RmsnormUnfusedBackwardParams)
WEFT_CUDA_INSTANTIATE_BF16_GRAD(RmsnormBackwardParams)
WEFT_CUDA_INSTANTIATE_BF16_GRAD(RmsnormUnfusedBackwardParams)

}  // namespace weft::kernels
