// The arena: every tensor of a run is allocated here, under a memory category,
// so that the run can print its measured peak per category beside the memory
// model's prediction. A capacity makes the arena refuse, with a typed error,
// any allocation past what was reserved: the tuner reserves the predicted
// peak up front, so a layout that does not fit fails before any collective.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "memory/shapes.h"

namespace weft::memory {

// An allocation the arena's capacity (or the device) refused.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// Where the bytes come from: host memory here; device memory in the CUDA
// backend behind the same interface.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(int64_t bytes) = 0;  // nullptr when it cannot
  virtual void deallocate(void* p) = 0;
  virtual const char* name() const = 0;
};

// 64-byte aligned, zero-filled host memory.
std::unique_ptr<Allocator> host_allocator();

class Arena {
 public:
  // capacity 0: limited only by the allocator.
  explicit Arena(std::unique_ptr<Allocator> allocator = host_allocator(), int64_t capacity = 0);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Throws OutOfMemory naming the tensor, its category, the bytes asked and
  // what is in use when the capacity or the allocator refuses.
  void* allocate(Category c, int64_t bytes, const std::string& name);
  template <typename T>
  T* allocate_as(Category c, int64_t elements, const std::string& name) {
    return static_cast<T*>(allocate(c, elements * int64_t(sizeof(T)), name));
  }
  void release(void* p);

  int64_t in_use(Category c) const { return current_[size_t(c)]; }
  int64_t peak(Category c) const { return peak_[size_t(c)]; }
  std::array<int64_t, kCategories> peaks() const { return peak_; }
  int64_t in_use_total() const { return total_; }
  int64_t peak_total() const { return peak_total_; }
  int64_t capacity() const { return capacity_; }

 private:
  struct Block {
    Category category;
    int64_t bytes;
  };
  std::unique_ptr<Allocator> allocator_;
  int64_t capacity_;
  std::unordered_map<void*, Block> blocks_;
  std::array<int64_t, kCategories> current_{}, peak_{};
  int64_t total_ = 0, peak_total_ = 0;
};

}  // namespace weft::memory
