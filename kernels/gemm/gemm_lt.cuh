// cuBLASLt's handle and scratch conventions, shared by the GEMMs that call it
// (kernels/gemm/gemm.cu, kernels/fp8/fp8_gemm.cu). Included only by .cu files.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/kernel.h"

namespace weft::kernels::gpu {

// cuBLASLt's scratch: 32 MiB is what NVIDIA recommends for Hopper (4 MiB
// suffices on Ampere); the extra 256 bytes let the launch align it to 256.
constexpr int64_t kLtWorkspace = int64_t{32} << 20;
constexpr int64_t kLtAlign = 256;

// One cuBLASLt handle per device and thread, created on first use. It lives
// until the process ends: destroying it from a thread_local destructor could
// run after the CUDA runtime has shut down.
cublasLtHandle_t lt_handle(int device);

// One cuBLAS handle per thread and device, the same rule (a handle must not
// be driven from two threads at once, and creating one costs milliseconds),
// set to `stream`: the grouped GEMM's and the materialized attention's.
cublasHandle_t cublas_handle(cudaStream_t stream);

// The caller's workspace from its first 256-byte boundary, at most
// kLtWorkspace long (workspace_bytes asked for kLtWorkspace + kLtAlign).
struct LtScratch {
  void* data;
  int64_t bytes;
};
inline LtScratch lt_scratch(Workspace ws) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(ws.data);
  const uintptr_t aligned = (base + kLtAlign - 1) / kLtAlign * kLtAlign;
  const int64_t left = ws.bytes - int64_t(aligned - base);
  return {reinterpret_cast<void*>(aligned), left < kLtWorkspace ? left : kLtWorkspace};
}

// The largest power of two up to 256 dividing the address and, across a
// batch, the stride in bytes: the alignment cuBLASLt's heuristic is told.
inline uint32_t lt_alignment(const void* p, int64_t batch = 1, int64_t stride_bytes = 0) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | uint64_t(kLtAlign);
  if (batch > 1 && stride_bytes > 0) bits |= uint64_t(stride_bytes);
  return uint32_t(bits & (~bits + 1));
}

// A column-major matrix layout of rows x cols with leading dimension ld and,
// for batch > 1, a strided batch of that many.
inline cublasLtMatrixLayout_t lt_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                        int64_t batch = 1, int64_t stride = 0) {
  cublasLtMatrixLayout_t layout = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof count));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof stride));
  }
  return layout;
}

// Up to `most` (at most 16) algorithms the heuristic offers for op over
// layouts a, b and c (= d), best first by its own estimate, within ws_bytes
// of scratch and for operands of these alignments (bytes), into `out`;
// how many.
inline int lt_candidates(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, int64_t ws_bytes, uint32_t align_a,
                         uint32_t align_b, uint32_t align_c, int most, cublasLtMatmulAlgo_t* out) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_ws = uint64_t(ws_bytes);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                    sizeof max_ws));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                    sizeof align_a));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                    sizeof align_b));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                    sizeof align_c));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                    sizeof align_c));
  constexpr int kMost = 16;
  cublasLtMatmulHeuristicResult_t results[kMost] = {};
  if (most > kMost) most = kMost;
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, most, results, &found);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(status);
  int n = 0;
  if (status != CUBLAS_STATUS_SUCCESS) return n;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) out[n++] = results[i].algo;
  return n;
}

// The heuristic's first algorithm for op over layouts a, b and c (= d),
// within ws_bytes of scratch and for operands of these alignments (bytes);
// false when no algorithm fits (NOT_SUPPORTED: the params are valid but
// this backend cannot run them, which launch reports as unsupported).
inline bool lt_pick(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, int64_t ws_bytes, uint32_t align_a,
                    uint32_t align_b, uint32_t align_c, cublasLtMatmulAlgo_t* algo) {
  return lt_candidates(handle, op, a, b, c, ws_bytes, align_a, align_b, align_c, 1, algo) == 1;
}

}  // namespace weft::kernels::gpu
