// GPT-2's byte-to-unicode table, which byte-level BPE vocabularies (GPT-2,
// Llama 3, and every Hugging Face "ByteLevel" tokenizer) are written in.
//
// Each byte stands for one printable code point so that a vocab entry is a
// readable string: the printable Latin-1 bytes ('!'..'~', 0xA1..0xAC,
// 0xAE..0xFF) stand for themselves, the other 68 bytes (controls, space,
// 0x7F..0xA0, 0xAD) for U+0100 upwards in byte order, so a space is 'Ġ'
// (U+0120) and a newline 'Ċ' (U+010A). weft reads the vocab back into raw
// bytes once, at load, and works on bytes from then on.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weft::data {

// The code point that stands for each byte.
const std::array<uint32_t, 256>& byte_level_chars();

// The raw bytes a byte-level string stands for; nullopt when it holds a code
// point outside the table (such an entry is not byte-level, and no text can
// produce it). `text` must be valid UTF-8.
std::optional<std::string> byte_level_decode(std::string_view text);

// The byte-level string of raw bytes.
std::string byte_level_encode(std::string_view bytes);

}  // namespace weft::data
