// UTF-8 checking and repair for the text tokenizers (Hugging Face BPE,
// SentencePiece), which work on Unicode text, not bytes.
//
// Invalid input is repaired, not refused: each maximal subpart of an
// ill-formed sequence becomes one U+FFFD (Unicode 15, section 3.9, "U+FFFD
// substitution of maximal subparts"). This is what Python's
// bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy
// do, so a corpus read that way by a Hugging Face pipeline tokenizes to the
// same ids. Examples: "\xC3(" -> U+FFFD "(", "\xE2\x82" at the end -> one
// U+FFFD, "\xED\xA0\x80" (a surrogate) -> three U+FFFD, "\xC0\xAF"
// (overlong) -> two U+FFFD.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weft::data {

struct Utf8Check {
  int64_t invalid = 0;        // ill-formed subparts, each replaced by one U+FFFD
  int64_t first_offset = -1;  // byte offset of the first one, -1 when valid
};

// Scans `text` (an ASCII fast path, then the well-formed sequences of
// Unicode's table 3-7).
Utf8Check utf8_check(std::string_view text);

// `text` itself when it is valid UTF-8; otherwise the repaired text, written
// into `scratch` (which the returned view then points into).
std::string_view utf8_repair(std::string_view text, std::string& scratch);

// The code point starting at `text[pos]` of valid UTF-8, and its length in
// bytes through `len`.
uint32_t utf8_decode(std::string_view text, size_t pos, int& len);

// Appends the UTF-8 form of code point `cp` (below 0x110000) to `out`.
void utf8_append(std::string& out, uint32_t cp);

}  // namespace weft::data
