// A Hugging Face pre-tokenizer's Split regex through PCRE2 (JIT, UTF and
// Unicode-property mode), splitting text the way the reference library's
// Oniguruma regexes do.
//
// Syntax: the patterns these tokenizers use (\p{L}, \p{N}, (?i:...),
// lookahead, possessive and counted repeats) mean the same in both engines
// with one exception, which the pattern is rewritten for: Oniguruma's \s is
// Unicode's White_Space and so includes U+0085 (NEXT LINE), which PCRE2's
// \s (the separators Z plus \t \n \v \f \r) does not. \S inside a character
// class cannot be rewritten that way and is refused.
//
// Splitting ("Isolated"): the matches, and the text between them, in order,
// empty pieces dropped. Matches are found as Oniguruma's find_iter finds
// them: each search starts where the last match ended, and an empty match
// right at that end is skipped by one character.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::data {

// A piece of the text: (offset, bytes).
using TextPiece = std::pair<size_t, size_t>;

// Oniguruma's pattern in PCRE2's syntax (see above); FileFormatError for \S
// in a class, with `where` naming the file.
std::string split_regex_translate(std::string_view pattern, const std::string& where);

class SplitRegex {
 public:
  // Compiles `pattern` (Oniguruma syntax); FileFormatError naming `where`,
  // the pattern and PCRE2's message when it does not compile.
  SplitRegex(std::string_view pattern, const std::string& where);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Per-thread match state: PCRE2's match data and JIT stack.
  class Matcher {
   public:
    explicit Matcher(const SplitRegex& regex);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // Appends the pieces of `text` (valid UTF-8) to `out`: the matches and
    // the text between them, or with `remove_matches` only the text between.
    void split(std::string_view text, bool remove_matches, std::vector<TextPiece>& out);

   private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
  };

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::data
