#include "data/tokenizer.h"

#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "data/checksum.h"
#include "data/mapped_file.h"
#if WEFT_HAVE_PCRE2
#include "data/hf_tokenizer.h"
#endif
#if WEFT_HAVE_SENTENCEPIECE
#include "data/sp_tokenizer.h"
#endif

namespace weft::data {

namespace {

class ByteEncoder final : public TokenEncoder {
 public:
  void encode(std::string_view text, std::vector<int32_t>& out) override {
    out.reserve(out.size() + text.size());
    for (const char c : text) out.push_back(static_cast<unsigned char>(c));
  }
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

enum class TokenizerKind { hf_json, sentencepiece };

TokenizerKind kind_of(const std::string& path) {
  if (ends_with(path, ".json")) return TokenizerKind::hf_json;
  if (ends_with(path, ".model")) return TokenizerKind::sentencepiece;
  const MappedFile f(path, "tokenizer file");
  for (int64_t i = 0; i < f.size(); ++i) {
    const char c = static_cast<char>(f.data()[i]);
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{' ? TokenizerKind::hf_json : TokenizerKind::sentencepiece;
  }
  return TokenizerKind::sentencepiece;
}

}  // namespace

TokenizerFile tokenizer_file_describe(const std::string& path, const uint8_t* data, int64_t bytes) {
  return {std::filesystem::absolute(path).lexically_normal().string(), bytes,
          checksum64(data, bytes)};
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  encoder()->encode(text, out);
}

void Tokenizer::encode_document(TokenEncoder& encoder, std::string_view text,
                                std::vector<int32_t>& out) const {
  const DocumentTokens& d = document_tokens();
  out.insert(out.end(), d.prefix.begin(), d.prefix.end());
  encoder.encode(text, out);
  out.insert(out.end(), d.suffix.begin(), d.suffix.end());
}

const DocumentTokens& ByteTokenizer::document_tokens() const {
  static const DocumentTokens none{{}, {}, "no BOS or EOS"};
  return none;
}

std::unique_ptr<TokenEncoder> ByteTokenizer::encoder() const {
  return std::make_unique<ByteEncoder>();
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 255)
      throw InputError(
          fmt::format("token id {} at position {} is not a byte token (0-255)", tokens[i], i));
    text.push_back(static_cast<char>(tokens[i]));
  }
  return text;
}

std::unique_ptr<Tokenizer> tokenizer_create(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  std::error_code ec;
  if (!std::filesystem::exists(spec, ec)) {
    if (ends_with(spec, ".json") || ends_with(spec, ".model") ||
        spec.find('/') != std::string::npos)
      throw InputError(fmt::format("tokenizer file '{}' does not exist", spec));
    throw InputError(fmt::format(
        "unknown tokenizer '{}'; valid: byte, or the path of a Hugging Face tokenizer.json or a "
        "SentencePiece tokenizer.model",
        spec));
  }
  if (std::filesystem::is_directory(spec, ec))
    throw InputError(fmt::format(
        "tokenizer '{}' is a folder; pass its tokenizer.json or tokenizer.model", spec));
  switch (kind_of(spec)) {
    case TokenizerKind::hf_json:
#if WEFT_HAVE_PCRE2
      return hf_tokenizer_load(spec);
#else
      throw InputError(fmt::format(
          "tokenizer '{}': this weft was built without PCRE2, which Hugging Face tokenizer.json "
          "files need; install libpcre2-dev (tools/setup.sh does) and rebuild",
          spec));
#endif
    case TokenizerKind::sentencepiece:
#if WEFT_HAVE_SENTENCEPIECE
      return sp_tokenizer_load(spec);
#else
      throw InputError(fmt::format(
          "tokenizer '{}': this weft was built without SentencePiece, which tokenizer.model files "
          "need; install libsentencepiece-dev (tools/setup.sh does) and rebuild",
          spec));
#endif
  }
  throw InternalError("unreachable tokenizer kind");
}

}  // namespace weft::data
