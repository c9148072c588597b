// Error checks and stream plumbing of the CUDA backend for host code: the .cu
// kernel files (through kernels/cuda_common.cuh), the device allocator, the
// GPU tests and the GPU benchmarks. Exists only in CUDA builds; the public
// kernel headers stay free of CUDA.
//
// CUDA_CHECK and CUBLAS_CHECK follow WEFT_CALL_CHECK (trainer/parallel/comm.h):
// a describe function turns a status into "" or the library's text, and a
// failure throws naming the call, the file and the line. They name the device
// rather than the rank, since kernels sit below the layer that knows ranks.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "kernels/kernel.h"

namespace weft::kernels {

// The cudaStream_t a CUDA launch runs on (nullptr: the default stream).
inline cudaStream_t cuda_stream(Stream stream) { return static_cast<cudaStream_t>(stream.handle); }
inline Stream make_cuda_stream(cudaStream_t stream) { return Stream{Backend::cuda, stream}; }

namespace gpu {

// A failed call into the CUDA runtime or cuBLASLt, or a kernel that failed to
// launch or, under WEFT_SYNC_DEBUG=1, to run. After a kernel fault the device
// context is unusable; the process should report and end.
class CudaError : public Error {
 public:
  using Error::Error;
};

inline std::string describe(cudaError_t status) {
  if (status == cudaSuccess) return {};
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}
inline std::string describe(cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  return std::string(cublasLtGetStatusName(status)) + ": " + cublasLtGetStatusString(status);
}

// Throws CudaError "device D: LIB call CALL failed at FILE:LINE: WHAT".
[[noreturn]] void throw_call_error(const char* lib, const char* call, const std::string& what,
                                   const char* file, int line);

// WEFT_SYNC_DEBUG=1 in the environment (read once per process): every launch
// is followed by a synchronisation of its stream, so a faulting kernel is
// reported at its own launch instead of at some later call.
bool sync_debug();

// After each kernel launch (or library call that launches): the launch error,
// and under WEFT_SYNC_DEBUG=1 the kernel's own completion. A stream being
// captured into a graph is not synchronised (that would end the capture).
void launch_check(cudaStream_t stream, const char* what, const char* file, int line);

}  // namespace gpu
}  // namespace weft::kernels

#define WEFT_CUDA_CALL_CHECK(lib, call)                                                       \
  do {                                                                                        \
    const auto weft_cuda_status_ = (call);                                                    \
    const std::string weft_cuda_what_ = ::weft::kernels::gpu::describe(weft_cuda_status_);    \
    if (!weft_cuda_what_.empty())                                                             \
      ::weft::kernels::gpu::throw_call_error(lib, #call, weft_cuda_what_, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(call) WEFT_CUDA_CALL_CHECK("CUDA", call)
#define CUBLAS_CHECK(call) WEFT_CUDA_CALL_CHECK("cuBLASLt", call)
#define WEFT_LAUNCH_CHECK(stream, what) \
  ::weft::kernels::gpu::launch_check(stream, what, __FILE__, __LINE__)
