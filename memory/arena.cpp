#include "memory/arena.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/units.h"

namespace weft::memory {

namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(int64_t bytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment.
    const size_t size = size_t((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, size);
    if (p) std::memset(p, 0, size);
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  const char* name() const override { return "host"; }
};

}  // namespace

std::unique_ptr<Allocator> host_allocator() { return std::make_unique<HostAllocator>(); }

Arena::Arena(std::unique_ptr<Allocator> allocator, int64_t capacity)
    : allocator_(std::move(allocator)), capacity_(capacity) {}

Arena::~Arena() {
  for (auto& [p, b] : blocks_) allocator_->deallocate(p);
}

void* Arena::allocate(Category c, int64_t bytes, const std::string& name) {
  WEFT_ASSERT(bytes >= 0);
  if (capacity_ > 0 && total_ + bytes > capacity_)
    throw OutOfMemory(fmt::format("{} memory: {} for {} ({}) exceeds the reserved {} ({} in use)",
                                  allocator_->name(), format_bytes(double(bytes)), name,
                                  to_string(c), format_bytes(double(capacity_)),
                                  format_bytes(double(total_))));
  void* p = allocator_->allocate(bytes);
  if (!p)
    throw OutOfMemory(fmt::format("{} memory: allocating {} for {} ({}) failed with {} in use",
                                  allocator_->name(), format_bytes(double(bytes)), name,
                                  to_string(c), format_bytes(double(total_))));
  blocks_[p] = {c, bytes};
  current_[size_t(c)] += bytes;
  peak_[size_t(c)] = std::max(peak_[size_t(c)], current_[size_t(c)]);
  total_ += bytes;
  peak_total_ = std::max(peak_total_, total_);
  return p;
}

void Arena::release(void* p) {
  if (!p) return;
  auto it = blocks_.find(p);
  WEFT_ASSERT(it != blocks_.end());
  current_[size_t(it->second.category)] -= it->second.bytes;
  total_ -= it->second.bytes;
  allocator_->deallocate(p);
  blocks_.erase(it);
}

}  // namespace weft::memory
