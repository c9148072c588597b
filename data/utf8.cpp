#include "data/utf8.h"

#include <cstring>

namespace weft::data {

namespace {

// Length of the well-formed sequence at text[pos], or 0 when it is not one;
// then `subpart` is the length of the maximal subpart to replace (>= 1).
int sequence_length(const unsigned char* p, size_t n, int& subpart) {
  const unsigned char b = p[0];
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;  // no overlong forms
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;  // no overlong forms
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    subpart = 1;  // a continuation byte, C0, C1 or F5..FF: never starts a sequence
    return 0;
  }
  int k = 1;
  for (; k < need; ++k) {
    if (static_cast<size_t>(k) >= n) break;
    const unsigned char c = p[k];
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) break;
  }
  if (k == need) return need;
  subpart = k;
  return 0;
}

// Bytes from `pos` on that are plain ASCII, eight at a time.
size_t ascii_run(const unsigned char* p, size_t n, size_t pos) {
  while (pos + 8 <= n) {
    uint64_t w;
    std::memcpy(&w, p + pos, 8);
    if (w & 0x8080808080808080ull) break;
    pos += 8;
  }
  while (pos < n && p[pos] < 0x80) ++pos;
  return pos;
}

}  // namespace

Utf8Check utf8_check(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  Utf8Check r;
  size_t pos = 0;
  while ((pos = ascii_run(p, n, pos)) < n) {
    int subpart = 0;
    const int len = sequence_length(p + pos, n - pos, subpart);
    if (len > 0) {
      pos += static_cast<size_t>(len);
      continue;
    }
    if (r.invalid++ == 0) r.first_offset = static_cast<int64_t>(pos);
    pos += static_cast<size_t>(subpart);
  }
  return r;
}

std::string_view utf8_repair(std::string_view text, std::string& scratch) {
  const Utf8Check c = utf8_check(text);
  if (c.invalid == 0) return text;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  scratch.clear();
  scratch.reserve(n + 2 * static_cast<size_t>(c.invalid));
  size_t pos = static_cast<size_t>(c.first_offset);
  scratch.append(text.data(), pos);
  while (pos < n) {
    const size_t end = ascii_run(p, n, pos);
    scratch.append(text.data() + pos, end - pos);
    pos = end;
    if (pos == n) break;
    int subpart = 0;
    const int len = sequence_length(p + pos, n - pos, subpart);
    if (len > 0) {
      scratch.append(text.data() + pos, static_cast<size_t>(len));
      pos += static_cast<size_t>(len);
    } else {
      scratch.append("\xEF\xBF\xBD");
      pos += static_cast<size_t>(subpart);
    }
  }
  return scratch;
}

uint32_t utf8_decode(std::string_view text, size_t pos, int& len) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  if (p[0] < 0x80) {
    len = 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    len = 2;
    return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    len = 3;
    return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  len = 4;
  return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
         (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace weft::data
