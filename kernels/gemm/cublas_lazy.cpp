// The cuBLAS and cuBLASLt entry points weft calls, each opening its library
// on first use (kernels/lazy_library.h says why). Every call forwards to the
// library's own function of the same name and signature, taken with dlsym
// once; a function weft starts to call is added here, or the link fails
// with its name undefined.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <string>

#include "kernels/lazy_library.h"

namespace weft::kernels {
namespace {

#define WEFT_STR2(x) #x
#define WEFT_STR(x) WEFT_STR2(x)

constexpr const char* kHint =
    "It ships with the CUDA toolkit (lib64/) and with the nvidia-cublas wheel; put the folder that holds it on "
    "LD_LIBRARY_PATH.";

LazyLibrary& cublas_lt() {
  static LazyLibrary lib("cuBLASLt", {"libcublasLt.so." WEFT_STR(CUBLAS_VER_MAJOR), WEFT_CUBLASLT_FILE}, kHint);
  return lib;
}

LazyLibrary& cublas() {
  static LazyLibrary lib("cuBLAS", {"libcublas.so." WEFT_STR(CUBLAS_VER_MAJOR), WEFT_CUBLAS_FILE}, kHint);
  return lib;
}

}  // namespace

bool cublas_loaded() { return cublas_lt().loaded() || cublas().loaded(); }

}  // namespace weft::kernels

// `name` (returning `ret`), looked up in `lib` on its first call; the
// definition forwards its arguments.
#define WEFT_FORWARD(lib, ret, name, params, args)                                             \
  extern "C" ret name params {                                                                  \
    static const auto real = reinterpret_cast<ret(*) params>(weft::kernels::lib().symbol(#name)); \
    return real args;                                                                           \
  }

WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle))
WEFT_FORWARD(cublas_lt, const char*, cublasLtGetStatusName, (cublasStatus_t status), (status))
WEFT_FORWARD(cublas_lt, const char*, cublasLtGetStatusString, (cublasStatus_t status), (status))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmulDescCreate,
             (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale), (desc, compute, scale))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmulDescSetAttribute,
             (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes),
             (desc, attr, buf, bytes))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatrixLayoutCreate,
             (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
             (layout, type, rows, cols, ld))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
             (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t bytes),
             (layout, attr, buf, bytes))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
             (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
              size_t bytes),
             (pref, attr, buf, bytes))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
              cublasLtMatmulHeuristicResult_t results[], int* returned),
             (handle, desc, a, b, c, d, pref, requested, results, returned))
WEFT_FORWARD(cublas_lt, cublasStatus_t, cublasLtMatmul,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta, const void* C,
              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo,
              void* workspace, size_t workspace_bytes, cudaStream_t stream),
             (handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace, workspace_bytes, stream))

WEFT_FORWARD(cublas, cublasStatus_t, cublasCreate_v2, (cublasHandle_t * handle), (handle))
WEFT_FORWARD(cublas, cublasStatus_t, cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
WEFT_FORWARD(cublas, cublasStatus_t, cublasGemmBatchedEx,
             (cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
              const void* alpha, const void* const A[], cudaDataType a_type, int lda, const void* const B[],
              cudaDataType b_type, int ldb, const void* beta, void* const C[], cudaDataType c_type, int ldc,
              int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo),
             (handle, ta, tb, m, n, k, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type, ldc, batch, compute,
              algo))
WEFT_FORWARD(cublas, cublasStatus_t, cublasGemmGroupedBatchedEx_64,
             (cublasHandle_t handle, const cublasOperation_t ta[], const cublasOperation_t tb[], const int64_t m[],
              const int64_t n[], const int64_t k[], const void* alpha, const void* const A[], cudaDataType a_type,
              const int64_t lda[], const void* const B[], cudaDataType b_type, const int64_t ldb[],
              const void* beta, void* const C[], cudaDataType c_type, const int64_t ldc[], int64_t groups,
              const int64_t group_size[], cublasComputeType_t compute),
             (handle, ta, tb, m, n, k, alpha, A, a_type, lda, B, b_type, ldb, beta, C, c_type, ldc, groups,
              group_size, compute))
