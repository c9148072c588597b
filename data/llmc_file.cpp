// llm.c .bin token files (see formats.h for the two headers llm.c writes).
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "data/formats.h"

namespace weft::data {

namespace {

int32_t header_word(const MappedFile& file, int64_t i) {
  int32_t v;
  std::memcpy(&v, file.data() + 4 * i, 4);
  return v;
}

}  // namespace

bool llmc_bin_detect(const MappedFile& file) {
  if (file.size() < 4) return false;
  const int32_t magic = header_word(file, 0);
  return magic == kLlmcMagicU16 || magic == kLlmcMagicU32;
}

std::unique_ptr<MappedTokenSource> llmc_bin_source(MappedFilePtr file) {
  const std::string& path = file->path();
  if (file->size() < kLlmcHeaderBytes)
    throw FileFormatError(
        fmt::format("llm.c token file '{}' is truncated: {} bytes, shorter than its {}-byte header",
                    path, file->size(), kLlmcHeaderBytes));
  const int32_t magic = header_word(*file, 0);
  const int32_t version = header_word(*file, 1);
  const int64_t count = header_word(*file, 2);
  TokenDtype dtype;
  if (magic == kLlmcMagicU16 && version == kLlmcVersionU16)
    dtype = TokenDtype::u16;
  else if (magic == kLlmcMagicU32 && version == kLlmcVersionU32)
    dtype = TokenDtype::u32;
  else
    throw FileFormatError(fmt::format(
        "llm.c token file '{}' has magic {} with version {}; weft reads magic {} version {} "
        "(uint16 tokens) and magic {} version {} (uint32 tokens)",
        path, magic, version, kLlmcMagicU16, kLlmcVersionU16, kLlmcMagicU32, kLlmcVersionU32));
  if (count < 0)
    throw FileFormatError(
        fmt::format("llm.c token file '{}' is corrupt: header says {} tokens", path, count));
  if (count == 0) throw InputError(fmt::format("data file '{}' holds no tokens", path));
  const int64_t width = dtype_bytes(dtype);
  const int64_t payload = file->size() - kLlmcHeaderBytes;
  if (payload != count * width)
    throw FileFormatError(fmt::format(
        "llm.c token file '{}' is {}: its header says {} {} tokens ({} bytes) but the file holds "
        "{} payload bytes",
        path, payload < count * width ? "truncated" : "longer than its header says", count,
        dtype_name(dtype), count * width, payload));
  // llm.c files do not record the vocab; validate_vocab() checks ids against the model.
  return std::make_unique<MappedTokenSource>(std::move(file), "llm.c .bin", kLlmcHeaderBytes, dtype,
                                             count, 0);
}

}  // namespace weft::data
