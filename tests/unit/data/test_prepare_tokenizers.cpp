// `weft data prepare` with the text tokenizers and JSONL input: each
// document encoded on its own inside the tokenizer's document tokens, the
// same files for any thread count, uint32 tokens for a vocab above 65536,
// invalid UTF-8 reported, and bad JSONL lines named by file and line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "core/error.h"
#include "core/json_io.h"
#include "tokenizer_test_util.h"
#include "data/prepare.h"
#include "data/token_data.h"
#include "data/tokenizer.h"

namespace weft::test {
namespace {

using namespace weft::data;
namespace fs = std::filesystem;

std::string read_all(const std::string& path) {
  return test::file_contents(path);
}

std::vector<int32_t> tokens_of(const TokenSource& s) {
  std::vector<int32_t> t(static_cast<size_t>(s.size()));
  s.tokens_copy(0, s.size(), t.data());
  return t;
}

TEST(PrepareJsonl, OneDocumentPerLineFromTheTextField) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {dir.file("a.jsonl",
                       "{\"body\": \"first\\nline\", \"id\": 1}\n"
                       "\n"
                       "{\"body\": \"\", \"id\": 2}\n"
                       "{\"body\": \"caf\\u00e9 \\ud83c\\udf0d\", \"id\": 3}\r\n"),
              dir.file("b.txt", "plain text file\n")};
  o.text_field = "body";
  o.out = dir.path("out");
  o.val_fraction = 0;
  const auto r = data_prepare(o);
  EXPECT_EQ(r.documents, 3);  // the blank line and the empty text are skipped
  const auto d = token_data_open(o.out);
  const auto ids = tokens_of(*d.train);
  EXPECT_EQ(ByteTokenizer().decode(ids),
            "first\nline"
            "caf\xC3\xA9 \xF0\x9F\x8C\x8D"
            "plain text file\n");
  EXPECT_EQ(d.meta["text_field"], "body");
  EXPECT_EQ(d.meta["sources"][0]["format"], "jsonl");
  EXPECT_EQ(d.meta["sources"][0]["documents"], 2);
  EXPECT_EQ(d.meta["sources"][1]["format"], "text");
}

TEST(PrepareJsonl, BadLinesAreNamedByFileAndLine) {
  TempDir dir;
  struct Case {
    std::string content;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"{\"text\": \"ok\"}\n{\"text\": oops}\n", {"bad.jsonl' line 2 is not JSON"}},
      {"[1, 2]\n", {"line 1 is a JSON array, not an object"}},
      {"{\"content\": \"x\", \"meta\": 1}\n",
       {"line 1 has no string field 'text'", "content, meta", "--text-field"}},
      {"{\"text\": 5}\n", {"line 1 has no string field 'text'"}},
      {"{\"text\": \"caf\xC3\"}\n", {"line 1 is not JSON"}},  // JSON must be UTF-8
      {"\n{\"text\": \"\"}\n", {"no documents"}},
  };
  for (const auto& c : cases) {
    PrepareOptions o;
    o.inputs = {dir.file("bad.jsonl", c.content)};
    o.out = dir.path("out");
    try {
      data_prepare(o);
      ADD_FAILURE() << "accepted " << c.content;
    } catch (const InputError& e) {
      for (const auto& s : c.says)
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(o.out));
  }
}

#if WEFT_HAVE_PCRE2
class PrepareHf : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (int i = 0; i < 300; ++i)
      text += "Fortune " + std::to_string(i * 7919) + ": caf\xC3\xA9 \xF0\x9F\x8C\x8D " +
              std::string(static_cast<size_t>(i % 13), 'x') +
              "  <|eot_id|>\n\t--- said someone\n%\n";
    opts.inputs = {dir.file("src/fortunes", text),
                   dir.file("src/notes.txt", "one\n\nwhole file\n")};
    opts.tokenizer = fixture_path("tokenizer_bpe.json");
    opts.out = dir.path("out");
    opts.val_fraction = 0;
  }
  TempDir dir;
  PrepareOptions opts;
};

TEST_F(PrepareHf, EachDocumentIsEncodedInsideItsDocumentTokens) {
  const auto r = data_prepare(opts);
  EXPECT_EQ(r.tokenizer, "hf-bpe");
  EXPECT_EQ(r.vocab, 1006);
  EXPECT_EQ(r.documents, 301);
  EXPECT_EQ(r.invalid_utf8, 0);
  const auto t = tokenizer_create(opts.tokenizer);
  auto enc = t->encoder();
  std::vector<int32_t> want;
  for (const auto& path : opts.inputs) {
    const std::string text = read_all(path);
    for (const auto doc : text_documents(text)) t->encode_document(*enc, doc, want);
  }
  const auto d = token_data_open(opts.out);
  EXPECT_EQ(tokens_of(*d.train), want);
  EXPECT_EQ(d.meta["tokenizer"], "hf-bpe");
  EXPECT_EQ(d.meta["document_tokens"]["prefix"], nlohmann::json::array({1000}));
  EXPECT_EQ(d.meta["tokenizer_file"]["path"],
            fs::absolute(opts.tokenizer).lexically_normal().string());
  EXPECT_EQ(d.meta["train"]["dtype"], "uint16");
}

TEST_F(PrepareHf, TheSameFilesForAnyThreadCount) {
  opts.val_fraction = 0.1;
  opts.threads = 1;
  int64_t reports = 0, last_done = 0, total = 0;
  opts.progress = [&](const PrepareProgress& p) {
    ++reports;
    EXPECT_GE(p.bytes_done, last_done);
    last_done = p.bytes_done;
    total = p.bytes_total;
  };
  const auto one = data_prepare(opts);
  EXPECT_GE(reports, 1);
  EXPECT_EQ(last_done, total);
  EXPECT_EQ(total, one.text_bytes);
  const std::string train = read_all(opts.out + "/train.tok"),
                    val = read_all(opts.out + "/val.tok");
  opts.threads = 3;
  opts.out = dir.path("out3");
  opts.progress = nullptr;
  const auto three = data_prepare(opts);
  EXPECT_EQ(three.threads, 3);
  EXPECT_EQ(read_all(opts.out + "/train.tok"), train);
  EXPECT_EQ(read_all(opts.out + "/val.tok"), val);
}

TEST_F(PrepareHf, MegatronOutputHoldsTheSameTokens) {
  opts.val_fraction = 0.1;
  data_prepare(opts);
  const auto weft = token_data_open(opts.out);
  opts.format = TokenFormat::megatron;
  opts.out = dir.path("megatron");
  data_prepare(opts);
  const auto megatron = token_data_open(opts.out);
  EXPECT_EQ(tokens_of(*megatron.train), tokens_of(*weft.train));
  EXPECT_EQ(tokens_of(*megatron.val), tokens_of(*weft.val));
  EXPECT_EQ(megatron.meta["tokenizer_file"], weft.meta["tokenizer_file"]);
}

TEST_F(PrepareHf, InvalidUtf8IsReplacedAndReported) {
  opts.inputs.push_back(dir.file("src/broken.txt", "good line\nbad \xC3( here \xFF\n"));
  const auto r = data_prepare(opts);
  EXPECT_EQ(r.invalid_utf8, 2);
  EXPECT_EQ(r.invalid_utf8_file, opts.inputs.back());
  EXPECT_EQ(r.invalid_utf8_offset, 14);
  const auto meta = json_read_file(opts.out + "/meta.json", "meta");
  EXPECT_EQ(meta["invalid_utf8"]["sequences"], 2);
  EXPECT_EQ(meta["invalid_utf8"]["replaced_by"], "U+FFFD");
  // The byte tokenizer keeps bytes: nothing to replace, nothing reported.
  opts.tokenizer = "byte";
  opts.out = dir.path("bytes");
  EXPECT_EQ(data_prepare(opts).invalid_utf8, 0);
}

TEST_F(PrepareHf, IdsAbove65535AreStoredAsUint32) {
  nlohmann::json j = tiny_tokenizer(true);
  j["added_tokens"] = {{{"id", 70000}, {"content", "<big>"}, {"special", true}}};
  opts.tokenizer = dir.file("big/tokenizer.json", j.dump());
  opts.inputs = {dir.file("src/big.txt", "hello <big> world")};
  const auto r = data_prepare(opts);
  EXPECT_EQ(r.vocab, 70001);
  const auto d = token_data_open(opts.out);
  EXPECT_EQ(d.meta["train"]["dtype"], "uint32");
  EXPECT_EQ(tokens_of(*d.train), (std::vector<int32_t>{259, 32, 70000, 262}));
}
#endif

#if WEFT_HAVE_SENTENCEPIECE
// A model whose second piece is empty: libsentencepiece's trie builder
// throws its own exception rather than returning a status (found by
// fuzz_sentencepiece). It is a FileFormatError naming the file, not an
// internal error.
TEST(PrepareSp, AMalformedModelTheLibraryThrowsOnIsRefusedByName) {
  TempDir dir;
  const std::string bytes(
      "\x0a\x0e\x0a\x05\x3c\x75\x6e\x6b\x09\x15\x00\x00\x00\x10\x18\x02\x18\x03\x0a\x0d\x0a\x04\x00\x00\x00"
      "\x21\x8a\xcb\xff\x5e\x00\x18\x0b",
      33);
  const auto path = dir.file("empty_piece.model", bytes);
  WEFT_EXPECT_THROW_MSG(tokenizer_create(path), FileFormatError, "empty_piece.model",
                        "not a valid SentencePiece model");
}

TEST(PrepareSp, DocumentsGetTheModelsBosAndEos) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {dir.file("a.jsonl", "{\"text\": \"Hello there.\"}\n{\"text\": \"Bye.\"}\n")};
  o.tokenizer = fixture_path("tokenizer_sp.model");
  o.out = dir.path("out");
  o.val_fraction = 0;
  data_prepare(o);
  const auto t = tokenizer_create(o.tokenizer);
  std::vector<int32_t> want = {1}, bye;
  t->encode("Hello there.", want);
  want.insert(want.end(), {2, 1});
  t->encode("Bye.", want);
  want.push_back(2);
  EXPECT_EQ(tokens_of(*token_data_open(o.out).train), want);
}
#endif

}  // namespace
}  // namespace weft::test
