// The safetensors format (https://huggingface.co/docs/safetensors), read and
// written exactly as published:
//
//   [8 bytes]  N, little-endian uint64: the header length
//   [N bytes]  JSON object: name -> {"dtype": "F32", "shape": [..],
//              "data_offsets": [begin, end]}, plus an optional
//              "__metadata__" object of string -> string; padded with spaces
//              so that the data starts 8-byte aligned
//   [rest]     the data buffer: every tensor row-major little-endian, offsets
//              relative to the buffer's start, contiguous, covering it exactly
//
// The writer lays tensors out in the order given and writes through a
// temporary file, fsync and rename. The reader maps the file and checks every
// structural rule before exposing a tensor, so a truncated or damaged header
// is refused with a FileFormatError naming the file and the fault. It does not
// checksum the data; checkpoint manifests do that (see checkpoint.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/checkpoint/dtype.h"

namespace weft::checkpoint {

// A named tensor in memory: what the writer takes and the reader exposes.
struct TensorRef {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // row-major; {} is a scalar (one element)
  // elements() * dtype_size(dtype) bytes. From the reader it points into the
  // mapped file and need not be aligned to the element size.
  const void* data = nullptr;

  int64_t elements() const;
  int64_t bytes() const { return elements() * dtype_size(dtype); }
};

using Metadata = std::map<std::string, std::string>;

// Copies the block rows [row_begin, row_begin + rows) x cols [col_begin,
// col_begin + cols) of a floating-point tensor into `out` (rows x cols, fp32,
// row-major), converting from its dtype. A 1-D tensor of n elements is read
// as n rows of one column. This is how a rank takes its tensor-parallel shard
// of a full stored tensor. InputError naming the tensor when the block is out
// of range or the tensor is not 1-D or 2-D floating point.
void tensor_read_f32_block(const TensorRef& t, int64_t row_begin, int64_t rows, int64_t col_begin,
                           int64_t cols, float* out);

// Size and CRC32C of a whole written file.
struct FileDigest {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// The 8-byte length and the padded JSON header the writer puts before the
// data for these tensors. InputError for an empty, duplicate or reserved
// name, a negative dim, or a missing data pointer.
std::string safetensors_header(const std::vector<TensorRef>& tensors, const Metadata& metadata);

// Writes `path` atomically (temporary file in the same folder, fsync, rename,
// fsync of the folder) and returns its size and CRC32C, computed while
// writing. Creates no folders.
FileDigest safetensors_write(const std::string& path, const std::vector<TensorRef>& tensors,
                             const Metadata& metadata = {});

// A validated, memory-mapped safetensors file. Move-only; tensors' data
// pointers live as long as the object.
class SafetensorsFile {
 public:
  // Maps and validates `path`; FileFormatError naming the file and the fault.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, in data-buffer order.
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorRef* find(std::string_view name) const;
  // FileFormatError naming the file and the tensor when absent.
  const TensorRef& at(std::string_view name) const;
  const Metadata& metadata() const { return metadata_; }
  int64_t file_bytes() const { return static_cast<int64_t>(size_); }
  // CRC32C of the whole file (reads every byte).
  uint32_t crc32c() const;

 private:
  void release();

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorRef> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  Metadata metadata_;
};

}  // namespace weft::checkpoint
