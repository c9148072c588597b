// cuBLASLt's handle and scratch conventions, shared by the GEMMs that call it
// (kernels/gemm/gemm.cu, kernels/fp8/fp8_gemm.cu). Included only by .cu files.
#pragma once

#include <cublasLt.h>

#include <cstdint>

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

}  // namespace weft::kernels::gpu
