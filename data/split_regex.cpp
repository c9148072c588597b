#include "data/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include "core/error.h"
#include "data/utf8.h"

namespace weft::data {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return fmt::format("error {}", code);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string split_regex_translate(std::string_view pattern, const std::string& where) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  size_t class_start = 0;  // where the class's members begin (after '[' or "[^")
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S') {
        if (in_class)
          throw FileFormatError(fmt::format(
              "{}: the pre-tokenizer regex uses \\S inside a character class, which weft cannot "
              "match exactly as the reference does",
              where));
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class, [:alpha:]
      if (end != std::string_view::npos) {
        out.append(pattern.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

// ---- compiled pattern -------------------------------------------------------

struct SplitRegex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
};

SplitRegex::SplitRegex(std::string_view pattern, const std::string& where)
    : impl_(std::make_unique<Impl>()) {
  const std::string translated = split_regex_translate(pattern, where);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!impl_->code)
    throw FileFormatError(
        fmt::format("{}: the pre-tokenizer regex '{}' does not compile: {} at offset {}", where,
                    pattern, pcre2_message(error), offset));
  // Without JIT support (some platforms) the interpreter gives the same
  // matches, several times slower.
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::~SplitRegex() { pcre2_code_free(impl_->code); }

// ---- matching ---------------------------------------------------------------

struct SplitRegex::Matcher::Impl {
  const SplitRegex::Impl* regex;
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
};

SplitRegex::Matcher::Matcher(const SplitRegex& regex) : impl_(std::make_unique<Impl>()) {
  impl_->regex = regex.impl_.get();
  impl_->data = pcre2_match_data_create_from_pattern(impl_->regex->code, nullptr);
  impl_->context = pcre2_match_context_create(nullptr);
  if (impl_->regex->jit) {
    // The default 32 KiB JIT stack can run out on long runs of one class
    // (a megabyte of spaces); it grows to 64 MiB here.
    impl_->stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(impl_->context, nullptr, impl_->stack);
  }
  if (!impl_->data || !impl_->context || (impl_->regex->jit && !impl_->stack))
    throw std::bad_alloc();
}

SplitRegex::Matcher::~Matcher() {
  pcre2_jit_stack_free(impl_->stack);
  pcre2_match_context_free(impl_->context);
  pcre2_match_data_free(impl_->data);
}

void SplitRegex::Matcher::split(std::string_view text, bool remove_matches,
                                std::vector<TextPiece>& out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t prev = 0;             // end of the last piece
  size_t from = 0;             // where the next search starts
  size_t last_end = SIZE_MAX;  // end of the last match
  while (from <= n) {
    const int rc = impl_->regex->jit ? pcre2_jit_match(impl_->regex->code, subject, n, from, 0,
                                                       impl_->data, impl_->context)
                                     : pcre2_match(impl_->regex->code, subject, n, from,
                                                   PCRE2_NO_UTF_CHECK, impl_->data, impl_->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw InputError(fmt::format("the pre-tokenizer regex failed on a piece of {} bytes: {}", n,
                                   pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(impl_->data);
    const size_t start = ov[0], end = ov[1];
    if (start == end && end == last_end) {
      // An empty match where the last one ended: step over one character.
      int len = 1;
      if (from < n) utf8_decode(text, from, len);
      from += static_cast<size_t>(len);
      continue;
    }
    if (start > prev) out.emplace_back(prev, start - prev);
    if (end > start && !remove_matches) out.emplace_back(start, end - start);
    prev = end;
    from = end;
    last_end = end;
  }
  if (n > prev) out.emplace_back(prev, n - prev);
}

}  // namespace weft::data
