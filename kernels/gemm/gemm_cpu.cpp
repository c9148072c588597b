// gemm on the CPU: OpenBLAS sgemm/dgemm, one call per batch entry.
//
// OpenBLAS threads each call itself (its own pool), so the batch loop stays
// serial: an OpenMP loop around BLAS calls would oversubscribe the cores.
// BLAS takes 32-bit sizes; anything larger is reported unsupported rather than
// silently truncated. GemmAccParams is GemmParams here (Acc is the element
// type for fp32 and fp64) and forwards to it.
#include "kernels/gemm/gemm.h"

#include <cblas.h>

#include <climits>
#include <type_traits>

#include "kernels/cpu_common.h"
#include "kernels/gemm/blas_core.h"
#include "kernels/gemm/gemm_check.h"

namespace weft::kernels {
namespace {

// The shared rules (gemm_check.h), then BLAS's 32-bit sizes.
template <typename Elem>
Status check(const GemmParams<Elem>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc})
    if (v > INT_MAX) return Status::unsupported;
  return Status::ok;
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  blas_core();
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double* a, int lda, const double* b, int ldb, double beta, double* c,
               int ldc) {
  blas_core();
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C = beta * C for k = 0, where BLAS implementations differ on whether they
// touch C at all; beta = 0 overwrites so NaN does not survive.
template <typename Elem>
void scale_c(const GemmParams<Elem>& p, Elem* c) {
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j)
      c[i * p.ldc + j] = p.beta == Elem(0) ? Elem(0) : p.beta * c[i * p.ldc + j];
}

}  // namespace

template <typename Elem>
bool supports(const GemmParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const GemmParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const GemmParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(check(p), 0, ws, stream); s != Status::ok) return s;
  if (p.m == 0 || p.n == 0) return Status::ok;
  const CBLAS_TRANSPOSE ta = p.trans_a == Trans::yes ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = p.trans_b == Trans::yes ? CblasTrans : CblasNoTrans;
  for (int64_t i = 0; i < p.batch; ++i) {
    Elem* c = p.c + i * p.stride_c;
    if (p.k == 0) {
      scale_c(p, c);
      continue;
    }
    blas_gemm(ta, tb, static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), p.alpha,
              p.a + i * p.stride_a, static_cast<int>(p.lda), p.b + i * p.stride_b,
              static_cast<int>(p.ldb), p.beta, c, static_cast<int>(p.ldc));
  }
  return Status::ok;
}

namespace {

template <typename Elem>
GemmParams<Elem> as_gemm(const GemmAccParams<Elem>& p) {
  static_assert(std::is_same_v<Acc<Elem>, Elem>);
  return {.trans_a = p.trans_a, .trans_b = p.trans_b, .m = p.m, .n = p.n, .k = p.k,
          .alpha = p.alpha, .beta = p.beta, .a = p.a, .lda = p.lda, .b = p.b, .ldb = p.ldb,
          .c = p.c, .ldc = p.ldc, .batch = p.batch, .stride_a = p.stride_a,
          .stride_b = p.stride_b, .stride_c = p.stride_c};
}

}  // namespace

template <typename Elem>
bool supports(const GemmAccParams<Elem>& p, Backend backend) {
  return supports(as_gemm(p), backend);
}

template <typename Elem>
int64_t workspace_bytes(const GemmAccParams<Elem>& p, Backend backend) {
  return workspace_bytes(as_gemm(p), backend);
}

template <typename Elem>
Status launch(const GemmAccParams<Elem>& p, Workspace ws, Stream stream) {
  return launch(as_gemm(p), ws, stream);
}

// Grouped: each entry in turn, every one checked before any runs.
namespace {

template <typename Elem>
const GemmParams<Elem>& as_gemm(const GemmParams<Elem>& p) {
  return p;
}

template <typename P>
Status grouped_cpu_check(const P& p) {
  Status s = grouped_check(p);
  for (int64_t i = 0; s == Status::ok && i < p.count; ++i) s = check(as_gemm(p.gemms[i]));
  return s;
}

template <typename P>
Status grouped_launch(const P& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(grouped_cpu_check(p), 0, ws, stream); s != Status::ok) return s;
  for (int64_t i = 0; i < p.count; ++i)
    if (Status s = launch(as_gemm(p.gemms[i]), ws, stream); s != Status::ok) return s;
  return Status::ok;
}

}  // namespace

template <typename Elem>
bool supports(const GroupedGemmParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && grouped_cpu_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const GroupedGemmParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const GroupedGemmParams<Elem>& p, Workspace ws, Stream stream) {
  return grouped_launch(p, ws, stream);
}

template <typename Elem>
bool supports(const GroupedGemmAccParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && grouped_cpu_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const GroupedGemmAccParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const GroupedGemmAccParams<Elem>& p, Workspace ws, Stream stream) {
  return grouped_launch(p, ws, stream);
}

WEFT_CPU_INSTANTIATE(GemmParams)
WEFT_CPU_INSTANTIATE(GemmAccParams)
WEFT_CPU_INSTANTIATE(GroupedGemmParams)
WEFT_CPU_INSTANTIATE(GroupedGemmAccParams)

}  // namespace weft::kernels
