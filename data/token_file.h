// weft's token file (.tok): a 64-byte header, then the tokens.
//
//   offset  size  field
//        0     8  magic "WEFTTOK\0"
//        8     4  format version (uint32), currently 2
//       12     4  dtype: bytes per token (uint32), 2 = uint16, 4 = uint32
//       16     8  token count (int64)
//       24     8  vocab size (int64), 0 when unknown
//       32     8  XXH64 (seed 0) of the payload bytes (uint64)
//       40     8  XXH64 (seed 0) of header bytes 0..39 (uint64); version 2 on
//                 (version 1 files have zero here and are still read: only
//                 their payload is covered)
//       48    16  reserved, zero
//       64     -  payload: count tokens, little-endian, unsigned
//
// All fields are little-endian. The header checksum makes a changed count or
// vocab (which the payload checksum cannot see) a refused file, and it is
// checked on every open: it costs nothing. The payload checksum covers exactly the payload, so
// `tail -c +65 f.tok | xxhsum -H1` reproduces it. The payload starts 64 bytes
// into a page-aligned mapping, so it is naturally aligned for both dtypes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include "data/checksum.h"
#include "data/token_source.h"

namespace weft::data {

inline constexpr char kTokenFileMagic[8] = {'W', 'E', 'F', 'T', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kTokenFileVersion = 2;
inline constexpr int64_t kTokenFileHeaderBytes = 64;

// How much of a file to check when opening it.
enum class Integrity {
  header,  // magic, version, dtype, sizes: O(1), for huge files opened often
  full,    // also the payload checksum: one pass over the file
};

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  TokenDtype dtype = TokenDtype::u16;
  int64_t count = 0;
  int64_t vocab = 0;
  uint64_t checksum = 0;
};

// The narrowest dtype weft's format offers for ids below `vocab`.
TokenDtype token_file_dtype_for(int64_t vocab);

// Streams tokens into a weft token file. Nothing appears at `path` until
// finish(): tokens go to a temporary file beside it, the header is written
// last and the file is renamed into place, so a crash or an error never
// leaves a partial file under the real name, and an existing good file is
// only ever replaced by a complete one. A writer destroyed without finish()
// removes its temporary file.
class TokenFileWriter {
 public:
  // `vocab` > 0: every appended id must be below it; it picks the dtype.
  TokenFileWriter(std::string path, int64_t vocab);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const int32_t> tokens);
  int64_t count() const { return count_; }
  // Writes the header, flushes to disk and renames into place.
  TokenFileHeader finish();

 private:
  void write_bytes(const void* data, size_t bytes);
  std::string path_;
  std::string tmp_path_;
  std::FILE* file_ = nullptr;
  int64_t vocab_;
  TokenDtype dtype_;
  int64_t count_ = 0;
  Checksum64 checksum_;
};

// Writes `tokens` as one weft token file, atomically.
TokenFileHeader token_file_write(const std::string& path, std::span<const int32_t> tokens,
                                 int64_t vocab);

// Parses and checks the header of a weft token file held in `bytes` (the
// whole file, `size` bytes); FileFormatError naming `path` and what is wrong.
TokenFileHeader token_file_header_parse(const uint8_t* bytes, int64_t size,
                                        const std::string& path);

// Opens a weft token file by mmap. FileFormatError naming the path and the
// problem for a bad magic, unknown version or dtype, a size that disagrees
// with the header (truncated or padded) or, with Integrity::full, a payload
// whose checksum does not match; InputError when it is missing or has no tokens.
std::unique_ptr<MappedTokenSource> token_file_open(const std::string& path,
                                                   Integrity integrity = Integrity::full);

}  // namespace weft::data
