// elementwise and reduce on the CPU: one OpenMP-parallel loop each.
//
// Scalars arrive as double and are rounded to Acc once, so a float launch
// computes exactly what a float loop with a float scalar would. The sum of
// squares accumulates in double: a gradient norm sums 10^9 squares, far past
// fp32's 2^24 of exact integer steps.
#include "kernels/elementwise/elementwise.h"

#include <type_traits>

#include "kernels/cpu_common.h"
#include "kernels/elementwise/elementwise_check.h"
#include "kernels/elementwise/elementwise_fp32_cuda.h"

namespace weft::kernels {
namespace {

int64_t chunks(int64_t n) { return (n + kSumChunk - 1) / kSumChunk; }

// The fp32 ops that also run on CUDA (elementwise_fp32_cuda.h) are handed
// over there when the backend is CUDA.
template <typename P>
bool on_cuda(Backend backend) {
  return fp32_cuda::runs<P> && backend == Backend::cuda;
}

}  // namespace

#define WEFT_NO_WORKSPACE(Params)                                                  \
  template <typename Elem>                                                         \
  bool supports(const Params<Elem>& p, Backend backend) {                          \
    if (on_cuda<Params<Elem>>(backend))                                            \
      return fp32_cuda::available() && params_check(p) == Status::ok;              \
    return backend == Backend::cpu && params_check(p) == Status::ok;               \
  }                                                                                \
  template <typename Elem>                                          \
  int64_t workspace_bytes(const Params<Elem>&, Backend) {           \
    return 0;                                                       \
  }
WEFT_NO_WORKSPACE(AddParams)
WEFT_NO_WORKSPACE(ScaleParams)
WEFT_NO_WORKSPACE(AxpyParams)
WEFT_NO_WORKSPACE(FillParams)
WEFT_NO_WORKSPACE(WidenParams)
WEFT_NO_WORKSPACE(NarrowParams)
#undef WEFT_NO_WORKSPACE

template <typename Elem>
Status launch(const AddParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
#pragma omp parallel for simd schedule(static) if (cpu::worth_parallel(p.n))
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = p.a[i] + p.b[i];
  return Status::ok;
}

template <typename Elem>
Status launch(const ScaleParams<Elem>& p, Workspace ws, Stream stream) {
  if constexpr (fp32_cuda::runs<ScaleParams<Elem>>)
    if (stream.backend == Backend::cuda) return fp32_cuda::launch(p, ws, stream);
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const A alpha = A(p.alpha);
#pragma omp parallel for simd schedule(static) if (cpu::worth_parallel(p.n))
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = Elem(alpha * A(p.x[i]));
  return Status::ok;
}

template <typename Elem>
Status launch(const AxpyParams<Elem>& p, Workspace ws, Stream stream) {
  if constexpr (fp32_cuda::runs<AxpyParams<Elem>>)
    if (stream.backend == Backend::cuda) return fp32_cuda::launch(p, ws, stream);
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const A alpha = A(p.alpha);
#pragma omp parallel for simd schedule(static) if (cpu::worth_parallel(p.n))
  for (int64_t i = 0; i < p.n; ++i) p.y[i] = Elem(A(p.y[i]) + alpha * A(p.x[i]));
  return Status::ok;
}

template <typename Elem>
Status launch(const FillParams<Elem>& p, Workspace ws, Stream stream) {
  if constexpr (fp32_cuda::runs<FillParams<Elem>>)
    if (stream.backend == Backend::cuda) return fp32_cuda::launch(p, ws, stream);
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const Elem value = Elem(p.value);
#pragma omp parallel for simd schedule(static) if (cpu::worth_parallel(p.n))
  for (int64_t i = 0; i < p.n; ++i) p.x[i] = value;
  return Status::ok;
}

template <typename Elem>
bool supports(const SumSquaresParams<Elem>& p, Backend backend) {
  if (on_cuda<SumSquaresParams<Elem>>(backend)) return fp32_cuda::available() && params_check(p) == Status::ok;
  return backend == Backend::cpu && params_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const SumSquaresParams<Elem>& p, Backend backend) {
  if (params_check(p) != Status::ok) return 0;
  if (on_cuda<SumSquaresParams<Elem>>(backend) && !fp32_cuda::available()) return 0;
  return cpu::piece_bytes<double>(chunks(p.n));
}

template <typename Elem>
Status launch(const SumSquaresParams<Elem>& p, Workspace ws, Stream stream) {
  if constexpr (fp32_cuda::runs<SumSquaresParams<Elem>>)
    if (stream.backend == Backend::cuda) return fp32_cuda::launch(p, ws, stream);
  if (Status s = cpu::preflight(params_check(p), workspace_bytes(p), ws, stream); s != Status::ok)
    return s;
  const int64_t n_chunks = chunks(p.n);
  double* partial = cpu::WorkspaceCarver(ws).take<double>(n_chunks);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.n))
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t end = std::min(p.n, (c + 1) * kSumChunk);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = c * kSumChunk; i < end; ++i) s += double(p.x[i]) * double(p.x[i]);
    partial[c] = s;
  }
  double total = 0;
  for (int64_t c = 0; c < n_chunks; ++c) total += partial[c];
  *p.sum += total;
  return Status::ok;
}

template <typename Elem>
Status launch(const WidenParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const bool add = p.write == Write::accumulate;
#pragma omp parallel for simd schedule(static) if (cpu::worth_parallel(p.n))
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = add ? p.out[i] + A(p.x[i]) : A(p.x[i]);
  return Status::ok;
}

template <typename Elem>
Status launch(const NarrowParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
#pragma omp parallel for simd schedule(static) if (cpu::worth_parallel(p.n))
  for (int64_t i = 0; i < p.n; ++i) p.out[i] = Elem(p.x[i]);
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(AddParams)
WEFT_CPU_INSTANTIATE(ScaleParams)
WEFT_CPU_INSTANTIATE(AxpyParams)
WEFT_CPU_INSTANTIATE(FillParams)
WEFT_CPU_INSTANTIATE(SumSquaresParams)
WEFT_CPU_INSTANTIATE(WidenParams)
WEFT_CPU_INSTANTIATE(NarrowParams)

}  // namespace weft::kernels
