// The arena's device allocator and the device services of memory/device.h in
// CUDA builds.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda_check.h"
#include "memory/arena.h"
#include "memory/device.h"

namespace weft::memory {
namespace {

class DeviceAllocator final : public Allocator {
 public:
  void* allocate(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, size_t(bytes < 1 ? 1 : bytes));
    if (status == cudaErrorMemoryAllocation) {
      // A full device is an answer, not a fault: clear the error so that the
      // next launch check does not report it, and refuse.
      (void)cudaGetLastError();
      return nullptr;
    }
    CUDA_CHECK(status);
    fill_zero(p, bytes);
    return p;
  }

  // Called from the arena's destructor, so it must not throw; a failure here
  // (a device already lost) leaves nothing to recover.
  void deallocate(void* p) override { (void)cudaFree(p); }

  // On the legacy default stream, then waited for: the arena hands the memory
  // to whatever stream comes next, which must see zeros.
  void fill_zero(void* p, int64_t bytes) override {
    if (bytes <= 0) return;
    CUDA_CHECK(cudaMemsetAsync(p, 0, size_t(bytes), cudaStreamLegacy));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }

  const char* name() const override { return "device"; }
};

}  // namespace

std::unique_ptr<Allocator> device_allocator() { return std::make_unique<DeviceAllocator>(); }

void copy(void* dst, const void* src, int64_t bytes, kernels::Stream stream) {
  if (bytes <= 0) return;
  if (stream.backend == kernels::Backend::cpu) {
    std::memcpy(dst, src, size_t(bytes));
    return;
  }
  CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDefault,
                             static_cast<cudaStream_t>(stream.handle)));
}

void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width, int64_t rows,
             kernels::Stream stream) {
  if (width <= 0 || rows <= 0) return;
  if (stream.backend == kernels::Backend::cpu) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                  size_t(width));
    return;
  }
  CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(dst_pitch), src, size_t(src_pitch), size_t(width), size_t(rows),
                               cudaMemcpyDefault, static_cast<cudaStream_t>(stream.handle)));
}

void synchronize(kernels::Stream stream) {
  if (stream.backend == kernels::Backend::cuda)
    CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
}

OwnedStream::OwnedStream(kernels::Backend backend) : stream_{backend, nullptr} {
  if (backend != kernels::Backend::cuda) return;
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_.handle = s;
}

OwnedStream::~OwnedStream() {
  if (stream_.handle) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
}

HostStaging::HostStaging(int64_t bytes, int slots, kernels::Backend backend)
    : backend_(backend), bytes_(bytes), events_(size_t(slots), nullptr) {
  for (int i = 0; i < slots; ++i) {
    void* p = nullptr;
    if (backend == kernels::Backend::cuda)
      CUDA_CHECK(cudaHostAlloc(&p, size_t(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault));
    else
      p = std::malloc(size_t(std::max<int64_t>(bytes, 1)));
    buffers_.push_back(p);
  }
}

HostStaging::~HostStaging() {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (events_[i]) {
      (void)cudaEventSynchronize(static_cast<cudaEvent_t>(events_[i]));
      (void)cudaEventDestroy(static_cast<cudaEvent_t>(events_[i]));
    }
    if (backend_ == kernels::Backend::cuda)
      (void)cudaFreeHost(buffers_[i]);
    else
      std::free(buffers_[i]);
  }
}

void* HostStaging::take() {
  current_ = next_;
  next_ = (next_ + 1) % int(buffers_.size());
  if (void* e = events_[size_t(current_)]) CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  return buffers_[size_t(current_)];
}

void HostStaging::queued(kernels::Stream stream) {
  if (backend_ != kernels::Backend::cuda || current_ < 0) return;
  void*& e = events_[size_t(current_)];
  if (!e) {
    cudaEvent_t ev = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e = ev;
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(stream.handle)));
}

void* record_event(kernels::Stream stream) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));
  CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream.handle)));
  return e;
}

// Used from destructors at exit too: reports nothing rather than throw.
double seconds_between(void* start, void* stop) {
  float ms = 0;
  if (cudaEventSynchronize(static_cast<cudaEvent_t>(stop)) != cudaSuccess ||
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return ms / 1e3;
}

void release_event(void* event) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

namespace {

// The few NVML declarations device_process_bytes needs (nvml.h's C ABI; the
// header is not part of every CUDA toolkit): the process record of the
// _v2/_v3 queries, and the entry points, looked up by name.
struct NvmlProcess {
  unsigned int pid;
  unsigned long long used_bytes;
  unsigned int gpu_instance, compute_instance;
};
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlByBusId = int (*)(const char*, NvmlDevice*);
using NvmlProcesses = int (*)(NvmlDevice, unsigned int*, NvmlProcess*);

}  // namespace

int64_t device_process_bytes() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return -1;
  int64_t bytes = -1;
  const auto init = reinterpret_cast<NvmlInit>(dlsym(lib, "nvmlInit_v2"));
  const auto shutdown = reinterpret_cast<NvmlShutdown>(dlsym(lib, "nvmlShutdown"));
  const auto by_bus_id = reinterpret_cast<NvmlByBusId>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto processes = reinterpret_cast<NvmlProcesses>(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  if (!processes) processes = reinterpret_cast<NvmlProcesses>(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2"));
  int device = 0;
  char bus_id[32] = {};
  if (init && shutdown && by_bus_id && processes && cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetPCIBusId(bus_id, int(sizeof bus_id), device) == cudaSuccess && init() == 0) {
    NvmlDevice handle = nullptr;
    NvmlProcess found[64] = {};
    unsigned int count = 64;
    if (by_bus_id(bus_id, &handle) == 0 && processes(handle, &count, found) == 0) {
      const unsigned int me = unsigned(getpid());
      for (unsigned int i = 0; i < count && i < 64; ++i)
        // NVML_VALUE_NOT_AVAILABLE (all ones) where the driver keeps no count.
        if (found[i].pid == me && found[i].used_bytes != ~0ull) bytes = int64_t(found[i].used_bytes);
    }
    shutdown();
  }
  (void)cudaGetLastError();
  dlclose(lib);
  return bytes;
}

DeviceMemory device_memory() {
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return {int64_t(total), int64_t(free)};
}

}  // namespace weft::memory
