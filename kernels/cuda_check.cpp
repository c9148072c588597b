#include "kernels/cuda_check.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace weft::kernels::gpu {

void throw_call_error(const char* lib, const char* call, const std::string& what, const char* file,
                      int line) {
  int device = -1;
  // The device is context for the message only; a failure to read it must not
  // replace the error being reported.
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  throw CudaError(fmt::format("device {}: {} call {} failed at {}:{}: {}", device, lib, call, file,
                              line, what));
}

bool sync_debug() {
  static const bool on = [] {
    const char* v = std::getenv("WEFT_SYNC_DEBUG");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void launch_check(cudaStream_t stream, const char* what, const char* file, int line) {
  if (const std::string e = describe(cudaGetLastError()); !e.empty())
    throw_call_error("CUDA", what, e, file, line);
  if (!sync_debug()) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const std::string e = describe(cudaStreamIsCapturing(stream, &capture)); !e.empty())
    throw_call_error("CUDA", what, e, file, line);
  if (capture != cudaStreamCaptureStatusNone) return;
  if (const std::string e = describe(cudaStreamSynchronize(stream)); !e.empty())
    throw_call_error("CUDA", what, "(WEFT_SYNC_DEBUG=1, at the kernel's completion) " + e, file,
                     line);
}

}  // namespace weft::kernels::gpu
