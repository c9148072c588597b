// Reading a Hugging Face tokenizer.json into what weft's byte-level BPE needs.
//
// Supported: the byte-level BPE family of Llama 3 and GPT-2.
//   normalizer      null
//   pre_tokenizer   Split(Regex, behavior Isolated or Removed, invert false),
//                   any number, then ByteLevel (add_prefix_space, use_regex);
//                   or ByteLevel alone; a Sequence of these
//   model           BPE: ignore_merges, unk_token and fuse_unk read; no
//                   dropout, byte_fallback, continuing_subword_prefix or
//                   end_of_word_suffix
//   added_tokens    any, with lstrip, rstrip and single_word false
//   post_processor  null, ByteLevel, TemplateProcessing, or a Sequence of them
//   decoder         null or ByteLevel
//   truncation, padding  null
// Anything else is refused with a FileFormatError naming the component, so
// weft never silently tokenizes differently from the file's own library.
// This file parses and checks only; it needs no regex engine.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::data {

// GPT-2's pre-tokenizer regex, which ByteLevel applies when use_regex is true.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct HfSplitRule {
  std::string pattern;          // Oniguruma syntax, as the file has it
  bool remove_matches = false;  // behavior Removed: the matches are dropped
};

struct HfAddedToken {
  int32_t id = 0;
  std::string content;  // raw text, matched in the input before pre-tokenizing
  bool special = false;
  bool normalized = false;  // matched after the normalizer (null here: same text)
};

struct HfTokenizerSpec {
  // Pre-tokenizer: the Split rules in order, each applied to every piece of
  // the one before; then ByteLevel's optional prefix space and regex.
  std::vector<HfSplitRule> splits;
  bool prefix_space = false;      // ByteLevel add_prefix_space
  bool byte_level_regex = false;  // ByteLevel use_regex: kGpt2Pattern after the prefix space

  // BPE over raw bytes: the vocab's byte-level strings decoded at load.
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
  bool ignore_merges = false;  // a pre-token that is a vocab entry is taken whole
  int32_t unk = -1;            // id for a byte with no token, -1: such bytes are dropped
  bool fuse_unk = false;

  std::vector<HfAddedToken> added;

  // What the post-processor puts around a sequence (TemplateProcessing's
  // "single" template), by id and by name.
  std::vector<int32_t> prefix, suffix;
  std::vector<std::string> prefix_names, suffix_names;

  int64_t vocab_size = 0;  // 1 + the largest id of the vocab and the added tokens
};

// Checks and reads a parsed tokenizer.json; FileFormatError naming `path`
// and the unsupported component or the malformed field.
HfTokenizerSpec hf_tokenizer_parse(const nlohmann::json& file, const std::string& path);

}  // namespace weft::data
