// weft's tokenizers against the reference libraries, token for token: the
// fixtures tools/tokenizer_fixtures.py wrote with Hugging Face tokenizers
// and sentencepiece (a Llama-3-style BPE and a Llama-2-style SentencePiece
// model trained on the fortunes text; fortunes and edge cases, invalid
// UTF-8 included), and hand-made tokenizers whose ids were taken from
// Hugging Face tokenizers for the same JSON.
#include <fstream>

#include <gtest/gtest.h>

#include "../test_util.h"
#include "core/error.h"
#include "tokenizer_test_util.h"
#include "data/tokenizer.h"

namespace weft::test {
namespace {

using namespace weft::data;
using nlohmann::json;

std::string hex_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

json cases_file() {
  std::ifstream in(fixture_path("tokenizer_cases.json"));
  const json j = json::parse(in);
  EXPECT_EQ(j["format"], "weft-tokenizer-cases");
  EXPECT_EQ(j["version"], 1);
  return j;
}

// Encodes every case with `kind`'s tokenizer and compares with the fixture;
// returns how many cases matched.
int compare_cases(const char* kind, bool with_document_tokens) {
  const json file = cases_file();
  const auto tokenizer = tokenizer_create(fixture_path(file[kind]["file"]));
  auto encoder = tokenizer->encoder();
  int equal = 0;
  for (const auto& c : file["cases"]) {
    const std::string text =
        c.contains("text") ? c["text"].get<std::string>() : hex_bytes(c["hex"].get<std::string>());
    std::vector<int32_t> got;
    if (with_document_tokens)
      tokenizer->encode_document(*encoder, text, got);
    else
      encoder->encode(text, got);
    const auto want = c[kind].get<std::vector<int32_t>>();
    if (got == want) {
      ++equal;
      continue;
    }
    size_t at = 0;
    while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
    ADD_FAILURE() << kind << " case '" << c["name"].get<std::string>() << "': " << got.size()
                  << " ids, the reference " << want.size() << ", first difference at " << at;
  }
  EXPECT_GE(file["cases"].size(), 50u);
  return equal;
}

#if WEFT_HAVE_PCRE2
TEST(HfTokenizer, EqualsHuggingFaceOnEveryFixtureCase) {
  const json file = cases_file();
  EXPECT_EQ(compare_cases("hf", true), static_cast<int>(file["cases"].size()));
  const auto t = tokenizer_create(fixture_path("tokenizer_bpe.json"));
  EXPECT_EQ(t->name(), "hf-bpe");
  EXPECT_EQ(t->vocab(), 1006);
  EXPECT_EQ(t->document_tokens().prefix, std::vector<int32_t>{file["hf"]["bos"].get<int32_t>()});
  EXPECT_TRUE(t->document_tokens().suffix.empty());
  EXPECT_NE(t->document_tokens().description.find("<|begin_of_text|>"), std::string::npos);
  ASSERT_TRUE(t->file().has_value());
  EXPECT_GT(t->file()->bytes, 0);
}

TEST(HfTokenizer, DecodesWhatItEncodes) {
  const auto t = tokenizer_create(fixture_path("tokenizer_bpe.json"));
  const std::string text = "Hello, w\xC3\xB6rld <|eot_id|> \xF0\x9F\x8C\x8D\n\t 12345";
  std::vector<int32_t> ids;
  t->encode(text, ids);
  EXPECT_EQ(t->decode(ids), text);
  WEFT_EXPECT_THROW_MSG(t->decode({5, 1006}), InputError, "1006", "position 1");
}

// The hand-made tokenizers; each expected list is Hugging Face tokenizers'.
TEST(HfTokenizer, EqualsHuggingFaceOnHandMadeTokenizers) {
  TempDir dir;
  const std::vector<std::string> texts = {"hello world", "hello  world!", " world worlds",
                                          "hellohello", "h\xC3\xA9llo\n\tworld 42"};
  const json removed_digits = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\d"}}},
         {"behavior", "Removed"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  struct Case {
    const char* name;
    json tokenizer;
    std::vector<std::vector<int32_t>> want;
  };
  const std::vector<Case> cases = {
      {"ignore_merges",
       tiny_tokenizer(true),
       {{259, 262},
        {259, 32, 262, 33},
        {262, 260, 261, 108, 100, 115},
        {259, 259},
        {104, 195, 169, 257, 111, 10, 9, 119, 261, 108, 100, 32, 52, 50}}},
      {"merges only",
       tiny_tokenizer(false),
       {{259, 260, 261, 108, 100},
        {259, 32, 260, 261, 108, 100, 33},
        {260, 261, 108, 100, 260, 261, 108, 100, 115},
        {259, 259},
        {104, 195, 169, 257, 111, 10, 9, 119, 261, 108, 100, 32, 52, 50}}},
      {"prefix space",
       tiny_tokenizer(true, gpt2_pre_tokenizer(true)),
       {{32, 259, 262},
        {32, 259, 32, 262, 33},
        {262, 260, 261, 108, 100, 115},
        {32, 259, 259},
        {32, 104, 195, 169, 257, 111, 10, 9, 119, 261, 108, 100, 32, 52, 50}}},
      {"split removed, no regex",
       tiny_tokenizer(true, removed_digits),
       {{259, 260, 261, 108, 100},
        {259, 32, 260, 261, 108, 100, 33},
        {260, 261, 108, 100, 260, 261, 108, 100, 115},
        {259, 259},
        {104, 195, 169, 257, 111, 10, 9, 119, 261, 108, 100, 32}}},
  };
  for (const auto& c : cases) {
    const auto path = dir.file(std::string(c.name) + "/tokenizer.json", c.tokenizer.dump());
    const auto t = tokenizer_create(path);
    EXPECT_EQ(t->document_tokens().description.find("no BOS or EOS"), 0u);
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> ids;
      t->encode(texts[i], ids);
      EXPECT_EQ(ids, c.want[i]) << c.name << ": '" << texts[i] << "'";
    }
  }
}
#endif

#if WEFT_HAVE_SENTENCEPIECE
TEST(SpTokenizer, EqualsSentencePieceOnEveryFixtureCase) {
  const json file = cases_file();
  EXPECT_EQ(compare_cases("sp", false), static_cast<int>(file["cases"].size()));
  const auto t = tokenizer_create(fixture_path("tokenizer_sp.model"));
  EXPECT_EQ(t->name(), "sentencepiece");
  EXPECT_EQ(t->vocab(), 1000);
  EXPECT_EQ(t->document_tokens().prefix, std::vector<int32_t>{file["sp"]["bos"].get<int32_t>()});
  EXPECT_EQ(t->document_tokens().suffix, std::vector<int32_t>{file["sp"]["eos"].get<int32_t>()});
  std::vector<int32_t> ids;
  t->encode("Round trip, caf\xC3\xA9.", ids);
  EXPECT_EQ(t->decode(ids), "Round trip, caf\xC3\xA9.");
}
#endif

TEST(Tokenizer, FilesThatAreNotTokenizersAreNamedInOneLine) {
  TempDir dir;
  const auto not_json = dir.file("bad/tokenizer.json", "this is not JSON");
  const auto no_model = dir.file("bad2/tokenizer.json", "{\"vocab\": {}}");
  const auto not_sp = dir.file("bad/tokenizer.model", "\x01\x02 not a protobuf \xFF\xFF\xFF");
  const auto sniffed = dir.file("bad/vocab.bin", "  {\"model\": 3}");
  struct Case {
    std::string spec;
    std::vector<std::string> says;
  };
  std::vector<Case> cases = {
      {"gpt2", {"unknown tokenizer 'gpt2'", "byte", "tokenizer.json", "tokenizer.model"}},
      {dir.path("none/tokenizer.json"), {"none/tokenizer.json", "does not exist"}},
      {dir.path("bad"), {"is a folder"}},
  };
#if WEFT_HAVE_PCRE2
  cases.push_back({not_json, {not_json, "is not a Hugging Face tokenizer.json"}});
  cases.push_back({no_model, {no_model, "is not a valid Hugging Face tokenizer.json"}});
  cases.push_back({sniffed, {sniffed, "tokenizer.json"}});
#else
  cases.push_back({not_json, {not_json, "built without PCRE2", "libpcre2-dev"}});
#endif
#if WEFT_HAVE_SENTENCEPIECE
  cases.push_back({not_sp, {not_sp, "is not a SentencePiece model"}});
#else
  cases.push_back({not_sp, {not_sp, "built without SentencePiece", "libsentencepiece-dev"}});
#endif
  for (const auto& c : cases) {
    try {
      tokenizer_create(c.spec);
      ADD_FAILURE() << "accepted " << c.spec;
    } catch (const InputError& e) {
      const std::string msg = e.what();
      for (const auto& s : c.says) EXPECT_NE(msg.find(s), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace weft::test
