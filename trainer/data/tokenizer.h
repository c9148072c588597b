// Tokenizers for `weft data prepare`. Built in: "byte", vocab 256, where the
// token is the byte (UTF-8 text becomes its bytes): no merges to learn or
// ship, every input is representable, and the train/val splits and the
// unigram baseline are exact in bytes. A Hugging Face tokenizer.json (BPE)
// is the planned second kind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace weft::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab() const = 0;
  // Appends the tokens of `text` to `out`.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // InputError for an id outside [0, vocab).
  virtual std::string decode(const std::vector<int32_t>& tokens) const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab() const override { return 256; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(const std::vector<int32_t>& tokens) const override;
};

// "byte" -> ByteTokenizer. A path ending in .json is refused as not supported
// yet; anything else is refused with the valid names. Both InputError.
std::unique_ptr<Tokenizer> tokenizer_create(const std::string& name);

}  // namespace weft::data
