#include "data/token_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"
#include "data/mapped_file.h"

namespace weft::data {

int64_t dtype_bytes(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::u8:
    case TokenDtype::i8:
      return 1;
    case TokenDtype::u16:
    case TokenDtype::i16:
      return 2;
    case TokenDtype::u32:
    case TokenDtype::i32:
      return 4;
    case TokenDtype::i64:
      return 8;
  }
  WEFT_ASSERT(false);
  return 0;
}

const char* dtype_name(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::u8:
      return "uint8";
    case TokenDtype::i8:
      return "int8";
    case TokenDtype::u16:
      return "uint16";
    case TokenDtype::i16:
      return "int16";
    case TokenDtype::u32:
      return "uint32";
    case TokenDtype::i32:
      return "int32";
    case TokenDtype::i64:
      return "int64";
  }
  WEFT_ASSERT(false);
  return "";
}

std::optional<BadToken> TokenSource::token_find_bad(int64_t vocab) const {
  for (int64_t i = 0, n = size(); i < n; ++i) {
    const int64_t t = token(i);
    if (t < 0 || t >= vocab) return BadToken{i, t};
  }
  return std::nullopt;
}

// ---- MappedTokenSource ------------------------------------------------------

namespace {

// The payload is read in place, so loads go through memcpy: the array may
// start at any offset (a .npy header is 64-byte aligned, but nothing promises
// that a foreign file keeps its payload aligned to the dtype).
template <typename T>
T load(const uint8_t* base, int64_t index) {
  T v;
  std::memcpy(&v, base + index * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <typename T>
void copy_as_int32(const uint8_t* base, int64_t start, int64_t count, int32_t* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(load<T>(base, start + i));
}

template <typename T>
std::optional<BadToken> find_bad(const uint8_t* base, int64_t count, int64_t vocab) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = static_cast<int64_t>(load<T>(base, i));
    if (t < 0 || t >= vocab) return BadToken{i, t};
  }
  return std::nullopt;
}

}  // namespace

MappedTokenSource::MappedTokenSource(std::shared_ptr<const MappedFile> file, std::string format,
                                     int64_t offset, TokenDtype dtype, int64_t count, int64_t vocab)
    : file_(std::move(file)),
      format_(std::move(format)),
      payload_(file_->data() + offset),
      dtype_(dtype),
      count_(count),
      vocab_(vocab) {
  WEFT_ASSERT(offset >= 0 && count >= 0 && offset + count * dtype_bytes(dtype) <= file_->size());
}

int64_t MappedTokenSource::token(int64_t index) const {
  WEFT_ASSERT(index >= 0 && index < count_);
  switch (dtype_) {
    case TokenDtype::u8:
      return payload_[index];
    case TokenDtype::i8:
      return load<int8_t>(payload_, index);
    case TokenDtype::u16:
      return load<uint16_t>(payload_, index);
    case TokenDtype::i16:
      return load<int16_t>(payload_, index);
    case TokenDtype::u32:
      return load<uint32_t>(payload_, index);
    case TokenDtype::i32:
      return load<int32_t>(payload_, index);
    case TokenDtype::i64:
      return load<int64_t>(payload_, index);
  }
  return 0;
}

void MappedTokenSource::tokens_copy(int64_t start, int64_t count, int32_t* out) const {
  WEFT_ASSERT(start >= 0 && count >= 0 && start + count <= count_);
  switch (dtype_) {
    case TokenDtype::u8:
      copy_as_int32<uint8_t>(payload_, start, count, out);
      break;
    case TokenDtype::i8:
      copy_as_int32<int8_t>(payload_, start, count, out);
      break;
    case TokenDtype::u16:
      copy_as_int32<uint16_t>(payload_, start, count, out);
      break;
    case TokenDtype::i16:
      copy_as_int32<int16_t>(payload_, start, count, out);
      break;
    case TokenDtype::u32:
      copy_as_int32<uint32_t>(payload_, start, count, out);
      break;
    case TokenDtype::i32:
      copy_as_int32<int32_t>(payload_, start, count, out);
      break;
    case TokenDtype::i64:
      copy_as_int32<int64_t>(payload_, start, count, out);
      break;
  }
}

std::optional<BadToken> MappedTokenSource::token_find_bad(int64_t vocab) const {
  switch (dtype_) {
    case TokenDtype::u8:
      return find_bad<uint8_t>(payload_, count_, vocab);
    case TokenDtype::i8:
      return find_bad<int8_t>(payload_, count_, vocab);
    case TokenDtype::u16:
      return find_bad<uint16_t>(payload_, count_, vocab);
    case TokenDtype::i16:
      return find_bad<int16_t>(payload_, count_, vocab);
    case TokenDtype::u32:
      return find_bad<uint32_t>(payload_, count_, vocab);
    case TokenDtype::i32:
      return find_bad<int32_t>(payload_, count_, vocab);
    case TokenDtype::i64:
      return find_bad<int64_t>(payload_, count_, vocab);
  }
  return std::nullopt;
}

std::string MappedTokenSource::describe() const {
  return fmt::format("{} '{}' ({}, {} tokens)", format_, file_->path(), dtype_name(dtype_), count_);
}

// ---- MemoryTokenSource ------------------------------------------------------

MemoryTokenSource::MemoryTokenSource(std::vector<int32_t> tokens, int64_t vocab, std::string name)
    : tokens_(std::move(tokens)), vocab_(vocab), name_(std::move(name)) {}

int64_t MemoryTokenSource::token(int64_t index) const {
  WEFT_ASSERT(index >= 0 && index < size());
  return tokens_[static_cast<size_t>(index)];
}

void MemoryTokenSource::tokens_copy(int64_t start, int64_t count, int32_t* out) const {
  WEFT_ASSERT(start >= 0 && count >= 0 && start + count <= size());
  std::copy_n(tokens_.begin() + start, count, out);
}

std::string MemoryTokenSource::describe() const {
  return fmt::format("{} ({} tokens)", name_, tokens_.size());
}

// ---- ConcatTokenSource ------------------------------------------------------

ConcatTokenSource::ConcatTokenSource(std::vector<std::unique_ptr<TokenSource>> parts)
    : parts_(std::move(parts)) {
  WEFT_ASSERT(!parts_.empty());
  starts_.push_back(0);
  for (const auto& p : parts_) {
    starts_.push_back(starts_.back() + p->size());
    vocab_ = std::max(vocab_, p->vocab());
  }
}

int64_t ConcatTokenSource::part_of(int64_t index) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), index);
  return static_cast<int64_t>(it - starts_.begin()) - 1;
}

int64_t ConcatTokenSource::token(int64_t index) const {
  WEFT_ASSERT(index >= 0 && index < size());
  const int64_t p = part_of(index);
  return parts_[static_cast<size_t>(p)]->token(index - starts_[static_cast<size_t>(p)]);
}

void ConcatTokenSource::tokens_copy(int64_t start, int64_t count, int32_t* out) const {
  WEFT_ASSERT(start >= 0 && count >= 0 && start + count <= size());
  // A window may straddle shards: copy piece by piece.
  while (count > 0) {
    const auto p = static_cast<size_t>(part_of(start));
    const int64_t local = start - starts_[p];
    const int64_t n = std::min(count, parts_[p]->size() - local);
    parts_[p]->tokens_copy(local, n, out);
    start += n;
    out += n;
    count -= n;
  }
}

std::optional<BadToken> ConcatTokenSource::token_find_bad(int64_t vocab) const {
  for (size_t p = 0; p < parts_.size(); ++p)
    if (auto bad = parts_[p]->token_find_bad(vocab)) {
      bad->position += starts_[p];
      return bad;
    }
  return std::nullopt;
}

std::string ConcatTokenSource::describe() const {
  if (parts_.size() == 1) return parts_[0]->describe();
  return fmt::format("{} shards from {} ({} tokens)", parts_.size(), parts_[0]->describe(), size());
}

// ---- scans ------------------------------------------------------------------

void validate_vocab(const TokenSource& source, int64_t vocab) {
  WEFT_ASSERT(vocab > 0);
  const auto bad = source.token_find_bad(vocab);
  if (!bad) return;
  if (bad->value < 0)
    throw InputError(
        fmt::format("token id {} at position {} of {} is negative; token ids must "
                    "be in [0, {}), the model's vocab",
                    bad->value, bad->position, source.describe(), vocab));
  throw InputError(fmt::format(
      "token id {} at position {} of {} is outside the model's vocab [0, {}); prepare the data "
      "with the model's tokenizer, or give the model a vocab above {} (--vocab sets a preset's)",
      bad->value, bad->position, source.describe(), vocab, bad->value));
}

namespace {

// How often each id occurs in `source`.
class UnigramCounts {
 public:
  explicit UnigramCounts(const TokenSource& source) : total_(source.size()) {
    // A dense histogram when the declared vocab is small (every prepared
    // dataset); a map otherwise, since foreign files may hold ids up to 2^32.
    const int64_t v = source.vocab();
    if (v > 0 && v <= (int64_t{1} << 24)) dense_.assign(static_cast<size_t>(v), 0);
    std::vector<int32_t> buf(1 << 16);
    for (int64_t start = 0; start < total_; start += static_cast<int64_t>(buf.size())) {
      const int64_t m = std::min<int64_t>(static_cast<int64_t>(buf.size()), total_ - start);
      source.tokens_copy(start, m, buf.data());
      for (int64_t i = 0; i < m; ++i) {
        const int32_t t = buf[static_cast<size_t>(i)];
        if (t >= 0 && static_cast<size_t>(t) < dense_.size())
          ++dense_[static_cast<size_t>(t)];
        else
          ++sparse_[t];
      }
    }
  }
  int64_t total() const { return total_; }
  // Calls f(id, count) for every id that occurs.
  template <typename F>
  void each(F&& f) const {
    for (size_t t = 0; t < dense_.size(); ++t)
      if (dense_[t] > 0) f(static_cast<int64_t>(t), dense_[t]);
    for (const auto& [t, c] : sparse_) f(t, c);
  }

 private:
  int64_t total_;
  std::vector<int64_t> dense_;
  std::unordered_map<int64_t, int64_t> sparse_;
};

double entropy_of(const std::unordered_map<int64_t, double>& p) {
  double h = 0.0;
  for (const auto& [t, q] : p)
    if (q > 0) h -= q * std::log(q);
  return h;
}

}  // namespace

double unigram_entropy(const TokenSource& source) {
  const auto parts = source.blend_parts();
  if (parts.size() > 1) {
    double weights = 0;
    for (const auto& part : parts) weights += part.weight;
    std::unordered_map<int64_t, double> p;
    for (const auto& part : parts) {
      if (part.weight <= 0 || part.source->size() == 0) continue;
      const UnigramCounts counts(*part.source);
      const double scale = part.weight / weights / static_cast<double>(counts.total());
      counts.each([&](int64_t t, int64_t c) { p[t] += scale * static_cast<double>(c); });
    }
    return entropy_of(p);
  }
  const int64_t n = source.size();
  if (n == 0) return 0.0;
  const UnigramCounts counts(source);
  double h = 0.0;
  counts.each([&](int64_t, int64_t c) {
    const double q = static_cast<double>(c) / static_cast<double>(n);
    h -= q * std::log(q);
  });
  return h;
}

}  // namespace weft::data
