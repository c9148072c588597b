// The token files of one split of a prepared folder, in either format
// `weft data prepare --format` offers: weft's .tok (token_file.h) or a
// Megatron .bin/.idx pair (megatron_file.h). Both write atomically.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "data/token_source.h"

namespace weft::data {

enum class TokenFormat { weft, megatron };

// "weft" or "megatron"; InputError naming the value and the valid ones.
TokenFormat token_format_parse(const std::string& name);
const char* token_format_name(TokenFormat format);

// One written split, as meta.json records it.
struct SplitFile {
  std::string file;  // its name in the folder: "train.tok", or "train.bin" beside "train.idx"
  int64_t tokens = 0;
  int64_t documents = 0;
  TokenDtype dtype = TokenDtype::u16;
  uint64_t checksum = 0;  // XXH64 of the tokens as stored
};

class SplitWriter {
 public:
  virtual ~SplitWriter() = default;
  virtual void document_append(std::span<const int32_t> tokens) = 0;
  virtual int64_t count() const = 0;  // tokens so far
  virtual SplitFile finish() = 0;
};

// A writer of split `name` ("train", "val") into `dir`, for ids below `vocab`.
std::unique_ptr<SplitWriter> split_writer_create(TokenFormat format, const std::string& dir,
                                                 const std::string& name, int64_t vocab);

}  // namespace weft::data
