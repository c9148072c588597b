#include "trainer/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "trainer/checkpoint/crc32c.h"
#include "trainer/checkpoint/file_io.h"

namespace weft::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

namespace {

namespace fs = std::filesystem;

constexpr const char* kMetadataKey = "__metadata__";
// The reference implementation refuses headers over 100 MB; so do we, so that
// a garbage length cannot make us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Product of dims, or -1 when a dim is negative or the product overflows.
int64_t checked_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

int64_t TensorRef::elements() const {
  const int64_t n = checked_elements(shape);
  if (n < 0)
    throw InputError(fmt::format("tensor '{}': shape {} has a negative dim or too many elements",
                                 name, shape_text(shape)));
  return n;
}

void tensor_read_f32_block(const TensorRef& t, int64_t row_begin, int64_t rows, int64_t col_begin,
                           int64_t cols, float* out) {
  if (t.shape.empty() || t.shape.size() > 2)
    throw InputError(
        fmt::format("tensor '{}': shape {} is not 1-D or 2-D", t.name, shape_text(t.shape)));
  const int64_t R = t.shape[0];
  const int64_t C = t.shape.size() == 2 ? t.shape[1] : 1;
  if (row_begin < 0 || rows < 0 || col_begin < 0 || cols < 0 || row_begin + rows > R ||
      col_begin + cols > C)
    throw InputError(fmt::format(
        "tensor '{}' of shape {}: block rows [{}, {}) x cols [{}, {}) is "
        "out of range",
        t.name, shape_text(t.shape), row_begin, row_begin + rows, col_begin, col_begin + cols));
  const int64_t esize = dtype_size(t.dtype);
  const auto* base = static_cast<const unsigned char*>(t.data);
  for (int64_t r = 0; r < rows; ++r)
    to_f32(t.dtype, base + ((row_begin + r) * C + col_begin) * esize, out + r * cols, cols);
}

std::string safetensors_header(const std::vector<TensorRef>& tensors, const Metadata& metadata) {
  // ordered_json keeps the header in data order, which makes files easy to
  // read by eye and byte-for-byte reproducible.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) throw InputError("safetensors: a tensor has an empty name");
    if (t.name == kMetadataKey)
      throw InputError(
          fmt::format("safetensors: '{}' is reserved and cannot name a tensor", kMetadataKey));
    if (header.contains(t.name))
      throw InputError(fmt::format("safetensors: tensor name '{}' appears twice", t.name));
    const int64_t bytes = t.bytes();
    if (bytes > 0 && t.data == nullptr)
      throw InputError(fmt::format("safetensors: tensor '{}' has no data", t.name));
    header[t.name] = {{"dtype", to_string(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

FileDigest safetensors_write(const std::string& path, const std::vector<TensorRef>& tensors,
                             const Metadata& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  FileDigest digest;
  try {
    FileWriter out(tmp);
    out.write(header.data(), header.size());
    digest.bytes = static_cast<int64_t>(header.size());
    digest.crc32c = crc32c(header.data(), header.size());
    for (const auto& t : tensors) {
      const auto n = static_cast<size_t>(t.bytes());
      if (n == 0) continue;
      out.write(t.data, n);
      digest.crc32c = crc32c_update(digest.crc32c, t.data, n);
      digest.bytes += static_cast<int64_t>(n);
    }
    out.sync_close();
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw InputError(
          fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  const fs::path parent = fs::path(path).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
  return digest;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) {
    release();
    return FileFormatError(fmt::format("safetensors file '{}': {}", path, what));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw fail(fmt::format("cannot stat: {}", std::strerror(err)));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw fail(
        fmt::format("is {} bytes, too short for the 8-byte header length (truncated?)", size_));
  }
  void* map = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw fail(fmt::format("cannot map: {}", std::strerror(map_err)));
  map_ = map;
  const auto* base = static_cast<const unsigned char*>(map_);

  uint64_t n = 0;
  std::memcpy(&n, base, 8);
  if (n > size_ - 8)
    throw fail(
        fmt::format("header length {} exceeds the {} bytes after the length field "
                    "(truncated, or not a safetensors file)",
                    n, size_ - 8));
  if (n > kMaxHeaderBytes)
    throw fail(fmt::format("header length {} is over the {}-byte limit", n, kMaxHeaderBytes));
  if (n < 2 || base[8] != '{') throw fail("header is not a JSON object (it must start with '{')");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + n);
  } catch (const nlohmann::json::parse_error& e) {
    throw fail(fmt::format("header is not valid JSON (byte {}): {}", e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {
    // A number beyond double's range, such as 1e999 (out_of_range.406).
    throw fail(fmt::format("header holds a number that is not finite: {}", e.what()));
  }
  if (!header.is_object()) throw fail("header is not a JSON object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_bytes = size_ - data_start;
  struct Span {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Span> spans;
  for (const auto& item : header.items()) {
    // Named, not a structured binding: clang before 16 cannot capture one in `bad`.
    const std::string& name = item.key();
    const nlohmann::json& entry = item.value();
    if (name == kMetadataKey) {
      if (!entry.is_object()) throw fail("'__metadata__' must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          throw fail(fmt::format("'__metadata__' value of '{}' is not a string: {}", k, v.dump()));
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return fail(fmt::format("tensor '{}': {}", name, what));
    };
    if (!entry.is_object()) throw bad("entry is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) throw bad("missing 'dtype'");
    TensorRef t;
    t.name = name;
    if (!dtype_parse(entry["dtype"].get<std::string>(), t.dtype))
      throw bad(fmt::format("unknown dtype {}", entry["dtype"].dump()));
    if (!entry.contains("shape") || !entry["shape"].is_array()) throw bad("missing 'shape'");
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned())
        throw bad(fmt::format("shape {} has a dim that is not a non-negative integer",
                              entry["shape"].dump()));
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw bad(fmt::format("shape {} has a dim too large", entry["shape"].dump()));
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& offs = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
    if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
        !offs[1].is_number_unsigned())
      throw bad("'data_offsets' must be [begin, end] with non-negative integers");
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (end < begin) throw bad(fmt::format("data_offsets [{}, {}] end before begin", begin, end));
    const int64_t elements = checked_elements(t.shape);
    if (elements < 0 || static_cast<uint64_t>(elements) >
                            std::numeric_limits<uint64_t>::max() / dtype_size(t.dtype))
      throw bad(fmt::format("shape {} has too many elements", shape_text(t.shape)));
    const uint64_t want = static_cast<uint64_t>(elements) * dtype_size(t.dtype);
    if (end - begin != want)
      throw bad(fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}",
                            begin, end, end - begin, shape_text(t.shape), to_string(t.dtype),
                            want));
    if (end > data_bytes)
      throw bad(
          fmt::format("data_offsets [{}, {}] run past the {}-byte data buffer (file "
                      "truncated?)",
                      begin, end, data_bytes));
    t.data = base + data_start + begin;
    spans.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  // The tensors must tile the buffer: sorted by offset, each starts where the
  // previous ends, and the last ends at the end of the file.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.begin < at)
      throw fail(fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap",
                             tensors_[spans[i - 1].tensor].name, spans[i - 1].begin,
                             spans[i - 1].end, tensors_[s.tensor].name, s.begin, s.end));
    if (s.begin > at)
      throw fail(fmt::format("data bytes [{}, {}) before tensor '{}' belong to no tensor", at,
                             s.begin, tensors_[s.tensor].name));
    at = s.end;
  }
  if (at != data_bytes)
    throw fail(
        fmt::format("the tensors cover {} bytes but the data buffer has {}: {} trailing "
                    "bytes",
                    at, data_bytes, data_bytes - at));

  std::vector<TensorRef> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) ordered.push_back(std::move(tensors_[s.tensor]));
  tensors_ = std::move(ordered);
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

SafetensorsFile::~SafetensorsFile() { release(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

void SafetensorsFile::release() {
  if (map_ != nullptr) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
  tensors_.clear();
  index_.clear();
}

const TensorRef* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorRef& SafetensorsFile::at(std::string_view name) const {
  const TensorRef* t = find(name);
  if (t == nullptr)
    throw FileFormatError(fmt::format("safetensors file '{}' has no tensor '{}'", path_, name));
  return *t;
}

uint32_t SafetensorsFile::crc32c() const {
  if (map_ == nullptr) return 0;
  ::madvise(map_, size_, MADV_SEQUENTIAL);
  return checkpoint::crc32c(map_, size_);
}

}  // namespace weft::checkpoint
