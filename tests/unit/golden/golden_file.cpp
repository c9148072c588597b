#include "tests/unit/golden/golden_file.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/error.h"

namespace weft::test {
namespace {

// Tensor data is copied straight from the little-endian file.
static_assert(std::endian::native == std::endian::little, "golden reader assumes a little-endian host");

constexpr int64_t kPrefixBytes = 16;  // magic + version + header length
constexpr int64_t kAlign = 8;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw FileFormatError("golden file " + source + ": " + what);
}

uint32_t read_u32_le(const std::byte* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

int64_t dtype_size(GoldenDtype dtype) {
  switch (dtype) {
    case GoldenDtype::kF32: return 4;
    case GoldenDtype::kI32: return 4;
    case GoldenDtype::kF64: return 8;
  }
  return 0;
}

GoldenDtype parse_dtype(const nlohmann::json& j, const std::string& source, const std::string& name) {
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "f32") return GoldenDtype::kF32;
    if (s == "i32") return GoldenDtype::kI32;
    if (s == "f64") return GoldenDtype::kF64;
  }
  fail(source, "tensor '" + name + "' has dtype " + j.dump() + "; expected \"f32\", \"i32\" or \"f64\"");
}

int64_t parse_count(const nlohmann::json& entry, const char* key, const std::string& source,
                    const std::string& name) {
  if (!entry.contains(key) || !entry[key].is_number_integer() || entry[key].get<int64_t>() < 0) {
    fail(source, "tensor '" + name + "' needs a non-negative integer \"" + key + "\", got " +
                     (entry.contains(key) ? entry[key].dump() : std::string("nothing")));
  }
  return entry[key].get<int64_t>();
}

template <typename T>
std::vector<T> copy_data(const std::byte* p, int64_t numel) {
  std::vector<T> out(static_cast<size_t>(numel));
  if (numel > 0) std::memcpy(out.data(), p, static_cast<size_t>(numel) * sizeof(T));
  return out;
}

}  // namespace

const char* golden_dtype_name(GoldenDtype dtype) {
  switch (dtype) {
    case GoldenDtype::kF32: return "f32";
    case GoldenDtype::kI32: return "i32";
    case GoldenDtype::kF64: return "f64";
  }
  return "?";
}

int64_t GoldenTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
template <typename T>
const std::vector<T>& data_as(const GoldenTensor& t, GoldenDtype want) {
  if (t.dtype != want) {
    throw FileFormatError(std::string("golden tensor holds ") + golden_dtype_name(t.dtype) +
                          " data, asked for " + golden_dtype_name(want));
  }
  return std::get<std::vector<T>>(t.data);
}
}  // namespace

const std::vector<float>& GoldenTensor::f32() const { return data_as<float>(*this, GoldenDtype::kF32); }
const std::vector<int32_t>& GoldenTensor::i32() const {
  return data_as<int32_t>(*this, GoldenDtype::kI32);
}
const std::vector<double>& GoldenTensor::f64() const { return data_as<double>(*this, GoldenDtype::kF64); }

const GoldenTensor& GoldenFile::at(const std::string& name) const {
  const auto it = tensors.find(name);
  if (it == tensors.end()) fail(source, "has no tensor named '" + name + "'");
  return it->second;
}

GoldenFile golden_file_parse(std::span<const std::byte> bytes, const std::string& source) {
  const auto size = static_cast<int64_t>(bytes.size());
  if (size < kPrefixBytes) {
    fail(source, "is " + std::to_string(size) + " bytes, shorter than the " +
                     std::to_string(kPrefixBytes) + "-byte prefix (truncated or not a golden file)");
  }
  if (std::memcmp(bytes.data(), kGoldenMagic, sizeof(kGoldenMagic)) != 0) {
    fail(source, "does not start with the magic \"WEFTGLD1\" (not a golden file)");
  }
  const uint32_t version = read_u32_le(bytes.data() + 8);
  if (version != kGoldenVersion) {
    fail(source, "has format version " + std::to_string(version) + "; this reader knows version " +
                     std::to_string(kGoldenVersion) + " (regenerate with tools/golden_llama.py)");
  }
  const int64_t header_len = read_u32_le(bytes.data() + 12);
  if (header_len > size - kPrefixBytes) {
    fail(source, "declares a " + std::to_string(header_len) + "-byte header but only " +
                     std::to_string(size - kPrefixBytes) + " bytes follow the prefix (truncated?)");
  }

  GoldenFile file;
  file.source = source;
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + kPrefixBytes);
  try {
    file.header = nlohmann::json::parse(header_begin, header_begin + header_len);
  } catch (const nlohmann::json::parse_error& e) {
    fail(source, std::string("header is not valid JSON: ") + e.what());
  }
  if (!file.header.is_object() || !file.header.contains("tensors") ||
      !file.header["tensors"].is_object()) {
    fail(source, "header has no \"tensors\" object");
  }

  const int64_t data_begin = kPrefixBytes + header_len;
  const int64_t data_size = size - data_begin;
  for (const auto& [name, entry] : file.header["tensors"].items()) {
    if (!entry.is_object()) fail(source, "tensor '" + name + "' entry is not an object");
    GoldenTensor t;
    t.dtype = parse_dtype(entry.value("dtype", nlohmann::json()), source, name);
    if (!entry.contains("shape") || !entry["shape"].is_array()) {
      fail(source, "tensor '" + name + "' has no \"shape\" array");
    }
    int64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        fail(source, "tensor '" + name + "' has shape " + entry["shape"].dump() +
                         "; dims must be non-negative integers");
      }
      const int64_t dim = d.get<int64_t>();
      if (dim > 0 && numel > std::numeric_limits<int64_t>::max() / 8 / dim) {
        fail(source, "tensor '" + name + "' shape " + entry["shape"].dump() + " is too large");
      }
      numel *= dim;
      t.shape.push_back(dim);
    }
    const int64_t offset = parse_count(entry, "offset", source, name);
    const int64_t nbytes = parse_count(entry, "nbytes", source, name);
    if (nbytes != numel * dtype_size(t.dtype)) {
      fail(source, "tensor '" + name + "' has nbytes " + std::to_string(nbytes) + " but shape " +
                       entry["shape"].dump() + " of " + golden_dtype_name(t.dtype) + " needs " +
                       std::to_string(numel * dtype_size(t.dtype)));
    }
    if (offset % kAlign != 0) {
      fail(source, "tensor '" + name + "' offset " + std::to_string(offset) +
                       " is not a multiple of " + std::to_string(kAlign));
    }
    if (offset > data_size || nbytes > data_size - offset) {
      fail(source, "tensor '" + name + "' spans bytes [" + std::to_string(offset) + ", " +
                       std::to_string(offset + nbytes) + ") of the data section, which has only " +
                       std::to_string(data_size) + " bytes (truncated?)");
    }
    const std::byte* p = bytes.data() + data_begin + offset;
    switch (t.dtype) {
      case GoldenDtype::kF32: t.data = copy_data<float>(p, numel); break;
      case GoldenDtype::kI32: t.data = copy_data<int32_t>(p, numel); break;
      case GoldenDtype::kF64: t.data = copy_data<double>(p, numel); break;
    }
    file.tensors.emplace(name, std::move(t));
  }
  return file;
}

GoldenFile golden_file_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened");
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "could not be read");
  return golden_file_parse(std::as_bytes(std::span<const char>(raw)), path);
}

}  // namespace weft::test
