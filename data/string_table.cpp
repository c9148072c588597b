#include "data/string_table.h"

#include <cstring>
#include <functional>

#include "core/error.h"

namespace weft::data {

namespace {

constexpr size_t kInitialSlots = 64;

}  // namespace

uint64_t StringTable::hash_of(std::string_view key) {
  return std::hash<std::string_view>{}(key) | 1;
}

void StringTable::clear() {
  if (slots_.empty())
    slots_.resize(kInitialSlots);
  else
    std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  size_ = 0;
}

const uint64_t* StringTable::find(std::string_view key) const {
  const uint64_t h = hash_of(key);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return nullptr;
    if (s.hash == h && s.bytes == key.size() &&
        std::memcmp(keys_.data() + s.offset, key.data(), key.size()) == 0)
      return &s.value;
  }
}

void StringTable::insert(std::string_view key, uint64_t value) {
  // At most half full, so probes stay short and an empty slot always exists.
  if (2 * (size_ + 1) > static_cast<int64_t>(slots_.size())) grow();
  const uint64_t h = hash_of(key);
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.hash == h && s.bytes == key.size() &&
        std::memcmp(keys_.data() + s.offset, key.data(), key.size()) == 0) {
      s.value = value;
      return;
    }
    if (s.hash != 0) continue;
    if (keys_.size() + key.size() > UINT32_MAX)
      throw InternalError("StringTable holds more than 4 GiB of keys");
    s = {h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size()), value};
    keys_.append(key);
    ++size_;
    return;
  }
}

void StringTable::grow() {
  std::vector<Slot> old(slots_.size() * 2);
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.hash == 0) continue;
    size_t i = s.hash & mask;
    while (slots_[i].hash != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

}  // namespace weft::data
