#include "trainer/model/tensor_table.h"

#include <fmt/format.h>

#include "core/error.h"

namespace weft::trainer {

namespace {

bool is_integer(const std::string& name) {
  return name == "embedding.tokens" || name == "loss.targets" || name == "layer.moe.experts";
}

}  // namespace

TensorTable::TensorTable(const std::vector<memory::TensorShape>& shapes, memory::Arena& arena,
                         bool widen)
    : arena_(arena) {
  for (const auto& s : shapes) {
    int64_t eb = s.element_bytes;
    // Byte-sized entries (GEMM workspace, runtime overhead) are raw bytes.
    if (widen && eb == 4 && !is_integer(s.name)) eb = 8;
    Entry e{nullptr, s.elements, eb, s.count};
    if (s.category != memory::Category::overhead)
      e.base = static_cast<char*>(arena.allocate(s.category, s.elements * eb * s.count, s.name));
    WEFT_ASSERT(entries_.emplace(s.name, e).second);
  }
}

TensorTable::~TensorTable() {
  for (auto& [name, e] : entries_) arena_.release(e.base);
}

int64_t TensorTable::count(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? 0 : it->second.count;
}

int64_t TensorTable::elements(const std::string& name) const {
  auto it = entries_.find(name);
  WEFT_ASSERT(it != entries_.end());
  return it->second.elements;
}

int64_t TensorTable::bytes(const std::string& name) const {
  auto it = entries_.find(name);
  WEFT_ASSERT(it != entries_.end());
  return it->second.elements * it->second.element_bytes;
}

void* TensorTable::instance_ptr(const std::string& name, int64_t instance, int64_t elem_size) const {
  auto it = entries_.find(name);
  if (it == entries_.end())
    throw InternalError(fmt::format("tensor '{}' is not in the shape table", name));
  const Entry& e = it->second;
  if (instance < 0 || instance >= e.count)
    throw InternalError(fmt::format("tensor '{}' instance {} of {}", name, instance, e.count));
  // Raw-byte entries may be viewed as any type and any entry as bytes;
  // typed views must match the element size.
  WEFT_ASSERT(e.element_bytes == 1 || elem_size == 1 || e.element_bytes == elem_size);
  return e.base + instance * e.elements * e.element_bytes;
}

}  // namespace weft::trainer
