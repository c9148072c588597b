#include "data/byte_level.h"

#include "data/utf8.h"

namespace weft::data {

namespace {

std::array<uint32_t, 256> make_chars() {
  std::array<uint32_t, 256> chars{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    chars[b] = printable ? b : next++;
  }
  return chars;
}

// Inverse over U+0000..U+01FF (every code point the table uses); -1 elsewhere.
std::array<int16_t, 512> make_bytes() {
  std::array<int16_t, 512> bytes;
  bytes.fill(-1);
  const auto& chars = byte_level_chars();
  for (int b = 0; b < 256; ++b) bytes[chars[b]] = static_cast<int16_t>(b);
  return bytes;
}

}  // namespace

const std::array<uint32_t, 256>& byte_level_chars() {
  static const std::array<uint32_t, 256> chars = make_chars();
  return chars;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
  static const std::array<int16_t, 512> bytes = make_bytes();
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    int len = 0;
    const uint32_t cp = utf8_decode(text, pos, len);
    if (cp >= bytes.size() || bytes[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(bytes[cp]));
    pos += static_cast<size_t>(len);
  }
  return out;
}

std::string byte_level_encode(std::string_view raw) {
  const auto& chars = byte_level_chars();
  std::string out;
  out.reserve(raw.size() * 2);
  for (const char c : raw) utf8_append(out, chars[static_cast<unsigned char>(c)]);
  return out;
}

}  // namespace weft::data
