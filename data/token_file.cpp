#include "data/token_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "data/formats.h"
#include "data/mapped_file.h"

namespace weft::data {

namespace {

// Byte layout of the header; see token_file.h.
constexpr int64_t kOffVersion = 8, kOffDtype = 12, kOffCount = 16, kOffVocab = 24,
                  kOffChecksum = 32, kOffHeaderChecksum = 40;

template <typename T>
T field(const uint8_t* bytes, int64_t offset) {
  T v;
  std::memcpy(&v, bytes + offset, sizeof(T));
  return v;
}
template <typename T>
void field_set(uint8_t* bytes, int64_t offset, T v) {
  std::memcpy(bytes + offset, &v, sizeof(T));
}

std::vector<uint8_t> header_bytes(const TokenFileHeader& h) {
  std::vector<uint8_t> b(kTokenFileHeaderBytes, 0);
  std::memcpy(b.data(), kTokenFileMagic, sizeof(kTokenFileMagic));
  field_set<uint32_t>(b.data(), kOffVersion, h.version);
  field_set<uint32_t>(b.data(), kOffDtype, static_cast<uint32_t>(dtype_bytes(h.dtype)));
  field_set<int64_t>(b.data(), kOffCount, h.count);
  field_set<int64_t>(b.data(), kOffVocab, h.vocab);
  field_set<uint64_t>(b.data(), kOffChecksum, h.checksum);
  if (h.version >= 2) field_set<uint64_t>(b.data(), kOffHeaderChecksum, checksum64(b.data(), kOffHeaderChecksum));
  return b;
}

}  // namespace

TokenDtype token_file_dtype_for(int64_t vocab) {
  return vocab <= (int64_t{1} << 16) ? TokenDtype::u16 : TokenDtype::u32;
}

// ---- writer -----------------------------------------------------------------

TokenFileWriter::TokenFileWriter(std::string path, int64_t vocab)
    : path_(std::move(path)), vocab_(vocab), dtype_(token_file_dtype_for(vocab)) {
  // Ids travel as int32 through the loader, so 2^31 is the largest vocab.
  if (vocab <= 0 || vocab > (int64_t{1} << 31))
    throw InputError(
        fmt::format("vocab {} for token file '{}' must be in [1, 2^31]", vocab, path_));
  namespace fs = std::filesystem;
  const fs::path target(path_);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  tmp_path_ = path_ + fmt::format(".tmp.{}", ::getpid());
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!file_)
    throw InputError(fmt::format("cannot write '{}': {}", tmp_path_, std::strerror(errno)));
  // Placeholder; finish() writes the real header once count and checksum are known.
  const std::vector<uint8_t> zeros(kTokenFileHeaderBytes, 0);
  write_bytes(zeros.data(), zeros.size());
}

TokenFileWriter::~TokenFileWriter() {
  if (file_) {
    std::fclose(file_);
    std::error_code ec;
    std::filesystem::remove(tmp_path_, ec);
  }
}

void TokenFileWriter::write_bytes(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, file_) != bytes)
    throw InputError(fmt::format("cannot write '{}': {}", tmp_path_, std::strerror(errno)));
}

void TokenFileWriter::append(std::span<const int32_t> tokens) {
  // Narrow into a small buffer so the checksum and the file see the on-disk bytes.
  constexpr size_t kChunk = 1 << 14;
  uint8_t buf[kChunk * 4];
  const int64_t width = dtype_bytes(dtype_);
  for (size_t start = 0; start < tokens.size(); start += kChunk) {
    const size_t n = std::min(kChunk, tokens.size() - start);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = tokens[start + i];
      if (t < 0 || t >= vocab_)
        throw InputError(
            fmt::format("token id {} at position {} written to '{}' is outside the "
                        "vocab [0, {})",
                        t, count_ + static_cast<int64_t>(start + i), path_, vocab_));
      if (width == 2)
        field_set<uint16_t>(buf, static_cast<int64_t>(i) * 2, static_cast<uint16_t>(t));
      else
        field_set<uint32_t>(buf, static_cast<int64_t>(i) * 4, static_cast<uint32_t>(t));
    }
    const size_t bytes = n * static_cast<size_t>(width);
    checksum_.update(buf, static_cast<int64_t>(bytes));
    write_bytes(buf, bytes);
  }
  count_ += static_cast<int64_t>(tokens.size());
}

TokenFileHeader TokenFileWriter::finish() {
  WEFT_ASSERT(file_ != nullptr);
  TokenFileHeader h;
  h.dtype = dtype_;
  h.count = count_;
  h.vocab = vocab_;
  h.checksum = checksum_.digest();
  const auto bytes = header_bytes(h);
  const bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
                  std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size() &&
                  std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  std::error_code ec;
  if (!ok || !closed) {
    std::filesystem::remove(tmp_path_, ec);
    throw InputError(fmt::format("cannot write '{}': {}", tmp_path_, std::strerror(err)));
  }
  std::filesystem::rename(tmp_path_, path_, ec);
  if (ec) {
    std::filesystem::remove(tmp_path_, ec);
    throw InputError(fmt::format("cannot rename into '{}': {}", path_, ec.message()));
  }
  return h;
}

TokenFileHeader token_file_write(const std::string& path, std::span<const int32_t> tokens,
                                 int64_t vocab) {
  TokenFileWriter w(path, vocab);
  w.append(tokens);
  return w.finish();
}

// ---- reader -----------------------------------------------------------------

TokenFileHeader token_file_header_parse(const uint8_t* bytes, int64_t size,
                                        const std::string& path) {
  if (size < kTokenFileHeaderBytes || std::memcmp(bytes, kTokenFileMagic, 8) != 0) {
    if (size >= 8 && std::memcmp(bytes, kTokenFileMagic, 8) == 0)
      throw FileFormatError(fmt::format(
          "weft token file '{}' is truncated: {} bytes, shorter than its {}-byte header", path,
          size, kTokenFileHeaderBytes));
    throw FileFormatError(
        fmt::format("'{}' is not a weft token file: it does not start with "
                    "the magic bytes WEFTTOK",
                    path));
  }
  TokenFileHeader h;
  h.version = field<uint32_t>(bytes, kOffVersion);
  if (h.version != 1 && h.version != kTokenFileVersion)
    throw FileFormatError(
        fmt::format("weft token file '{}' has format version {}; this weft reads versions 1 and {}", path,
                    h.version, kTokenFileVersion));
  const uint32_t width = field<uint32_t>(bytes, kOffDtype);
  if (width == 2)
    h.dtype = TokenDtype::u16;
  else if (width == 4)
    h.dtype = TokenDtype::u32;
  else
    throw FileFormatError(fmt::format(
        "weft token file '{}' has dtype code {}; valid: 2 (uint16) or 4 (uint32)", path, width));
  h.count = field<int64_t>(bytes, kOffCount);
  h.vocab = field<int64_t>(bytes, kOffVocab);
  h.checksum = field<uint64_t>(bytes, kOffChecksum);
  const int64_t payload = size - kTokenFileHeaderBytes;
  if (h.count < 0 || h.vocab < 0)
    throw FileFormatError(
        fmt::format("weft token file '{}' is corrupt: header says {} tokens, vocab {}", path,
                    h.count, h.vocab));
  if (payload % width != 0 || payload / width != h.count) {
    // Division, not multiplication, so a corrupt huge count cannot overflow.
    const bool short_file = payload / width < h.count;
    throw FileFormatError(fmt::format(
        "weft token file '{}' is {}: its header says {} {} tokens ({} bytes each) but the file "
        "holds {} payload bytes",
        path, short_file ? "truncated" : "longer than its header says", h.count,
        dtype_name(h.dtype), width, payload));
  }
  // Last, so that the faults above keep their own messages; what is left
  // is a field changed consistently with the file, such as the vocab.
  if (h.version >= 2 && field<uint64_t>(bytes, kOffHeaderChecksum) != checksum64(bytes, kOffHeaderChecksum))
    throw FileFormatError(fmt::format(
        "weft token file '{}' is corrupt: its header (vocab, count or dtype) does not match the header checksum; "
        "prepare the data again",
        path));
  return h;
}

std::unique_ptr<MappedTokenSource> weft_tok_source(MappedFilePtr file, Integrity integrity) {
  const auto h = token_file_header_parse(file->data(), file->size(), file->path());
  if (h.count == 0) throw InputError(fmt::format("data file '{}' holds no tokens", file->path()));
  if (integrity == Integrity::full) {
    const uint64_t sum =
        checksum64(file->data() + kTokenFileHeaderBytes, file->size() - kTokenFileHeaderBytes);
    if (sum != h.checksum)
      throw FileFormatError(fmt::format(
          "weft token file '{}' is corrupt: payload checksum {:016x} does not match the header's "
          "{:016x}",
          file->path(), sum, h.checksum));
  }
  return std::make_unique<MappedTokenSource>(std::move(file), "weft .tok", kTokenFileHeaderBytes,
                                             h.dtype, h.count, h.vocab);
}

std::unique_ptr<MappedTokenSource> token_file_open(const std::string& path, Integrity integrity) {
  return weft_tok_source(std::make_shared<const MappedFile>(path), integrity);
}

}  // namespace weft::data
