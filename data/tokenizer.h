// Tokenizers for `weft data prepare`.
//
//   byte           built in, vocab 256: the token is the byte (UTF-8 text
//                  becomes its bytes). No merges to learn or ship, every
//                  input is representable, and the splits and the unigram
//                  baseline are exact in bytes. No document tokens.
//   tokenizer.json a Hugging Face byte-level BPE (Llama 3, GPT-2), through
//                  PCRE2 (hf_tokenizer.h); needs a build with PCRE2.
//   tokenizer.model a SentencePiece model (Llama 2), through libsentencepiece
//                  (sp_tokenizer.h); needs a build with SentencePiece.
//
// The text tokenizers work on Unicode text: invalid UTF-8 is repaired first,
// one U+FFFD per maximal invalid subpart (utf8.h), as Python's and Rust's
// lossy decoders do. The byte tokenizer keeps every byte as it is.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::data {

// One thread's encoding state (caches, regex match buffers). Encoders are
// cheap to make and not shared between threads; the Tokenizer is.
class TokenEncoder {
 public:
  virtual ~TokenEncoder() = default;
  // Appends the ids of `text` to `out`, without document tokens.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) = 0;
};

// The ids the tokenizer puts around each document (BOS before, EOS after),
// as its file says: a tokenizer.json's post-processor, a SentencePiece
// model's bos and eos ids.
struct DocumentTokens {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
  std::string description;  // for people: "BOS <|begin_of_text|> (128000) before, no EOS"
};

// The file a tokenizer was read from, recorded in meta.json.
struct TokenizerFile {
  std::string path;  // absolute
  int64_t bytes = 0;
  uint64_t xxh64 = 0;
};

// The record of a tokenizer file held in memory.
TokenizerFile tokenizer_file_describe(const std::string& path, const uint8_t* data, int64_t bytes);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The kind: "byte", "hf-bpe" or "sentencepiece".
  virtual std::string name() const = 0;
  // Ids are in [0, vocab).
  virtual int64_t vocab() const = 0;
  virtual const DocumentTokens& document_tokens() const = 0;
  virtual std::optional<TokenizerFile> file() const { return std::nullopt; }
  // Whether encode() reads text as UTF-8 (and so repairs invalid input).
  virtual bool reads_utf8() const { return true; }
  virtual std::unique_ptr<TokenEncoder> encoder() const = 0;
  // InputError for an id outside [0, vocab).
  virtual std::string decode(const std::vector<int32_t>& tokens) const = 0;

  // One-off encoding through a fresh encoder (which loses its caches).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // The document's tokens: prefix, text, suffix.
  void encode_document(TokenEncoder& encoder, std::string_view text,
                       std::vector<int32_t>& out) const;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab() const override { return 256; }
  const DocumentTokens& document_tokens() const override;
  bool reads_utf8() const override { return false; }
  std::unique_ptr<TokenEncoder> encoder() const override;
  std::string decode(const std::vector<int32_t>& tokens) const override;
};

// `spec` is "byte" or the path of a tokenizer file: a Hugging Face
// tokenizer.json (a .json path, or a file starting with '{') or a
// SentencePiece tokenizer.model (anything else). InputError for an unknown
// name, a missing file or a format this build lacks; FileFormatError naming
// the file when it is not a tokenizer of its kind or uses what weft does not
// support.
std::unique_ptr<Tokenizer> tokenizer_create(const std::string& spec);

}  // namespace weft::data
