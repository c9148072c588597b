// Megatron .bin/.idx datasets (see megatron_file.h for the layout), written
// from the format's description in Megatron-LM's indexed_dataset.py.
#include "data/megatron_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "data/mapped_file.h"

namespace weft::data {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kOffVersion = 9, kOffDtype = 17, kOffSequences = 18, kOffDocuments = 26;

template <typename T>
T field(const uint8_t* bytes, int64_t offset) {
  T v;
  std::memcpy(&v, bytes + offset, sizeof(T));
  return v;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// Writes the .idx to `path` (a temporary name the caller renames) and syncs
// it. The arrays go out as they are in memory: weft runs on little-endian
// hosts only, as every reader of its files assumes.
void idx_write(const std::string& path, TokenDtype dtype, uint8_t code,
               const std::vector<int32_t>& lengths, const std::vector<int64_t>& document_index) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw InputError(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  bool ok = true;
  const auto put = [&](const void* data, size_t bytes) {
    ok = ok && std::fwrite(data, 1, bytes, f) == bytes;
  };
  const uint64_t version = kMegatronIdxVersion, s = lengths.size(), d = document_index.size();
  put(kMegatronIdxMagic, sizeof(kMegatronIdxMagic));
  put(&version, 8);
  put(&code, 1);
  put(&s, 8);
  put(&d, 8);
  put(lengths.data(), lengths.size() * 4);
  // The byte offsets, a chunk at a time rather than a second array of S.
  std::vector<int64_t> pointers;
  int64_t pointer = 0;
  for (size_t i = 0; i < lengths.size(); i += 4096) {
    pointers.clear();
    for (size_t j = i; j < std::min(lengths.size(), i + 4096); ++j) {
      pointers.push_back(pointer);
      pointer += lengths[j] * dtype_bytes(dtype);
    }
    put(pointers.data(), pointers.size() * 8);
  }
  put(document_index.data(), document_index.size() * 8);
  ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) throw InputError(fmt::format("cannot write '{}': {}", path, std::strerror(err)));
}

MegatronPaths paths_of(const std::string& prefix) {
  return {prefix, prefix + ".bin", prefix + ".idx"};
}

constexpr const char* kTokenCodes =
    "1 (uint8), 2 (int8), 3 (int16), 4 (int32), 5 (int64) or 8 (uint16)";

TokenDtype dtype_from_code(uint8_t code, const std::string& idx) {
  switch (code) {
    case 1:
      return TokenDtype::u8;
    case 2:
      return TokenDtype::i8;
    case 3:
      return TokenDtype::i16;
    case 4:
      return TokenDtype::i32;
    case 5:
      return TokenDtype::i64;
    case 8:
      return TokenDtype::u16;
    case 6:
    case 7:
      throw FileFormatError(fmt::format(
          "Megatron index '{}' has dtype code {} ({}), which holds no token ids; token datasets "
          "use {}",
          idx, code, code == 6 ? "float64" : "float32", kTokenCodes));
    default:
      throw FileFormatError(fmt::format("Megatron index '{}' has unknown dtype code {}; valid: {}",
                                        idx, code, kTokenCodes));
  }
}

uint8_t code_from_dtype(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::u8:
      return 1;
    case TokenDtype::i8:
      return 2;
    case TokenDtype::i16:
      return 3;
    case TokenDtype::i32:
      return 4;
    case TokenDtype::i64:
      return 5;
    case TokenDtype::u16:
      return 8;
    case TokenDtype::u32:
      break;
  }
  WEFT_ASSERT(false);
  return 0;
}

// The header fields and where the three arrays start.
struct IdxLayout {
  TokenDtype dtype;
  int64_t sequences, entries;  // S, D
  const uint8_t* lengths;      // (S) int32
  const uint8_t* pointers;     // (S) int64
  const uint8_t* documents;    // (D) int64
};

IdxLayout idx_parse(const MappedFile& f) {
  const std::string& path = f.path();
  const uint8_t* b = f.data();
  const int64_t size = f.size();
  if (size < 9 || std::memcmp(b, kMegatronIdxMagic, 9) != 0)
    throw FileFormatError(fmt::format(
        "'{}' is not a Megatron index: it does not start with the magic bytes MMIDIDX\\x00\\x00",
        path));
  if (size < kMegatronIdxHeaderBytes)
    throw FileFormatError(
        fmt::format("Megatron index '{}' is truncated: {} bytes, shorter than its {}-byte header",
                    path, size, kMegatronIdxHeaderBytes));
  const auto version = field<uint64_t>(b, kOffVersion);
  if (version != kMegatronIdxVersion)
    throw FileFormatError(fmt::format("Megatron index '{}' has version {}; weft reads version {}",
                                      path, version, kMegatronIdxVersion));
  IdxLayout l{};
  l.dtype = dtype_from_code(b[kOffDtype], path);
  const auto s = field<uint64_t>(b, kOffSequences);
  const auto d = field<uint64_t>(b, kOffDocuments);
  // Compared by division first, so that corrupt huge counts cannot overflow.
  const auto body = static_cast<uint64_t>(size - kMegatronIdxHeaderBytes);
  const bool fits = s <= body / 12 && d <= body / 8 && 12 * s + 8 * d <= body;
  if (!fits || 12 * s + 8 * d != body) {
    if (fits && 13 * s + 8 * d == body)
      throw FileFormatError(fmt::format(
          "Megatron index '{}' has a mode per sequence (a multimodal dataset); weft reads token "
          "datasets only",
          path));
    throw FileFormatError(fmt::format(
        "Megatron index '{}' is {} bytes, but its header's {} sequences and {} document index "
        "entries take {} + 12 x {} + 8 x {} bytes",
        path, size, s, d, kMegatronIdxHeaderBytes, s, d));
  }
  l.sequences = static_cast<int64_t>(s);
  l.entries = static_cast<int64_t>(d);
  l.lengths = b + kMegatronIdxHeaderBytes;
  l.pointers = l.lengths + 4 * l.sequences;
  l.documents = l.pointers + 8 * l.sequences;
  return l;
}

void documents_check(const IdxLayout& l, const std::string& path, Integrity integrity) {
  if (l.entries < 1)
    throw FileFormatError(fmt::format(
        "Megatron index '{}' has an empty document index; it must run from 0 to the sequence "
        "count {}",
        path, l.sequences));
  const auto at = [&](int64_t i) { return field<int64_t>(l.documents, 8 * i); };
  if (at(0) != 0 || at(l.entries - 1) != l.sequences)
    throw FileFormatError(fmt::format(
        "Megatron index '{}' has a document index from {} to {}; it must run from 0 to the "
        "sequence count {}",
        path, at(0), at(l.entries - 1), l.sequences));
  if (integrity == Integrity::header) return;
  for (int64_t i = 1; i < l.entries; ++i)
    if (at(i) < at(i - 1))
      throw FileFormatError(fmt::format(
          "Megatron index '{}' is corrupt: document {} ends at sequence {}, before it starts at "
          "sequence {}",
          path, i - 1, at(i), at(i - 1)));
}

// Each sequence must start where the previous one ended; returns the bytes
// they fill. Checks only the first and last sequence with Integrity::header.
int64_t sequences_check(const IdxLayout& l, const MegatronPaths& p, int64_t bin_bytes,
                        Integrity integrity) {
  const int64_t width = dtype_bytes(l.dtype);
  const auto length = [&](int64_t i) { return field<int32_t>(l.lengths, 4 * i); };
  const auto pointer = [&](int64_t i) { return field<int64_t>(l.pointers, 8 * i); };
  const auto check = [&](int64_t i, int64_t expected) {
    const int64_t ptr = pointer(i);
    if (ptr < 0 || ptr > bin_bytes)
      throw FileFormatError(fmt::format(
          "sequence {} of Megatron index '{}' starts at byte {}, outside '{}' ({} bytes)", i,
          p.idx, ptr, p.bin, bin_bytes));
    if (ptr != expected)
      throw FileFormatError(fmt::format(
          "sequence {} of Megatron index '{}' starts at byte {} where {} was expected: weft reads "
          "sequences stored back to back from byte 0, as Megatron's builder writes them",
          i, p.idx, ptr, expected));
    if (length(i) < 0)
      throw FileFormatError(fmt::format(
          "sequence {} of Megatron index '{}' has a negative length {}", i, p.idx, length(i)));
    if (length(i) > (bin_bytes - ptr) / width)
      throw FileFormatError(fmt::format(
          "sequence {} of Megatron index '{}' ({} {} tokens from byte {}) runs past the end of "
          "'{}' ({} bytes)",
          i, p.idx, length(i), dtype_name(l.dtype), ptr, p.bin, bin_bytes));
    return ptr + length(i) * width;
  };
  if (l.sequences == 0) return 0;
  int64_t end = check(0, 0);
  if (integrity == Integrity::header) {
    const int64_t last = l.sequences - 1;
    return last == 0 ? end : check(last, pointer(last));
  }
  for (int64_t i = 1; i < l.sequences; ++i) end = check(i, end);
  return end;
}

}  // namespace

std::optional<MegatronPaths> megatron_paths(const std::string& path) {
  if (ends_with(path, ".idx")) return paths_of(path.substr(0, path.size() - 4));
  if (ends_with(path, ".bin")) {
    const std::string prefix = path.substr(0, path.size() - 4);
    if (exists(prefix + ".idx")) return paths_of(prefix);
    return std::nullopt;
  }
  if (!path.empty() && !exists(path) && (exists(path + ".bin") || exists(path + ".idx")))
    return paths_of(path);
  return std::nullopt;
}

MegatronTokenSource::MegatronTokenSource(MegatronPaths paths, MegatronInfo info,
                                         std::unique_ptr<MappedTokenSource> tokens)
    : paths_(std::move(paths)), info_(info), tokens_(std::move(tokens)) {}

std::string MegatronTokenSource::describe() const {
  return fmt::format("Megatron .bin/.idx '{}' ({}, {} tokens, {} sequences in {} documents)",
                     paths_.prefix, dtype_name(info_.dtype), info_.tokens, info_.sequences,
                     info_.documents);
}

std::unique_ptr<MegatronTokenSource> megatron_open(const MegatronPaths& p, Integrity integrity) {
  const MappedFile idx(p.idx, "Megatron index");
  const IdxLayout l = idx_parse(idx);
  documents_check(l, p.idx, integrity);
  if (l.sequences == 0)
    throw InputError(fmt::format("Megatron dataset '{}' holds no tokens (0 sequences)", p.prefix));
  auto bin = std::make_shared<const MappedFile>(p.bin, "Megatron data file");
  const int64_t filled = sequences_check(l, p, bin->size(), integrity);
  const int64_t width = dtype_bytes(l.dtype);
  if (filled != bin->size())
    throw FileFormatError(fmt::format(
        "Megatron data file '{}' is {} bytes but its index '{}' describes {} {} tokens ({} "
        "bytes)",
        p.bin, bin->size(), p.idx, filled / width, dtype_name(l.dtype), filled));
  MegatronInfo info;
  info.dtype = l.dtype;
  info.tokens = filled / width;
  info.sequences = l.sequences;
  info.documents = l.entries - 1;
  auto tokens = std::make_unique<MappedTokenSource>(std::move(bin), "Megatron .bin", 0, l.dtype,
                                                    info.tokens, 0);
  return std::make_unique<MegatronTokenSource>(p, info, std::move(tokens));
}

// ---- writer -----------------------------------------------------------------

TokenDtype megatron_dtype_for(int64_t vocab) {
  return vocab <= (int64_t{1} << 16) ? TokenDtype::u16 : TokenDtype::i32;
}

MegatronWriter::MegatronWriter(std::string prefix, int64_t vocab)
    : paths_(paths_of(prefix)), vocab_(vocab), dtype_(megatron_dtype_for(vocab)) {
  // Ids travel as int32 through the loader, so 2^31 is the largest vocab.
  if (vocab <= 0 || vocab > (int64_t{1} << 31))
    throw InputError(
        fmt::format("vocab {} for Megatron dataset '{}' must be in [1, 2^31]", vocab, prefix));
  const fs::path target(paths_.bin);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  bin_tmp_ = paths_.bin + fmt::format(".tmp.{}", ::getpid());
  idx_tmp_ = paths_.idx + fmt::format(".tmp.{}", ::getpid());
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  if (!bin_)
    throw InputError(fmt::format("cannot write '{}': {}", bin_tmp_, std::strerror(errno)));
  document_index_.push_back(0);
}

MegatronWriter::~MegatronWriter() {
  // After a finish() that renamed them, neither temporary name exists.
  if (bin_) std::fclose(bin_);
  std::error_code ec;
  fs::remove(bin_tmp_, ec);
  fs::remove(idx_tmp_, ec);
}

void MegatronWriter::bin_write(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, bin_) != bytes)
    throw InputError(fmt::format("cannot write '{}': {}", bin_tmp_, std::strerror(errno)));
}

void MegatronWriter::sequence_append(std::span<const int32_t> tokens) {
  WEFT_ASSERT(bin_ != nullptr);
  constexpr size_t kMaxLength = std::numeric_limits<int32_t>::max();
  do {
    const std::span<const int32_t> piece = tokens.first(std::min(tokens.size(), kMaxLength));
    // Narrow through a small buffer so the checksum sees the on-disk bytes.
    constexpr size_t kChunk = 1 << 14;
    uint8_t buf[kChunk * 4];
    const size_t width = static_cast<size_t>(dtype_bytes(dtype_));
    for (size_t start = 0; start < piece.size(); start += kChunk) {
      const size_t n = std::min(kChunk, piece.size() - start);
      for (size_t i = 0; i < n; ++i) {
        const int32_t t = piece[start + i];
        if (t < 0 || t >= vocab_)
          throw InputError(fmt::format(
              "token id {} at position {} written to '{}' is outside the vocab [0, {})", t,
              count_ + static_cast<int64_t>(start + i), paths_.bin, vocab_));
        if (dtype_ == TokenDtype::u16) {
          const auto v = static_cast<uint16_t>(t);
          std::memcpy(buf + 2 * i, &v, 2);
        } else {
          std::memcpy(buf + 4 * i, &t, 4);
        }
      }
      checksum_.update(buf, static_cast<int64_t>(n * width));
      bin_write(buf, n * width);
      count_ += static_cast<int64_t>(n);
    }
    lengths_.push_back(static_cast<int32_t>(piece.size()));
    tokens = tokens.subspan(piece.size());
  } while (!tokens.empty());
}

void MegatronWriter::document_end() {
  document_index_.push_back(static_cast<int64_t>(lengths_.size()));
}

MegatronWritten MegatronWriter::finish() {
  WEFT_ASSERT(bin_ != nullptr);
  if (document_index_.back() != static_cast<int64_t>(lengths_.size())) document_end();
  const bool ok = std::fflush(bin_) == 0 && ::fsync(fileno(bin_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(bin_) == 0;
  bin_ = nullptr;
  if (!ok || !closed)
    throw InputError(fmt::format("cannot write '{}': {}", bin_tmp_, std::strerror(err)));

  idx_write(idx_tmp_, dtype_, code_from_dtype(dtype_), lengths_, document_index_);

  std::error_code ec;
  fs::rename(bin_tmp_, paths_.bin, ec);
  if (!ec) fs::rename(idx_tmp_, paths_.idx, ec);
  if (ec) {
    fs::remove(bin_tmp_, ec);
    throw InputError(fmt::format("cannot rename into '{}': {}", paths_.prefix, ec.message()));
  }
  MegatronWritten w;
  w.info.dtype = dtype_;
  w.info.tokens = count_;
  w.info.sequences = static_cast<int64_t>(lengths_.size());
  w.info.documents = static_cast<int64_t>(document_index_.size()) - 1;
  w.checksum = checksum_.digest();
  return w;
}

}  // namespace weft::data
