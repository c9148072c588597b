// The arena's device allocator in CUDA builds.
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "memory/arena.h"

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

}  // namespace weft::memory
