// The arena's device allocator in builds without CUDA: it refuses every
// allocation, and its name tells the reader of the OutOfMemory why.
#include "memory/arena.h"

namespace weft::memory {
namespace {

class NoDeviceAllocator final : public Allocator {
 public:
  void* allocate(int64_t) override { return nullptr; }
  void deallocate(void*) override {}
  void fill_zero(void*, int64_t) override {}
  const char* name() const override { return "device (this build has no CUDA)"; }
};

}  // namespace

std::unique_ptr<Allocator> device_allocator() { return std::make_unique<NoDeviceAllocator>(); }

}  // namespace weft::memory
