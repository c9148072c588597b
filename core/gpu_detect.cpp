// gpu_detect with the CUDA runtime (built only with CUDA; device_spec.cpp
// answers "no GPU" otherwise).
#include <cuda_runtime.h>

#include <fmt/format.h>

#include "core/device_spec.h"
#include "core/error.h"

namespace weft {

std::optional<DeviceSpec> gpu_detect(int ordinal) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || ordinal < 0 || ordinal >= count) {
    cudaGetLastError();  // a machine without a driver is not an error here
    return std::nullopt;
  }
  // A failed query must not stay behind as the runtime's last error, which
  // the first kernel launch would report as its own.
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  GpuProperties p;
  p.name = prop.name;
  p.memory_bytes = int64_t(prop.totalGlobalMem);
  p.sm_count = prop.multiProcessorCount;
  p.compute_major = prop.major;
  p.compute_minor = prop.minor;
  p.memory_bus_bits = prop.memoryBusWidth;
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, ordinal) == cudaSuccess) p.clock_hz = khz * 1e3;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, ordinal) == cudaSuccess) p.memory_clock_hz = khz * 1e3;
  cudaGetLastError();  // either attribute may be missing; the preset's values stand in
  return device_from_gpu(p);
}

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void gpu_select(int ordinal) {
  const int count = gpu_count();
  if (ordinal < 0 || ordinal >= count || cudaSetDevice(ordinal) != cudaSuccess) {
    cudaGetLastError();
    throw InputError(fmt::format("GPU {} cannot be used: this machine has {} (valid: 0..{})", ordinal,
                                 count, count - 1));
  }
}

}  // namespace weft
