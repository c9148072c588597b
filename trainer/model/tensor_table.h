// The tensors of one rank, allocated from the arena by the shape table
// (memory::stage_shapes), so that what the trainer holds is exactly what the
// memory model counts. Looked up by the table's names; a name the table lacks
// or an instance past its count is a bug and asserts.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/arena.h"
#include "memory/shapes.h"

namespace weft::trainer {

class TensorTable {
 public:
  // widen: element bytes of floating tensors are doubled (the float64
  // instantiation used by gradient checks); integer tensors keep theirs.
  TensorTable(const std::vector<memory::TensorShape>& shapes, memory::Arena& arena, bool widen);
  ~TensorTable();
  TensorTable(const TensorTable&) = delete;
  TensorTable& operator=(const TensorTable&) = delete;

  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  int64_t count(const std::string& name) const;
  int64_t elements(const std::string& name) const;
  int64_t bytes(const std::string& name) const;  // of one instance
  // Instance i of the tensor, viewed as T.
  template <typename T>
  T* get(const std::string& name, int64_t instance = 0) const {
    return static_cast<T*>(instance_ptr(name, instance, int64_t(sizeof(T))));
  }

 private:
  struct Entry {
    char* base;
    int64_t elements;
    int64_t element_bytes;
    int64_t count;
  };
  void* instance_ptr(const std::string& name, int64_t instance, int64_t elem_size) const;
  memory::Arena& arena_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace weft::trainer
