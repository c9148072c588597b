// A tiny hand-made byte-level BPE tokenizer.json for the tokenizer tests,
// and the reference fixtures' location.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/byte_level.h"
#include "data/utf8.h"

namespace weft::test {

inline std::string fixture_path(const std::string& name) {
  return std::string(WEFT_FIXTURES_DIR) + "/" + name;
}

// GPT-2's ByteLevel pre-tokenizer, with or without the prefix space.
inline nlohmann::json gpt2_pre_tokenizer(bool prefix_space = false) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", prefix_space},
          {"trim_offsets", true},
          {"use_regex", true}};
}

// Every byte as a token (id = the byte), then the merges
//   h e -> 256, l l -> 257, he ll -> 258, hell o -> 259, Ġ w -> 260, o r -> 261
// and "Ġworld" (262), which no merge reaches: only ignore_merges finds it.
// The ids expected from it in the tests are what Hugging Face tokenizers
// 0.23.3 gives for the same JSON.
inline nlohmann::json tiny_tokenizer(bool ignore_merges,
                                     nlohmann::json pre_tokenizer = gpt2_pre_tokenizer()) {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& chars = data::byte_level_chars();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    data::utf8_append(s, chars[b]);
    vocab[s] = b;
  }
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\u0120", "w"}, {"o", "r"}};
  nlohmann::json merge_list = nlohmann::json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(a + " " + b);
  }
  vocab["\u0120world"] = next;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", nullptr},
          {"decoder", gpt2_pre_tokenizer(true)},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

}  // namespace weft::test
