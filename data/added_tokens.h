// Splitting a Hugging Face tokenizer's added tokens (special ones such as
// <|begin_of_text|>, and plain added ones) out of text before it is
// pre-tokenized, as the reference's AddedVocabulary does: first the tokens
// matched on raw text (normalized false), then, in the text between those,
// the ones matched after normalization (normalized true; weft supports no
// normalizer, so on the same text). Each pass takes the leftmost match and,
// among matches there, the longest.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "data/hf_tokenizer_json.h"

namespace weft::data {

// A run of the input: plain text (id -1) or one added token.
struct TextRun {
  size_t offset = 0;
  size_t bytes = 0;
  int32_t id = -1;
};

class AddedTokenSplitter {
 public:
  explicit AddedTokenSplitter(const std::vector<HfAddedToken>& tokens);

  // Replaces `runs` with the runs of `text` in order;
  // text runs are never empty. `scratch` is the caller's working memory.
  void split(std::string_view text, std::vector<TextRun>& runs,
             std::vector<TextRun>& scratch) const;

 private:
  // A byte trie: edges sorted by byte; a node's token id, -1 when none.
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;
    int32_t id = -1;
  };
  struct Trie {
    std::vector<Node> nodes{1};
    bool first[256] = {};  // bytes some token starts with
    bool empty() const { return nodes.size() == 1; }
    void insert(std::string_view token, int32_t id);
    // The longest token at text[pos]: its length, 0 when none.
    size_t longest(std::string_view text, size_t pos, int32_t& id) const;
  };
  static void split_pass(const Trie& trie, std::string_view text, size_t base,
                         std::vector<TextRun>& out);
  Trie raw_, normalized_;
};

}  // namespace weft::data
