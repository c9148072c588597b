// `weft data prepare` and the default corpus: byte tokenizer, fortune
// documents, a deterministic split at document boundaries, meta.json, the
// unigram baseline, and bad input that leaves nothing behind.
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "data_test_util.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "data/token_data.h"
#include "data/tokenizer.h"

namespace weft::test {
namespace {

using namespace weft::data;
namespace fs = std::filesystem;

std::string decode_all(const TokenSource& s) {
  std::vector<int32_t> t(static_cast<size_t>(s.size()));
  s.tokens_copy(0, s.size(), t.data());
  return ByteTokenizer().decode(t);
}

// A fortune file of `n` documents of varied length.
std::string fortunes(int n, const std::string& tag) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    text += tag + " fortune " + std::to_string(i) + ":";
    for (int w = 0; w < 1 + (i * 7) % 13; ++w) text += " word" + std::to_string((i + w) % 5);
    text += "\n";
    if (i % 4 == 0) text += "\t-- someone\n";
    text += "%\n";
  }
  return text;
}

double entropy_of(const std::string& text) {
  std::map<unsigned char, double> counts;
  for (const char c : text) counts[static_cast<unsigned char>(c)] += 1;
  double h = 0;
  for (const auto& [c, k] : counts)
    h -= k / double(text.size()) * std::log(k / double(text.size()));
  return h;
}

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  const ByteTokenizer t;
  std::string text = "h\xc3\xa9llo, w\xf0\x9f\x8c\x8d!\n";
  text.push_back('\0');
  text.push_back('\xff');
  std::vector<int32_t> ids;
  t.encode(text, ids);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[1], 0xc3);
  EXPECT_EQ(ids.back(), 255);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.vocab(), 256);
  WEFT_EXPECT_THROW_MSG(t.decode({65, 256}), InputError, "256", "position 1");
}

TEST(Tokenizer, ByteAndUnknownNames) {
  EXPECT_EQ(tokenizer_create("byte")->name(), "byte");
  EXPECT_TRUE(tokenizer_create("byte")->document_tokens().prefix.empty());
  WEFT_EXPECT_THROW_MSG(tokenizer_create("gpt2"), InputError, "gpt2", "byte");
  WEFT_EXPECT_THROW_MSG(tokenizer_create("models/tokenizer.json"), InputError,
                        "models/tokenizer.json", "does not exist");
}

TEST(TextDocuments, FortuneSeparatorsEndDocumentsAndConcatenateBack) {
  const std::string text = "one\n%\ntwo\nlines\n%\r\n50%\n%%\nlast";
  const auto docs = text_documents(text);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "one\n%\n");
  EXPECT_EQ(docs[1], "two\nlines\n%\r\n");
  EXPECT_EQ(docs[2], "50%\n%%\nlast");  // '%' inside a line or doubled is text
  std::string back;
  for (const auto d : docs) back += d;
  EXPECT_EQ(back, text);
  EXPECT_EQ(text_documents("plain text\nno separators\n").size(), 1u);
  EXPECT_EQ(text_documents("a\n%").size(), 1u);
}

class Prepare : public ::testing::Test {
 protected:
  void SetUp() override {
    a = dir.file("src/a", fortunes(60, "alpha"));
    b = dir.file("src/b", fortunes(45, "beta"));
    opts.inputs = {a, b};
    opts.out = dir.path("out");
    opts.val_fraction = 0.1;
    opts.seed = 7;
  }
  TempDir dir;
  std::string a, b;
  PrepareOptions opts;
};

TEST_F(Prepare, SplitsAtDocumentBoundariesAndWritesMeta) {
  const auto r = data_prepare(opts);
  const std::string text_a = file_bytes(a), text_b = file_bytes(b);
  const auto d = token_data_open(opts.out);
  ASSERT_TRUE(d.train && d.val);
  const std::string train = decode_all(*d.train), val = decode_all(*d.val);

  // Every byte lands in exactly one split, in whole documents, file order kept.
  EXPECT_EQ(train.size() + val.size(), text_a.size() + text_b.size());
  std::vector<std::string> all;
  for (const auto& t : {text_a, text_b})
    for (const auto doc : text_documents(t)) all.emplace_back(doc);
  std::string train_again, val_again;
  std::set<std::string> val_docs;
  for (const auto doc : text_documents(val)) val_docs.emplace(doc);
  for (const auto& doc : all) (val_docs.count(doc) ? val_again : train_again) += doc;
  EXPECT_EQ(val_again, val);
  EXPECT_EQ(train_again, train);
  EXPECT_EQ(r.documents, 105);
  EXPECT_EQ(r.documents_train + r.documents_val, 105);
  EXPECT_GT(r.documents_val, 0);
  // Close to the fraction asked for, never above it.
  const double frac = double(val.size()) / double(train.size() + val.size());
  EXPECT_LE(frac, 0.1 + 1e-9);
  EXPECT_GT(frac, 0.08);

  const auto meta = json_read_file(opts.out + "/meta.json", "meta");
  EXPECT_EQ(meta["format"], "weft-data");
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab"], 256);
  ASSERT_EQ(meta["sources"].size(), 2u);
  EXPECT_EQ(meta["sources"][0]["path"], fs::absolute(a).lexically_normal().string());
  EXPECT_EQ(meta["sources"][1]["documents"], 45);
  EXPECT_EQ(meta["train"]["tokens"], int64_t(train.size()));
  EXPECT_EQ(meta["val"]["tokens"], int64_t(val.size()));
  EXPECT_EQ(meta["split"]["seed"], 7);
  EXPECT_DOUBLE_EQ(meta["split"]["val_fraction"].get<double>(), 0.1);
  EXPECT_NE(meta["split"]["rule"].get<std::string>().find("%"), std::string::npos);
  EXPECT_NEAR(meta["unigram_entropy_nats"].get<double>(), entropy_of(train), 1e-9);
  EXPECT_NEAR(r.unigram_entropy, entropy_of(train), 1e-9);
  EXPECT_NEAR(token_data_baseline(d), entropy_of(train), 1e-9);
  // Nothing but the three files; no temporary folders left beside it.
  int64_t files = 0;
  for (const auto& e : fs::directory_iterator(opts.out)) files += e.is_regular_file();
  EXPECT_EQ(files, 3);
  int64_t siblings = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++siblings;
  EXPECT_EQ(siblings, 2);  // src/ and out/
}

TEST_F(Prepare, DeterministicInTheSeed) {
  data_prepare(opts);
  const std::string val1 = file_bytes(opts.out + "/val.tok");
  opts.out = dir.path("again");
  data_prepare(opts);
  EXPECT_EQ(file_bytes(opts.out + "/val.tok"), val1);
  opts.out = dir.path("other-seed");
  opts.seed = 8;
  data_prepare(opts);
  EXPECT_NE(file_bytes(opts.out + "/val.tok"), val1);
}

TEST_F(Prepare, OneBigDocumentIsCutAtALineStart) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line " + std::to_string(i) + " of a plain text file\n";
  opts.inputs = {dir.file("src/plain.txt", text)};
  opts.val_fraction = 0.05;
  const auto r = data_prepare(opts);
  const auto d = token_data_open(opts.out);
  const std::string train = decode_all(*d.train), val = decode_all(*d.val);
  EXPECT_EQ(train + val, text);
  EXPECT_EQ(train.back(), '\n');
  EXPECT_NEAR(double(val.size()) / double(text.size()), 0.05, 0.01);
  EXPECT_EQ(r.documents, 1);
}

TEST_F(Prepare, NoValidationSplitWhenFractionIsZero) {
  opts.val_fraction = 0;
  const auto r = data_prepare(opts);
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_FALSE(fs::exists(opts.out + "/val.tok"));
  const auto d = token_data_open(opts.out);
  EXPECT_EQ(d.val, nullptr);
  EXPECT_EQ(decode_all(*d.train), file_bytes(a) + file_bytes(b));
}

TEST_F(Prepare, BadInputIsRefusedAndNothingIsWritten) {
  struct Case {
    std::function<void(PrepareOptions&)> change;
    std::vector<const char*> says;
  };
  const std::string empty = dir.file("src/empty", "");
  const std::vector<Case> cases = {
      {[](auto& o) { o.inputs.clear(); }, {"no input files"}},
      {[&](auto& o) { o.inputs.push_back(dir.path("src/missing")); },
       {"src/missing", "does not exist"}},
      {[&](auto& o) { o.inputs.push_back(empty); }, {"src/empty", "is empty"}},
      {[&](auto& o) { o.inputs.push_back(dir.path("src")); }, {"is a folder"}},
      {[](auto& o) { o.tokenizer = "sentencepiece"; },
       {"unknown tokenizer 'sentencepiece'", "byte"}},
      {[](auto& o) { o.tokenizer = "tok/tokenizer.json"; }, {"tok/tokenizer.json", "does not exist"}},
      {[](auto& o) { o.threads = -2; }, {"--threads -2"}},
      {[](auto& o) { o.val_fraction = 0.7; }, {"--val-fraction 0.7", "[0, 0.5]"}},
      {[](auto& o) { o.val_fraction = -1; }, {"--val-fraction -1"}},
      {[](auto& o) { o.out = ""; }, {"--out"}},
  };
  for (const auto& c : cases) {
    PrepareOptions o = opts;
    c.change(o);
    try {
      data_prepare(o);
      ADD_FAILURE() << "accepted: " << c.says[0];
    } catch (const InputError& e) {
      for (const char* s : c.says)
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(opts.out)) << c.says[0];
  }
}

TEST_F(Prepare, ExistingOutputIsNeverOverwrittenWithoutForce) {
  data_prepare(opts);
  const std::string train = file_bytes(opts.out + "/train.tok");
  opts.seed = 99;
  WEFT_EXPECT_THROW_MSG(data_prepare(opts), InputError, "already exists", "--force");
  EXPECT_EQ(file_bytes(opts.out + "/train.tok"), train);
  // A failing --force run leaves the old dataset too.
  PrepareOptions bad = opts;
  bad.force = true;
  bad.inputs.push_back(dir.path("src/missing"));
  EXPECT_THROW(data_prepare(bad), InputError);
  EXPECT_EQ(file_bytes(opts.out + "/train.tok"), train);
  // --force replaces a prepared dataset, but not a folder of something else.
  opts.force = true;
  EXPECT_NO_THROW(data_prepare(opts));
  EXPECT_NE(file_bytes(opts.out + "/train.tok"), train);
  dir.file("precious/thesis.tex", "do not delete");
  opts.out = dir.path("precious");
  WEFT_EXPECT_THROW_MSG(data_prepare(opts), InputError, "not a prepared dataset");
  EXPECT_EQ(file_bytes(dir.path("precious/thesis.tex")), "do not delete");
  // An existing empty folder is fine.
  fs::create_directories(dir.path("empty-out"));
  opts.out = dir.path("empty-out");
  EXPECT_NO_THROW(data_prepare(opts));
}

// ---- default corpus ---------------------------------------------------------

TEST(DefaultCorpus, PicksTheFortuneTextFilesOnly) {
  TempDir dir;
  dir.file("f/wisdom", fortunes(5, "w"));
  dir.file("f/wisdom.dat", "index");
  dir.file("f/wisdom.u8", "utf8 index");
  dir.file("f/art", fortunes(3, "a"));
  dir.file("f/off/rude", fortunes(3, "r"));
  dir.file("f/.hidden", "x");
  fs::create_symlink(dir.path("f/art"), dir.path("f/art-link"));
  const auto files = fortune_files(dir.path("f"));
  EXPECT_EQ(files, (std::vector<std::string>{dir.path("f/art"), dir.path("f/wisdom")}));
  WEFT_EXPECT_THROW_MSG(fortune_files(dir.path("none")), InputError, "apt-get install fortunes");
}

TEST(DefaultCorpus, PreparedOnceIntoTheCacheAndReused) {
  TempDir dir;
  dir.file("f/wisdom", fortunes(80, "w"));
  dir.file("f/art", fortunes(40, "a"));
  const std::string cache = dir.path("cache/weft/data");
  const auto path = default_corpus_dir(dir.path("f"), cache);
  EXPECT_EQ(path, cache + "/fortunes");
  const auto d = token_data_open(path);
  ASSERT_TRUE(d.train && d.val);
  EXPECT_EQ(d.meta["tokenizer"], "byte");
  EXPECT_EQ(d.train->size() + d.val->size(), int64_t(file_bytes(dir.path("f/wisdom")).size() +
                                                     file_bytes(dir.path("f/art")).size()));
  // Second use: the same folder, untouched, even if the source is gone.
  const auto mtime = fs::last_write_time(path + "/train.tok");
  fs::remove_all(dir.path("f"));
  EXPECT_EQ(default_corpus_dir(dir.path("f"), cache), path);
  EXPECT_EQ(fs::last_write_time(path + "/train.tok"), mtime);
  // Only the corpus in the cache: no staging folders left.
  int64_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(cache)) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(DefaultCorpus, AnIncompleteCacheIsRebuilt) {
  TempDir dir;
  dir.file("f/wisdom", fortunes(30, "w"));
  const std::string cache = dir.path("cache");
  dir.file("cache/fortunes/train.tok", "half written by hand");
  const auto path = default_corpus_dir(dir.path("f"), cache);
  EXPECT_NO_THROW(token_data_open(path));
}

TEST(DefaultCorpus, MissingPackageSaysHowToInstallIt) {
  TempDir dir;
  WEFT_EXPECT_THROW_MSG(default_corpus_dir(dir.path("no-fortunes"), dir.path("cache")), InputError,
                        "apt-get install fortunes");
  EXPECT_FALSE(fs::exists(dir.path("cache/fortunes")));
}

TEST(DefaultCorpus, CacheDirFollowsXdg) {
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", "/tmp/xdg-test", 1);
  EXPECT_EQ(data_cache_dir(), "/tmp/xdg-test/weft/data");
  ::unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(data_cache_dir(), std::string(home) + "/.cache/weft/data");
  }
  if (old) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
}

}  // namespace
}  // namespace weft::test
