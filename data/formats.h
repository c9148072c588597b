// The per-format readers behind token_source_open(). Each checks its header
// against the mapped file and returns a source over the payload, or throws
// FileFormatError naming the path and what is wrong. Internal to weft_data.
#pragma once

#include <memory>

#include "data/mapped_file.h"
#include "data/token_file.h"
#include "data/token_source.h"

namespace weft::data {

using MappedFilePtr = std::shared_ptr<const MappedFile>;

std::unique_ptr<MappedTokenSource> weft_tok_source(MappedFilePtr file, Integrity integrity);

// llm.c .bin: 256 int32 header (magic, version, token count), then the tokens.
//   magic 20240520, version 1: uint16 tokens (GPT-2 tokenizer)
//   magic 20240801, version 7: uint32 tokens (Llama 3 tokenizer)
// These are the two headers llm.c's dev/data/data_common.py writes.
inline constexpr int32_t kLlmcMagicU16 = 20240520;
inline constexpr int32_t kLlmcVersionU16 = 1;
inline constexpr int32_t kLlmcMagicU32 = 20240801;
inline constexpr int32_t kLlmcVersionU32 = 7;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;
bool llmc_bin_detect(const MappedFile& file);
std::unique_ptr<MappedTokenSource> llmc_bin_source(MappedFilePtr file);

// numpy .npy, format versions 1-3: a 1-D little-endian integer array in C order.
bool npy_detect(const MappedFile& file);
std::unique_ptr<MappedTokenSource> npy_source(MappedFilePtr file);

}  // namespace weft::data
