#include "trainer/data/tokenizer.h"

#include <fmt/format.h>

#include "core/error.h"

namespace weft::data {

void ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size());
  for (const char c : text) out.push_back(static_cast<unsigned char>(c));
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

std::unique_ptr<Tokenizer> tokenizer_create(const std::string& name) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0)
    throw InputError(
        fmt::format("--tokenizer {}: Hugging Face tokenizer.json (BPE) is not supported yet; use "
                    "--tokenizer byte",
                    name));
  throw InputError(fmt::format("unknown tokenizer '{}'; valid: byte", name));
}

}  // namespace weft::data
