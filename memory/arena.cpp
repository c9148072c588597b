#include "memory/arena.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#include "core/units.h"

namespace weft::memory {

namespace {

constexpr int64_t kAlign = 64;

// The size a request occupies: at least one byte, so that every allocation
// has its own address, rounded up to the alignment.
int64_t aligned_size(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }

class HostAllocator final : public Allocator {
 public:
  void* allocate(int64_t bytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment.
    const size_t size = size_t(aligned_size(bytes));
    void* p = std::aligned_alloc(kAlign, size);
    if (p) std::memset(p, 0, size);
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  const char* name() const override { return "host"; }
};

class LimitedAllocator final : public Allocator {
 public:
  LimitedAllocator(int64_t limit, std::unique_ptr<Allocator> inner)
      : limit_(limit), inner_(std::move(inner)) {}
  void* allocate(int64_t bytes) override { return bytes > limit_ ? nullptr : inner_->allocate(bytes); }
  void deallocate(void* p) override { inner_->deallocate(p); }
  void fill_zero(void* p, int64_t bytes) override { inner_->fill_zero(p, bytes); }
  const char* name() const override { return inner_->name(); }

 private:
  int64_t limit_;
  std::unique_ptr<Allocator> inner_;
};

}  // namespace

void Allocator::fill_zero(void* p, int64_t bytes) { std::memset(p, 0, size_t(bytes)); }

std::unique_ptr<Allocator> host_allocator() { return std::make_unique<HostAllocator>(); }

std::unique_ptr<Allocator> limited_allocator(int64_t limit, std::unique_ptr<Allocator> inner) {
  WEFT_ASSERT(limit >= 0 && inner);
  return std::make_unique<LimitedAllocator>(limit, std::move(inner));
}

Arena::Arena(std::unique_ptr<Allocator> allocator, int64_t capacity)
    : allocator_(std::move(allocator)), capacity_(capacity) {}

Arena::~Arena() {
  if (base_) {
    allocator_->deallocate(base_);
    return;
  }
  for (auto& [p, b] : blocks_) allocator_->deallocate(p);
}

void Arena::reserve(int64_t bytes) {
  WEFT_ASSERT(bytes > 0);
  WEFT_ASSERT(base_ == nullptr && blocks_.empty());
  void* p = allocator_->allocate(bytes);
  if (!p)
    throw OutOfMemory(fmt::format("{} memory: reserving {} ({} bytes) up front failed", allocator_->name(),
                                  format_bytes(double(bytes)), bytes));
  WEFT_ASSERT(reinterpret_cast<uintptr_t>(p) % kAlign == 0);
  base_ = static_cast<char*>(p);
  // Only whole aligned pieces are handed out, so a tail below the alignment is never used.
  reserved_ = bytes;
  free_.clear();
  if (bytes >= kAlign) free_.emplace(0, bytes / kAlign * kAlign);
}

int64_t Arena::largest_free() const {
  int64_t m = 0;
  for (const auto& [offset, size] : free_) m = std::max(m, size);
  return m;
}

void* Arena::carve(int64_t size) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const auto [offset, free_size] = *it;
    if (free_size < size) continue;
    free_.erase(it);
    if (free_size > size) free_.emplace(offset + size, free_size - size);
    char* p = base_ + offset;
    allocator_->fill_zero(p, size);
    return p;
  }
  return nullptr;
}

void Arena::give_back(char* p, int64_t size) {
  int64_t offset = p - base_;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_.emplace_hint(next, offset, size);
}

void* Arena::allocate(Category c, int64_t bytes, const std::string& name) {
  WEFT_ASSERT(bytes >= 0);
  if (capacity_ > 0 && total_ + bytes > capacity_)
    throw OutOfMemory(fmt::format("{} memory: {} for {} ({}) exceeds the reserved {} ({} in use)",
                                  allocator_->name(), format_bytes(double(bytes)), name,
                                  to_string(c), format_bytes(double(capacity_)),
                                  format_bytes(double(total_))));
  void* p = nullptr;
  if (base_) {
    // The size check first keeps the rounding from overflowing on absurd requests.
    if (bytes <= reserved_) p = carve(aligned_size(bytes));
    if (!p)
      throw OutOfMemory(fmt::format(
          "{} memory: {} for {} ({}) does not fit the reserved {} ({} in use, largest free piece {})",
          allocator_->name(), format_bytes(double(bytes)), name, to_string(c),
          format_bytes(double(reserved_)), format_bytes(double(total_)),
          format_bytes(double(largest_free()))));
  } else {
    p = allocator_->allocate(bytes);
    if (!p)
      throw OutOfMemory(fmt::format("{} memory: allocating {} for {} ({}) failed with {} in use",
                                    allocator_->name(), format_bytes(double(bytes)), name,
                                    to_string(c), format_bytes(double(total_))));
  }
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
  if (base_)
    give_back(static_cast<char*>(p), aligned_size(it->second.bytes));
  else
    allocator_->deallocate(p);
  blocks_.erase(it);
}

}  // namespace weft::memory
