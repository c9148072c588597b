// The arena's device allocator in builds without CUDA: it refuses every
// allocation, and its name tells the reader of the OutOfMemory why. The
// device services of memory/device.h serve the CPU backend only.
#include <cstdlib>
#include <cstring>
#include <string>

#include "memory/arena.h"
#include "memory/device.h"

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

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw InternalError(std::string(what) + " on a CUDA stream, in a build without CUDA");
}
}  // namespace

void copy(void* dst, const void* src, int64_t bytes, kernels::Stream stream) {
  if (stream.backend != kernels::Backend::cpu) no_cuda("memory::copy");
  if (bytes > 0) std::memcpy(dst, src, size_t(bytes));
}

void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width, int64_t rows,
             kernels::Stream stream) {
  if (stream.backend != kernels::Backend::cpu) no_cuda("memory::copy_2d");
  if (width <= 0) return;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                size_t(width));
}

void synchronize(kernels::Stream stream) {
  if (stream.backend != kernels::Backend::cpu) no_cuda("memory::synchronize");
}

OwnedStream::OwnedStream(kernels::Backend backend) : stream_{backend, nullptr} {
  if (backend != kernels::Backend::cpu) no_cuda("memory::OwnedStream");
}
OwnedStream::~OwnedStream() = default;

DeviceMemory device_memory() { no_cuda("memory::device_memory"); }

int64_t device_process_bytes() { return -1; }

void* record_event(kernels::Stream) { no_cuda("memory::record_event"); }

HostStaging::HostStaging(int64_t bytes, int slots, kernels::Backend backend) : backend_(backend), bytes_(bytes) {
  if (backend != kernels::Backend::cpu) no_cuda("memory::HostStaging");
  for (int i = 0; i < slots; ++i) buffers_.push_back(std::malloc(size_t(bytes > 0 ? bytes : 1)));
  events_.assign(size_t(slots), nullptr);
}
HostStaging::~HostStaging() {
  for (void* p : buffers_) std::free(p);
}
void* HostStaging::take() {
  current_ = next_;
  next_ = (next_ + 1) % int(buffers_.size());
  return buffers_[size_t(current_)];
}
void HostStaging::queued(kernels::Stream) {}
double seconds_between(void*, void*) { return 0; }
void release_event(void*) {}

}  // namespace weft::memory
