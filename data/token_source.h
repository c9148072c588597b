// TokenSource: one read-only sequence of token ids, whatever file holds it.
//
// Every on-disk format (weft's .tok, llm.c .bin, numpy .npy, Megatron
// .bin/.idx) comes down to a little-endian array of one integer type at some
// offset of a file, so a single mmap-backed implementation serves them all; a
// format only has to say where the array starts, its dtype and its length.
// Directories of shards are read as the concatenation of their files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace weft::data {

class MappedFile;

enum class TokenDtype { u8, i8, u16, i16, u32, i32, i64 };

int64_t dtype_bytes(TokenDtype dtype);
const char* dtype_name(TokenDtype dtype);  // "uint16", ...

// A token id that is not in [0, vocab), found by a scan.
struct BadToken {
  int64_t position = 0;  // index in the source
  int64_t value = 0;     // the id as stored
};

class TokenSource;

// One part of the data that samples are drawn from, and its share of them.
struct WeightedPart {
  const TokenSource* source = nullptr;
  double weight = 1;
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  virtual int64_t size() const = 0;   // tokens
  virtual int64_t vocab() const = 0;  // vocab the file declares, 0 when it does not say
  // The id at `index` in [0, size()), exactly as stored.
  virtual int64_t token(int64_t index) const = 0;
  // Copies `count` ids starting at `start` into `out` (count). The ids are
  // narrowed to int32; validate_vocab() first so that every id fits.
  virtual void tokens_copy(int64_t start, int64_t count, int32_t* out) const = 0;
  // The first id outside [0, vocab), if any. The default uses token().
  virtual std::optional<BadToken> token_find_bad(int64_t vocab) const;
  // For messages: "llm.c .bin 'data/x.bin' (uint16, 1000 tokens)".
  virtual std::string describe() const = 0;
  // The parts the loader draws samples from, each with its weight: a blend's
  // parts (blend.h); any other source is one part of weight 1, itself.
  virtual std::vector<WeightedPart> blend_parts() const { return {{this, 1.0}}; }
};

// A source over tokens stored in a mapped file region.
class MappedTokenSource final : public TokenSource {
 public:
  // `offset` bytes into `file`, `count` ids of `dtype`; the caller has checked
  // that they fit. `format` names the file format for messages.
  MappedTokenSource(std::shared_ptr<const MappedFile> file, std::string format, int64_t offset,
                    TokenDtype dtype, int64_t count, int64_t vocab);
  int64_t size() const override { return count_; }
  int64_t vocab() const override { return vocab_; }
  int64_t token(int64_t index) const override;
  void tokens_copy(int64_t start, int64_t count, int32_t* out) const override;
  std::optional<BadToken> token_find_bad(int64_t vocab) const override;
  std::string describe() const override;
  TokenDtype dtype() const { return dtype_; }
  const std::string& format() const { return format_; }
  const uint8_t* payload() const { return payload_; }
  const MappedFile& file() const { return *file_; }

 private:
  std::shared_ptr<const MappedFile> file_;
  std::string format_;
  const uint8_t* payload_;
  TokenDtype dtype_;
  int64_t count_;
  int64_t vocab_;
};

// Tokens held in memory: tests, and text tokenized on the fly.
class MemoryTokenSource final : public TokenSource {
 public:
  MemoryTokenSource(std::vector<int32_t> tokens, int64_t vocab, std::string name = "memory");
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t vocab() const override { return vocab_; }
  int64_t token(int64_t index) const override;
  void tokens_copy(int64_t start, int64_t count, int32_t* out) const override;
  std::string describe() const override;

 private:
  std::vector<int32_t> tokens_;
  int64_t vocab_;
  std::string name_;
};

// Shards read back to back as one source (llm.c and Megatron corpora come as
// many files). Declared vocab: the largest a part declares.
class ConcatTokenSource final : public TokenSource {
 public:
  explicit ConcatTokenSource(std::vector<std::unique_ptr<TokenSource>> parts);
  int64_t size() const override { return starts_.back(); }
  int64_t vocab() const override { return vocab_; }
  int64_t token(int64_t index) const override;
  void tokens_copy(int64_t start, int64_t count, int32_t* out) const override;
  std::optional<BadToken> token_find_bad(int64_t vocab) const override;
  std::string describe() const override;
  int64_t parts() const { return static_cast<int64_t>(parts_.size()); }
  const TokenSource& part(int64_t p) const { return *parts_[static_cast<size_t>(p)]; }

 private:
  int64_t part_of(int64_t index) const;
  std::vector<std::unique_ptr<TokenSource>> parts_;
  std::vector<int64_t> starts_;  // (parts + 1) prefix sums of part sizes
  int64_t vocab_ = 0;
};

// Scans the whole source once and throws InputError naming the first id that
// is negative or >= `vocab` (the model's), its position and the source.
void validate_vocab(const TokenSource& source, int64_t vocab);

// The entropy in nats/token of the source's token frequencies: the loss of a
// model that knows only how often each token occurs (the unigram baseline).
// For a blend, of the mixture its weights draw: sum over parts of weight times
// the part's frequency of each token.
double unigram_entropy(const TokenSource& source);

}  // namespace weft::data
