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

namespace weft::kernels {
namespace {

template <typename Elem>
Status check(const GemmParams<Elem>& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0 || p.batch < 1) return Status::invalid_argument;
  if (p.stride_a < 0 || p.stride_b < 0 || p.stride_c < 0) return Status::invalid_argument;
  const int64_t a_cols = p.trans_a == Trans::no ? p.k : p.m;
  const int64_t b_cols = p.trans_b == Trans::no ? p.n : p.k;
  if (p.lda < std::max<int64_t>(1, a_cols) || p.ldb < std::max<int64_t>(1, b_cols) ||
      p.ldc < std::max<int64_t>(1, p.n))
    return Status::invalid_argument;
  const bool empty_c = p.m == 0 || p.n == 0;
  const bool empty_ab = empty_c || p.k == 0;
  if (!empty_c && p.c == nullptr) return Status::invalid_argument;
  if (!empty_ab && (p.a == nullptr || p.b == nullptr)) return Status::invalid_argument;
  if (p.batch > 1 && !empty_c && p.stride_c < (p.m - 1) * p.ldc + p.n) return Status::invalid_argument;
  for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc})
    if (v > INT_MAX) return Status::unsupported;
  return Status::ok;
}

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
               const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
               const double* a, int lda, const double* b, int ldb, double beta, double* c,
               int ldc) {
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

WEFT_CPU_INSTANTIATE(GemmParams)
WEFT_CPU_INSTANTIATE(GemmAccParams)

}  // namespace weft::kernels
