// The parts of the byte-level BPE tokenizer, each against its definition:
// UTF-8 repair (Unicode's maximal subparts), GPT-2's byte table, the
// tokenizer.json reader's refusals, added-token splitting, the regex
// rewrite for PCRE2, and the two merge strategies against each other.
#include <random>

#include <gtest/gtest.h>

#include "../test_util.h"
#include "core/error.h"
#include "tokenizer_test_util.h"
#include "data/added_tokens.h"
#include "data/bpe.h"
#include "data/byte_level.h"
#include "data/hf_tokenizer_json.h"
#include "data/string_table.h"
#include "data/utf8.h"
#if WEFT_HAVE_PCRE2
#include "data/split_regex.h"
#endif

namespace weft::test {
namespace {

using namespace weft::data;
using nlohmann::json;

// ---- UTF-8 ------------------------------------------------------------------

TEST(Utf8, RepairsEachMaximalSubpartWithOneReplacement) {
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  // Inputs and Python's bytes.decode("utf-8", errors="replace") of them.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plain ascii", "plain ascii"},
      {"caf\xC3\xA9 \xF0\x9F\x8C\x8D", "caf\xC3\xA9 \xF0\x9F\x8C\x8D"},
      {"abc\x80"
       "def",
       "abc" + r + "def"},                  // lone continuation
      {"caf\xC3 ok", "caf" + r + " ok"},    // truncated 2-byte
      {"\xE2\x82 end", r + " end"},         // truncated 3-byte: one
      {"x\xC0\xAFy", "x" + r + r + "y"},    // overlong: C0 never starts
      {"\xED\xA0\x80", r + r + r},          // a surrogate
      {"\xF4\x90\x80\x80", r + r + r + r},  // above U+10FFFF
      {"\xF0\x9F\x8C", r},                  // truncated at the end
      {"\xFF\xFE", r + r},
      {"\xE0\x80\x80", r + r + r},          // overlong 3-byte
      {"\xF0\x80\x80\x80", r + r + r + r},  // overlong 4-byte
  };
  for (const auto& [in, want] : cases) {
    std::string scratch;
    EXPECT_EQ(std::string(utf8_repair(in, scratch)), want) << in;
  }
  EXPECT_EQ(utf8_check("ok").invalid, 0);
  EXPECT_EQ(utf8_check("ok").first_offset, -1);
  const Utf8Check c = utf8_check("0123456789abcdef\xE2\x82 \xFF");
  EXPECT_EQ(c.invalid, 2);
  EXPECT_EQ(c.first_offset, 16);
}

TEST(Utf8, ValidTextIsReturnedWithoutACopy) {
  const std::string text = "no copy \xE6\x9D\xB1\xE4\xBA\xAC";
  std::string scratch;
  EXPECT_EQ(utf8_repair(text, scratch).data(), text.data());
  EXPECT_TRUE(scratch.empty());
}

// ---- GPT-2's byte table -----------------------------------------------------

TEST(ByteLevel, MatchesGpt2sTable) {
  const auto& chars = byte_level_chars();
  EXPECT_EQ(chars['a'], uint32_t('a'));
  EXPECT_EQ(chars[' '], 0x120u);   // 'Ġ'
  EXPECT_EQ(chars['\n'], 0x10Au);  // 'Ċ'
  EXPECT_EQ(chars[0], 0x100u);
  EXPECT_EQ(chars[0xAD], 0x143u);  // 'Ń', the last byte that is not printable
  EXPECT_EQ(chars[0xFF], 0xFFu);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
  EXPECT_FALSE(byte_level_decode("<\xE2\x96\x81>").has_value());  // '▁' is not in the table
}

// ---- tokenizer.json: what is refused ----------------------------------------

TEST(HfTokenizerJson, ReadsTheTinyTokenizer) {
  const auto spec = hf_tokenizer_parse(tiny_tokenizer(true), "tiny.json");
  EXPECT_EQ(spec.vocab_size, 263);
  EXPECT_TRUE(spec.ignore_merges);
  EXPECT_TRUE(spec.splits.empty());
  EXPECT_TRUE(spec.byte_level_regex);
  EXPECT_FALSE(spec.prefix_space);
  ASSERT_EQ(spec.merges.size(), 6u);
  EXPECT_EQ(spec.merges[4], std::make_pair(std::string(" "), std::string("w")));
}

TEST(HfTokenizerJson, RefusesWhatItDoesNotSupportNamingTheComponent) {
  struct Case {
    std::function<void(json&)> change;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {[](json& j) {
         j["normalizer"] = {{"type", "NFC"}};
       },
       {"normalizer NFC"}},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       {"pre_tokenizer Whitespace"}},
      {[](json& j) { j["pre_tokenizer"] = nullptr; }, {"without a pre_tokenizer"}},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"String", " "}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}},
                                 gpt2_pre_tokenizer()}}};
       },
       {"Split with a String pattern"}},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"Regex", "\\s"}}},
                                  {"behavior", "MergedWithPrevious"},
                                  {"invert", false}},
                                 gpt2_pre_tokenizer()}}};
       },
       {"behavior MergedWithPrevious"}},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {gpt2_pre_tokenizer(), {{"type", "Digits"}}}}};
       },
       {"pre_tokenizer Digits after ByteLevel"}},
      {[](json& j) { j["model"]["type"] = "WordPiece"; }, {"model WordPiece"}},
      {[](json& j) { j["model"]["byte_fallback"] = true; }, {"byte_fallback", "tokenizer.model"}},
      {[](json& j) { j["model"]["dropout"] = 0.1; }, {"dropout"}},
      {[](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       {"continuing_subword_prefix"}},
      {[](json& j) {
         j["decoder"] = {{"type", "Metaspace"}};
       },
       {"decoder Metaspace"}},
      {[](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       {"post_processor BertProcessing"}},
      {[](json& j) {
         j["truncation"] = {{"max_length", 512}};
       },
       {"truncation"}},
      {[](json& j) {
         j["added_tokens"] = {{{"id", 263}, {"content", "<x>"}, {"lstrip", true}}};
       },
       {"added token '<x>' with lstrip true"}},
  };
  for (const auto& c : cases) {
    json j = tiny_tokenizer(true);
    c.change(j);
    try {
      hf_tokenizer_parse(j, "dir/tokenizer.json");
      ADD_FAILURE() << "accepted: " << c.says[0];
    } catch (const FileFormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("dir/tokenizer.json"), std::string::npos) << msg;
      for (const char* s : c.says) EXPECT_NE(msg.find(s), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST(HfTokenizerJson, RefusesMalformedFiles) {
  WEFT_EXPECT_THROW_MSG(hf_tokenizer_parse(json::array(), "t.json"), FileFormatError, "t.json",
                        "not a valid Hugging Face tokenizer.json");
  json j = tiny_tokenizer(true);
  j["model"]["merges"].push_back("q z");
  j["model"]["vocab"].erase("o");
  WEFT_EXPECT_THROW_MSG(hf_tokenizer_parse(j, "t.json"), FileFormatError, "merge",
                        "not in the vocab");
  j = tiny_tokenizer(true);
  j["model"]["merges"].push_back("a b c");
  WEFT_EXPECT_THROW_MSG(hf_tokenizer_parse(j, "t.json"), FileFormatError, "merge 6");
  j = tiny_tokenizer(true);
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
      {"special_tokens", json::object()}};
  WEFT_EXPECT_THROW_MSG(hf_tokenizer_parse(j, "t.json"), FileFormatError, "'<s>'",
                        "does not define");
  // One stray huge id would size the id-indexed tables in gigabytes (found
  // by fuzzing: an id of 1344444440 among 263 tokens).
  j = tiny_tokenizer(true);
  j["model"]["vocab"]["zz"] = 1344444440;
  WEFT_EXPECT_THROW_MSG(hf_tokenizer_parse(j, "t.json"), FileFormatError, "ids go up to 1344444440",
                        "only 264 tokens");
  // Gaps (unused ids below the specials, a test's id past 65535) are fine.
  j = tiny_tokenizer(true);
  j["model"]["vocab"]["zz"] = 300000;
  EXPECT_EQ(hf_tokenizer_parse(j, "t.json").vocab_size, 300001);
}

TEST(HfTokenizerJson, ReadsTheTemplatesDocumentTokensAndBothMergeForms) {
  json j = tiny_tokenizer(true);
  for (auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  j["added_tokens"] = {{{"id", 263}, {"content", "<s>"}, {"special", true}},
                       {{"id", 264}, {"content", "</s>"}, {"special", true}}};
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors",
                          {{{"type", "ByteLevel"}},
                           {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<s>"}}}},
                              {{"Sequence", {{"id", "A"}}}},
                              {{"SpecialToken", {{"id", "</s>"}}}}}},
                            {"special_tokens",
                             {{"<s>", {{"id", "<s>"}, {"ids", {263}}}},
                              {"</s>", {{"id", "</s>"}, {"ids", {264}}}}}}}}}};
  const auto spec = hf_tokenizer_parse(j, "t.json");
  EXPECT_EQ(spec.prefix, std::vector<int32_t>{263});
  EXPECT_EQ(spec.suffix, std::vector<int32_t>{264});
  EXPECT_EQ(spec.vocab_size, 265);
  EXPECT_EQ(spec.merges[0], std::make_pair(std::string("h"), std::string("e")));
}

// ---- added tokens -----------------------------------------------------------

TEST(AddedTokens, LeftmostThenLongestRawBeforeNormalized) {
  const std::vector<HfAddedToken> tokens = {{1, "<a>", true, false},
                                            {2, "<a><b>", true, false},
                                            {3, "<b>", true, false},
                                            {4, "ab", false, true}};
  const AddedTokenSplitter s(tokens);
  std::vector<TextRun> runs, scratch;
  const std::string text = "x<a><b>y<b><a>ab<a";
  s.split(text, runs, scratch);
  std::vector<std::pair<std::string, int32_t>> got;
  for (const auto& r : runs) got.emplace_back(text.substr(r.offset, r.bytes), r.id);
  const std::vector<std::pair<std::string, int32_t>> want = {
      {"x", -1}, {"<a><b>", 2}, {"y", -1}, {"<b>", 3}, {"<a>", 1}, {"ab", 4}, {"<a", -1}};
  EXPECT_EQ(got, want);
  s.split("", runs, scratch);
  EXPECT_TRUE(runs.empty());
}

// ---- the regex rewrite ------------------------------------------------------

#if WEFT_HAVE_PCRE2
TEST(SplitRegex, SpaceClassesIncludeNextLineAsOnigurumasDo) {
  EXPECT_EQ(split_regex_translate(R"(\s+(?!\S)|[^\s\p{L}]|[\s]|\d)", "t"),
            R"([\s\x{85}]+(?![^\s\x{85}])|[^\s\x{85}\p{L}]|[\s\x{85}]|\d)");
  EXPECT_EQ(split_regex_translate(R"([[:alpha:]\s]\\s)", "t"), R"([[:alpha:]\s\x{85}]\\s)");
  EXPECT_EQ(split_regex_translate(R"([]\s])", "t"), R"([]\s\x{85}])");
  WEFT_EXPECT_THROW_MSG(split_regex_translate(R"([^\S\r\n])", "t.json"), FileFormatError, "t.json",
                        "\\S inside a character class");

  const SplitRegex re(R"(\s+|\S+)", "t");
  SplitRegex::Matcher m(re);
  std::vector<TextPiece> pieces;
  m.split(
      "a\xC2\x85"
      "b",
      false, pieces);  // U+0085 is a space to Oniguruma
  EXPECT_EQ(pieces, (std::vector<TextPiece>{{0, 1}, {1, 2}, {3, 1}}));
}

TEST(SplitRegex, EmptyMatchesSplitAsOnigurumasFindIterDoes) {
  const SplitRegex re("x*", "t");
  SplitRegex::Matcher m(re);
  std::vector<TextPiece> pieces;
  m.split("abxxc", false, pieces);
  // Empty matches at 0 and 1 cut "a" and "b" apart; "xx" matches; the empty
  // match right after it is skipped, the one at the end is not.
  EXPECT_EQ(pieces, (std::vector<TextPiece>{{0, 1}, {1, 1}, {2, 2}, {4, 1}}));
  pieces.clear();
  m.split("a1b22", true, pieces);  // Removed: only the text between matches
  EXPECT_EQ(pieces.size(), 5u);
  const SplitRegex digits("\\d+", "t");
  SplitRegex::Matcher d(digits);
  pieces.clear();
  d.split("a1b22", true, pieces);
  EXPECT_EQ(pieces, (std::vector<TextPiece>{{0, 1}, {2, 1}}));
  WEFT_EXPECT_THROW_MSG(SplitRegex("(unclosed", "t.json"), FileFormatError, "t.json",
                        "does not compile");
}
#endif

// ---- merges -----------------------------------------------------------------

TEST(StringTable, FindsWhatWasInsertedThroughGrowthAndClear) {
  StringTable t;
  std::vector<std::string> keys = {"", "a", std::string("\0b", 2), "ab", "abc"};
  for (int i = 0; i < 5000; ++i) keys.push_back("key" + std::to_string(i * 7919));
  for (size_t i = 0; i < keys.size(); ++i) t.insert(keys[i], i * 3);
  EXPECT_EQ(t.size(), static_cast<int64_t>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t* v = t.find(keys[i]);
    ASSERT_NE(v, nullptr) << keys[i];
    EXPECT_EQ(*v, i * 3);
  }
  EXPECT_EQ(t.find("key1"), nullptr);
  EXPECT_EQ(t.find(std::string("\0", 1)), nullptr);
  t.insert("ab", 42);  // a value is replaced, not added
  EXPECT_EQ(*t.find("ab"), 42u);
  EXPECT_EQ(t.size(), static_cast<int64_t>(keys.size()));
  t.clear();
  EXPECT_EQ(t.size(), 0);
  EXPECT_EQ(t.find("abc"), nullptr);
  t.insert("abc", 1);
  EXPECT_EQ(*t.find("abc"), 1u);
}

TEST(Bpe, ScanAndHeapMergeAlike) {
  const auto spec = hf_tokenizer_parse(
      json::parse(std::ifstream(fixture_path("tokenizer_bpe.json"))), "tokenizer_bpe.json");
  const BpeModel model(spec);
  std::mt19937 rng(3);
  const std::string alphabet = "etaoinshrdlu ETAO.,'\n\xC3\xA9";
  for (int trial = 0; trial < 400; ++trial) {
    std::string word;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) word += alphabet[rng() % alphabet.size()];
    std::vector<int32_t> scan, heap;
    BpeState s1, s2;
    model.encode_word(word, scan, s1, MergeStrategy::scan);
    model.encode_word(word, heap, s2, MergeStrategy::heap);
    ASSERT_EQ(scan, heap) << word;
  }
}

TEST(Bpe, IgnoreMergesTakesAVocabWordWhole) {
  std::vector<int32_t> with, without;
  BpeState state;
  BpeModel(hf_tokenizer_parse(tiny_tokenizer(true), "t")).encode_word(" world", with, state);
  BpeModel(hf_tokenizer_parse(tiny_tokenizer(false), "t")).encode_word(" world", without, state);
  EXPECT_EQ(with, std::vector<int32_t>{262});
  EXPECT_EQ(without, (std::vector<int32_t>{260, 261, 108, 100}));
}

}  // namespace
}  // namespace weft::test
