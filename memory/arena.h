// The arena: every tensor of a run is allocated here, under a memory category,
// so that the run can print its measured peak per category beside the memory
// model's prediction. A capacity makes the arena refuse, with a typed error,
// any allocation past what was reserved: the tuner reserves the predicted
// peak up front, so a layout that does not fit fails before any collective.
//
// reserve() goes further and takes the whole budget from the allocator in one
// block before the first tensor; every later allocation is carved from that
// block (first fit, 64-byte aligned, freed pieces coalesced). A trial then
// either gets all its memory at once or fails at once, and the device
// allocator is never asked for memory in the middle of a step.
#pragma once

#include <array>
#include <cstdint>
#include <map>
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
// backend behind the same interface. Memory it hands out is 64-byte aligned.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(int64_t bytes) = 0;  // nullptr when it cannot
  virtual void deallocate(void* p) = 0;
  // Sets `bytes` bytes at `p` (memory this allocator handed out) to zero; the
  // arena zero-fills pieces it carves from a reservation through this, since
  // only the allocator knows whether the memory is host or device. The default
  // is for host memory; a device allocator overrides it.
  virtual void fill_zero(void* p, int64_t bytes);
  virtual const char* name() const = 0;
};

// 64-byte aligned, zero-filled host memory.
std::unique_ptr<Allocator> host_allocator();

// Zero-filled memory of the current CUDA device (cudaMalloc, 256-byte
// aligned; cudaFree; fill_zero through cudaMemset, complete when it returns).
// It exists in every build; in a build without CUDA it refuses every
// allocation, so an arena over it fails with an OutOfMemory that says so.
std::unique_ptr<Allocator> device_allocator();

// Forwards to `inner` but refuses (returns nullptr for) any single allocation
// of more than `limit` bytes: tests use it to make a reservation fail the way
// a full device would.
std::unique_ptr<Allocator> limited_allocator(int64_t limit, std::unique_ptr<Allocator> inner);

class Arena {
 public:
  // capacity 0: limited only by the allocator.
  explicit Arena(std::unique_ptr<Allocator> allocator = host_allocator(), int64_t capacity = 0);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Takes one block of `bytes` from the allocator now; every later allocate()
  // is carved from it. Throws OutOfMemory naming `bytes` when the allocator
  // refuses, leaving the arena as it was. Only on an arena that has no
  // reservation yet and nothing allocated.
  void reserve(int64_t bytes);

  // Throws OutOfMemory naming the tensor, its category, the bytes asked and
  // what is in use when the capacity, the reservation or the allocator
  // refuses. The memory is zero-filled.
  void* allocate(Category c, int64_t bytes, const std::string& name);
  template <typename T>
  T* allocate_as(Category c, int64_t elements, const std::string& name) {
    return static_cast<T*>(allocate(c, elements * int64_t(sizeof(T)), name));
  }
  void release(void* p);

  // Accounting counts the bytes asked, not the 64-byte rounding, with or
  // without a reservation, so peaks compare directly with the memory model.
  int64_t in_use(Category c) const { return current_[size_t(c)]; }
  int64_t peak(Category c) const { return peak_[size_t(c)]; }
  std::array<int64_t, kCategories> peaks() const { return peak_; }
  int64_t in_use_total() const { return total_; }
  int64_t peak_total() const { return peak_total_; }
  int64_t capacity() const { return capacity_; }
  int64_t reserved() const { return reserved_; }  // 0 without a reservation
  // The largest piece of the reservation still free (0 without one).
  int64_t largest_free() const;

 private:
  struct Block {
    Category category;
    int64_t bytes;
  };
  void* carve(int64_t size);  // from the reservation; nullptr when no free piece fits
  void give_back(char* p, int64_t size);

  std::unique_ptr<Allocator> allocator_;
  int64_t capacity_;
  std::unordered_map<void*, Block> blocks_;
  std::array<int64_t, kCategories> current_{}, peak_{};
  int64_t total_ = 0, peak_total_ = 0;
  // The reservation: one allocator block, and its free pieces as offset -> size,
  // ordered by offset so that neighbours can be merged on release.
  char* base_ = nullptr;
  int64_t reserved_ = 0;
  std::map<int64_t, int64_t> free_;
};

}  // namespace weft::memory
