// `weft data` end to end: prepare, info, the default corpus, and one clear
// line with exit code 2 for each kind of bad input.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/data/data_test_util.h"
#include "../unit/test_util.h"
#include "cli_runner.h"

namespace weft::test {
namespace {

std::string fortune_text(int n) {
  std::string t;
  for (int i = 0; i < n; ++i) t += "Fortune number " + std::to_string(i) + " says hello.\n%\n";
  return t;
}

TEST(CliData, PrepareThenInfo) {
  TempDir dir;
  const auto a = dir.file("a.txt", fortune_text(50));
  const auto b = dir.file("b.txt", fortune_text(30));
  const auto out = dir.path("data");
  auto r = run_weft("data prepare --input " + a + " " + b + " --out " + out +
                    " --val-fraction 0.1 --seed 3");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s :
       {"prepared", "train.tok", "val.tok", "80 documents", "unigram entropy", "nats/token"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  std::ifstream in(out + "/meta.json");
  const auto meta = nlohmann::json::parse(in);
  EXPECT_EQ(meta["vocab"], 256);

  r = run_weft("data info " + out + " --seq 16");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s :
       {"byte tokenizer", "weft .tok", "windows of 16 + 1", "every token id is below 256"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
}

TEST(CliData, PrepareMegatronThenInfoByFolderPrefixAndBlend) {
  TempDir dir;
  const auto a = dir.file("a.txt", fortune_text(50));
  const auto out = dir.path("m");
  auto r = run_weft("data prepare --format megatron --input " + a + " --out " + out + " --val-fraction 0.1");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"train.bin/.idx", "val.bin/.idx", "50 documents"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  for (const char* f : {"train.bin", "train.idx", "val.bin", "val.idx"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;

  r = run_weft("data info " + out + " --seq 16");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"byte tokenizer", "Megatron .bin/.idx", "sequences in", "documents)", "windows of 16 + 1",
                        "every token id is below 256"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  // The prefix, either file, and --data name the same dataset.
  for (const std::string& p : {out + "/train", out + "/train.bin", out + "/train.idx"}) {
    r = run_weft("data info --data " + p + " --vocab 256");
    ASSERT_EQ(r.code, 0) << p << "\n" << r.out;
    EXPECT_NE(r.out.find("Megatron .bin/.idx '" + out + "/train'"), std::string::npos) << r.out;
  }
  r = run_weft("data info 0.7 " + out + " 0.3 " + out + "/val --seq 8");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("blend of 0.7 x Megatron"), std::string::npos) << r.out;
}

TEST(CliData, DefaultCorpusIntoTheCache) {
  if (!std::filesystem::exists("/usr/share/games/fortunes/fortunes"))
    GTEST_SKIP() << "Debian's fortunes package is not installed";
  TempDir dir;
  ::setenv("XDG_CACHE_HOME", dir.path("cache").c_str(), 1);
  const auto r = run_weft("data corpus");
  ::unsetenv("XDG_CACHE_HOME");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, dir.path("cache") + "/weft/data/fortunes\n");
  EXPECT_TRUE(std::filesystem::exists(dir.path("cache/weft/data/fortunes/train.tok")));
}

TEST(CliData, PrepareWithTokenizerFiles) {
  TempDir dir;
  const auto a = dir.file("a.txt", fortune_text(40));
  const auto j = dir.file("b.jsonl", "{\"text\": \"caf\\u00e9 \\ud83c\\udf0d\"}\n{\"text\": \"two\"}\n");
  const auto bad = dir.file("c.txt", "broken \xC3( text\n");
  struct Case {
    std::string tokenizer;
    bool built;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {std::string(WEFT_FIXTURES_DIR) + "/tokenizer_bpe.json", WEFT_HAVE_PCRE2,
       {"43 documents", "hf-bpe tokenizer", "vocab 1006", "<|begin_of_text|> (1000) before each",
        "MB/s", "1 invalid UTF-8 sequence replaced by U+FFFD", "c.txt' at byte 7"}},
      {std::string(WEFT_FIXTURES_DIR) + "/tokenizer_sp.model", WEFT_HAVE_SENTENCEPIECE,
       {"43 documents", "sentencepiece tokenizer", "vocab 1000", "BOS <s> (1)", "EOS </s> (2)"}},
  };
  for (const auto& c : cases) {
    if (!c.built) continue;
    const auto out = dir.path("out" + std::to_string(&c - cases.data()));
    auto r = run_weft("data prepare --input " + a + " " + j + " " + bad + " --out " + out +
                      " --tokenizer " + c.tokenizer);
    ASSERT_EQ(r.code, 0) << r.out;
    for (const auto& s : c.says)
      EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
    r = run_weft("data info " + out);
    EXPECT_EQ(r.code, 0) << r.out;
  }
}

TEST(CliData, AFileThatIsNotATokenizerIsOneLineNamingIt) {
  TempDir dir;
  const auto text = dir.file("t.txt", fortune_text(10));
  const auto not_json = dir.file("tok/tokenizer.json", "{ not json");
  const auto not_sp = dir.file("tok/tokenizer.model", "not a model at all");
  const auto unsupported = dir.file("tok/wordpiece.json", "{\"model\": {\"type\": \"WordPiece\"}, "
                                    "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}");
  for (const auto& tok : {not_json, not_sp, unsupported}) {
    const auto r = run_weft("data prepare --input " + text + " --out " + dir.path("out") +
                            " --tokenizer " + tok);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find("weft: error: tokenizer '" + tok + "'"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path("out")));
}

struct BadInput {
  std::string args;
  std::vector<const char*> says;
};

TEST(CliData, BadInputIsOneClearLineAndExitTwo) {
  TempDir dir;
  const auto text = dir.file("t.txt", fortune_text(10));
  const auto empty = dir.file("empty.txt", "");
  const auto out = dir.path("out");
  const auto taken = dir.file("taken/keep.txt", "mine");
  const auto tok = dir.path("d");
  ASSERT_EQ(run_weft("data prepare --input " + text + " --out " + tok).code, 0);
  // A Megatron pair with a wrong magic, and one whose .idx has lost a byte.
  ASSERT_EQ(run_weft("data prepare --format megatron --input " + text + " --out " + dir.path("m")).code, 0);
  std::string idx = file_bytes(dir.path("m/train.idx"));
  dir.file("magic.bin", file_bytes(dir.path("m/train.bin")));
  dir.file("magic.idx", "X" + idx.substr(1));
  dir.file("short.bin", file_bytes(dir.path("m/train.bin")));
  dir.file("short.idx", idx.substr(0, idx.size() - 1));
  const std::vector<BadInput> cases = {
      {"data prepare --out " + out, {"no input files"}},
      {"data prepare --input " + dir.path("nope.txt") + " --out " + out,
       {"nope.txt", "does not exist"}},
      {"data prepare --input " + empty + " --out " + out, {"empty.txt", "is empty"}},
      {"data prepare --input " + text + " --out " + out + " --tokenizer bpe",
       {"unknown tokenizer 'bpe'", "byte"}},
      {"data prepare --input " + text + " --out " + out + " --tokenizer tokenizer.json",
       {"tokenizer file 'tokenizer.json' does not exist"}},
      {"data prepare --input " + text + " --out " + out + " --tokenizer " + text + ".json",
       {"t.txt.json", "does not exist"}},
      {"data prepare --input " + text + " --out " + out + " --threads -1", {"--threads -1"}},
      {"data prepare --input " + text + " --out " + out + " --val-fraction 2",
       {"--val-fraction 2"}},
      {"data prepare --input " + text + " --out " + dir.path("taken"), {"already exists"}},
      {"data info " + dir.path("missing"), {"missing", "does not exist"}},
      {"data info " + text, {"looks like text", "weft data prepare"}},
      {"data info " + tok + " --vocab 50", {"token id", "vocab [0, 50)"}},
      {"data info " + tok + " --seq 100000", {"sequence length 100000", "100001"}},
      {"data", {"subcommand"}},
      {"data info " + dir.path("magic"), {"magic.idx", "not a Megatron index"}},
      {"data info " + dir.path("short.bin"), {"short.idx", "bytes"}},
      {"data info 0.5 " + tok + " 0.5", {"no path"}},
      {"data info 0.5 " + tok + " heavy " + tok, {"weight 'heavy'"}},
      {"data prepare --input " + text + " --out " + out + " --format arrow", {"--format 'arrow'", "megatron"}},
  };
  for (const auto& c : cases) {
    const auto r = run_weft(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("weft: error: ", 0), 0u) << c.args << "\n" << r.out;
    for (const char* s : c.says)
      EXPECT_NE(r.out.find(s), std::string::npos) << c.args << "\n" << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_EQ(std::filesystem::directory_iterator(dir.path("taken"))->path().filename(), "keep.txt");
}

}  // namespace
}  // namespace weft::test
