// Reader for the PyTorch golden fixtures that tools/golden_llama.py writes.
//
// File format, version 1 (all integers little-endian):
//   offset 0   8 bytes    magic "WEFTGLD1"
//   offset 8   uint32     format version (1)
//   offset 12  uint32     header length N in bytes
//   offset 16  N bytes    UTF-8 JSON header, space-padded so the data section
//                         starts at a multiple of 8
//   16 + N     data section: row-major tensors
// The header object holds "generator", "config", "optimizer", "scalars" and
// "tensors": {name: {"dtype": "f32"|"i32"|"f64", "shape": [...],
// "offset": bytes from the start of the data section (multiple of 8),
// "nbytes": numel * element size}}. tools/golden_llama.py documents what each
// tensor and header field means.
//
// Every structural problem (magic, version, header bounds, JSON, a tensor
// entry that is malformed or lies outside the file) is a weft::FileFormatError
// naming the file and the values involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::test {

inline constexpr char kGoldenMagic[8] = {'W', 'E', 'F', 'T', 'G', 'L', 'D', '1'};
inline constexpr uint32_t kGoldenVersion = 1;

enum class GoldenDtype { kF32, kI32, kF64 };

const char* golden_dtype_name(GoldenDtype dtype);

struct GoldenTensor {
  GoldenDtype dtype = GoldenDtype::kF32;
  std::vector<int64_t> shape;  // empty for a scalar
  std::variant<std::vector<float>, std::vector<int32_t>, std::vector<double>> data;

  int64_t numel() const;
  // The data as the named type; FileFormatError when the dtype differs.
  const std::vector<float>& f32() const;
  const std::vector<int32_t>& i32() const;
  const std::vector<double>& f64() const;
};

struct GoldenFile {
  std::string source;  // path or description, for messages
  nlohmann::json header;
  std::map<std::string, GoldenTensor> tensors;

  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  // The named tensor; FileFormatError naming the file when it is absent.
  const GoldenTensor& at(const std::string& name) const;
};

// Parses a whole fixture held in memory; `source` names it in messages.
GoldenFile golden_file_parse(std::span<const std::byte> bytes, const std::string& source);

// Reads and parses the fixture at `path`.
GoldenFile golden_file_read(const std::string& path);

}  // namespace weft::test
