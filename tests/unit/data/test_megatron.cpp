// Megatron .bin/.idx datasets against files written independently by
// tools/megatron_data.py (numpy only, from the published format): weft reads
// them token for token, and weft's writer reproduces them byte for byte, so
// what weft writes is what that reader (and Megatron's) reads. Broken pairs
// are refused with the file and the problem named.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data_test_util.h"
#include "data/loader.h"
#include "data/megatron_file.h"
#include "data/prepare.h"
#include "data/token_data.h"

namespace weft::test {
namespace {

using namespace weft::data;
namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(WEFT_FIXTURES_DIR) + "/" + name; }

// A fixture's expected contents: documents of sequences of ids.
struct Expected {
  std::string dtype;
  std::vector<std::vector<std::vector<int64_t>>> documents;
  std::vector<int64_t> tokens() const {
    std::vector<int64_t> t;
    for (const auto& d : documents)
      for (const auto& s : d) t.insert(t.end(), s.begin(), s.end());
    return t;
  }
  int64_t sequences() const {
    int64_t n = 0;
    for (const auto& d : documents) n += static_cast<int64_t>(d.size());
    return n;
  }
};

Expected expected(const std::string& name) {
  std::ifstream in(fixture(name + ".json"));
  const auto j = nlohmann::json::parse(in);
  return {j["dtype"].get<std::string>(),
          j["documents"].get<std::vector<std::vector<std::vector<int64_t>>>>()};
}

std::vector<int64_t> all_tokens(const TokenSource& s) {
  std::vector<int64_t> t;
  for (int64_t i = 0; i < s.size(); ++i) t.push_back(s.token(i));
  return t;
}

class MegatronFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(MegatronFixture, ReadsEveryTokenAsWritten) {
  const std::string name = GetParam();
  const Expected want = expected(name);
  // By prefix, by .bin and by .idx.
  for (const std::string& path :
       {fixture(name), fixture(name + ".bin"), fixture(name + ".idx")}) {
    const auto src = token_source_open(path);
    EXPECT_EQ(all_tokens(*src), want.tokens()) << path;
    EXPECT_EQ(src->vocab(), 0);
    EXPECT_NE(src->describe().find(want.dtype), std::string::npos) << src->describe();
    EXPECT_NE(src->describe().find(fmt::format("{} sequences in {} documents", want.sequences(),
                                               want.documents.size())),
              std::string::npos)
        << src->describe();
    // Bulk copies narrow exactly as token() reads.
    std::vector<int32_t> copy(static_cast<size_t>(src->size()));
    src->tokens_copy(0, src->size(), copy.data());
    EXPECT_EQ(std::vector<int64_t>(copy.begin(), copy.end()), want.tokens());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MegatronFixture,
                         ::testing::Values("megatron_u16", "megatron_i32", "megatron_u8",
                                           "megatron_i64"));

// weft's writer, given the fixture's documents and sequences, writes the same bytes.
void expect_writer_reproduces(const std::string& name, int64_t vocab) {
  TempDir dir;
  const Expected want = expected(name);
  const std::string prefix = dir.path("out");
  MegatronWriter w(prefix, vocab);
  for (const auto& doc : want.documents) {
    for (const auto& seq : doc) {
      const std::vector<int32_t> s(seq.begin(), seq.end());
      w.sequence_append(s);
    }
    w.document_end();
  }
  const MegatronWritten written = w.finish();
  EXPECT_EQ(dtype_name(written.info.dtype), want.dtype);
  EXPECT_EQ(written.info.tokens, static_cast<int64_t>(want.tokens().size()));
  EXPECT_EQ(written.info.documents, static_cast<int64_t>(want.documents.size()));
  EXPECT_EQ(file_bytes(prefix + ".bin"), file_bytes(fixture(name + ".bin")));
  EXPECT_EQ(file_bytes(prefix + ".idx"), file_bytes(fixture(name + ".idx")));
  EXPECT_EQ(written.checksum, checksum64(file_bytes(prefix + ".bin").data(),
                                         static_cast<int64_t>(file_bytes(prefix + ".bin").size())));
  // Nothing else is left beside them.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}

TEST(MegatronWriter, ReproducesTheIndependentFilesByteForByte) {
  expect_writer_reproduces("megatron_u16", 65536);   // the largest vocab uint16 holds
  expect_writer_reproduces("megatron_i32", 128256);  // Llama 3's
}

TEST(MegatronWriter, DtypeFollowsTheVocab) {
  EXPECT_EQ(megatron_dtype_for(256), TokenDtype::u16);
  EXPECT_EQ(megatron_dtype_for(65536), TokenDtype::u16);
  EXPECT_EQ(megatron_dtype_for(65537), TokenDtype::i32);
  EXPECT_EQ(megatron_dtype_for(int64_t{1} << 31), TokenDtype::i32);
}

TEST(MegatronWriter, RefusesIdsOutsideTheVocabAndLeavesNothing) {
  TempDir dir;
  {
    MegatronWriter w(dir.path("x"), 100);
    w.document_append(std::vector<int32_t>{1, 2, 3});
    WEFT_EXPECT_THROW_MSG(w.document_append(std::vector<int32_t>{4, 100}), InputError,
                          "token id 100", "position 4", "[0, 100)");
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
  WEFT_EXPECT_THROW_MSG(MegatronWriter(dir.path("y"), 0), InputError, "vocab 0");
}

TEST(MegatronWriter, ReplacesAnOldDatasetOnlyWhenComplete) {
  TempDir dir;
  const std::string prefix = dir.path("d");
  {
    MegatronWriter w(prefix, 256);
    w.document_append(std::vector<int32_t>{1, 2, 3});
    w.finish();
  }
  {
    MegatronWriter w(prefix, 256);
    w.document_append(std::vector<int32_t>{9, 9, 9, 9, 9});
    // Destroyed without finish(): the old dataset stays.
  }
  EXPECT_EQ(all_tokens(*token_source_open(prefix)), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}

// ---- broken datasets --------------------------------------------------------

// The u16 fixture's bytes, to break one field at a time.
class BrokenMegatron : public ::testing::Test {
 protected:
  void SetUp() override {
    idx = file_bytes(fixture("megatron_u16.idx"));
    bin = file_bytes(fixture("megatron_u16.bin"));
  }
  template <typename T>
  void set(int64_t offset, T v) {
    std::memcpy(idx.data() + offset, &v, sizeof(T));
  }
  // Writes the pair and expects it refused with every fragment in the message.
  template <typename... Frags>
  void expect_refused(Frags... frags) {
    const std::string prefix = dir.path("d");
    file_put(prefix + ".idx", idx);
    file_put(prefix + ".bin", bin);
    WEFT_EXPECT_THROW_MSG(token_source_open(prefix), FileFormatError, frags...);
  }
  TempDir dir;
  std::string idx, bin;
  // The fixture: 4 sequences, 5 document index entries.
  static constexpr int64_t kS = 4, kD = 5;
  static constexpr int64_t kLengths = 34, kPointers = 34 + 4 * kS, kDocs = 34 + 12 * kS;
};

TEST_F(BrokenMegatron, WrongMagic) {
  idx[0] = 'X';
  expect_refused("d.idx", "not a Megatron index", "MMIDIDX");
}

TEST_F(BrokenMegatron, WrongVersion) {
  set<uint64_t>(9, 2);
  expect_refused("d.idx", "version 2", "version 1");
}

TEST_F(BrokenMegatron, UnknownDtypeCode) {
  idx[17] = 9;
  expect_refused("d.idx", "unknown dtype code 9", "8 (uint16)");
}

TEST_F(BrokenMegatron, FloatDtypeHoldsNoTokenIds) {
  idx[17] = 7;
  expect_refused("d.idx", "dtype code 7 (float32)", "no token ids");
}

TEST_F(BrokenMegatron, TruncatedHeader) {
  idx.resize(20);
  expect_refused("d.idx", "truncated", "34-byte header");
}

TEST_F(BrokenMegatron, IndexSizeDisagreesWithItsCounts) {
  idx.pop_back();
  expect_refused("d.idx", "121 bytes", "4 sequences", "5 document index entries");
  SetUp();
  set<uint64_t>(18, uint64_t{1} << 62);  // a corrupt, huge sequence count
  expect_refused("d.idx", "4611686018427387904 sequences");
}

TEST_F(BrokenMegatron, MultimodalModesAreRefused) {
  idx.append(kS, '\0');
  expect_refused("d.idx", "multimodal");
}

TEST_F(BrokenMegatron, BinLongerOrShorterThanTheIndexSays) {
  bin += "xx";
  expect_refused("d.bin", "38 bytes", "d.idx", "18 uint16 tokens (36 bytes)");
  SetUp();
  bin.resize(34);
  expect_refused("d.idx", "sequence 3", "runs past the end", "d.bin");
}

TEST_F(BrokenMegatron, PointerOutOfRange) {
  set<int64_t>(kPointers + 8 * 2, 4000);
  expect_refused("sequence 2", "d.idx", "byte 4000", "outside", "d.bin", "36 bytes");
  SetUp();
  set<int64_t>(kPointers + 8 * 1, -8);
  expect_refused("sequence 1", "byte -8", "outside");
}

TEST_F(BrokenMegatron, SequencesNotBackToBack) {
  set<int64_t>(kPointers + 8 * 1, 12);  // sequence 0 ends at byte 10
  expect_refused("sequence 1", "d.idx", "byte 12 where 10 was expected", "back to back");
}

TEST_F(BrokenMegatron, NegativeLength) {
  set<int32_t>(kLengths + 4 * 3, -1);
  expect_refused("sequence 3", "negative length -1");
}

TEST_F(BrokenMegatron, DocumentIndexMustRunFromZeroToTheSequenceCount) {
  set<int64_t>(kDocs, 1);
  expect_refused("d.idx", "document index from 1 to 4", "from 0 to the sequence count 4");
  SetUp();
  set<int64_t>(kDocs + 8 * (kD - 1), 3);
  expect_refused("d.idx", "from 0 to 3");
  SetUp();
  set<int64_t>(kDocs + 8 * 2, 4);  // document 1 ends past document 2's end (3)
  expect_refused("d.idx", "document 2 ends at sequence 3, before it starts at sequence 4");
}

TEST_F(BrokenMegatron, HeaderIntegrityStillChecksSizes) {
  // Integrity::header skips the per-sequence scan but not the sizes.
  set<int64_t>(kDocs + 8 * 2, 4);
  file_put(dir.path("d.idx"), idx);
  file_put(dir.path("d.bin"), bin);
  EXPECT_EQ(token_source_open(dir.path("d"), Integrity::header)->size(), 18);
  file_put(dir.path("d.bin"), bin + "xx");
  WEFT_EXPECT_THROW_MSG(token_source_open(dir.path("d"), Integrity::header), FileFormatError,
                        "38 bytes");
}

TEST(MegatronFiles, MissingHalfOrNoTokens) {
  TempDir dir;
  file_put(dir.path("a.idx"), file_bytes(fixture("megatron_u16.idx")));
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("a")), InputError, "a.bin", "does not exist");
  file_put(dir.path("b.bin"), file_bytes(fixture("megatron_u16.bin")));
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("b")), InputError, "b.idx", "does not exist");
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("c.idx")), InputError, "c.idx", "does not exist");
  // A .bin with no .idx beside it is no Megatron dataset.
  EXPECT_FALSE(megatron_paths(dir.path("b.bin")));
  // 0 sequences.
  Bytes empty;
  empty.text(std::string(kMegatronIdxMagic, 9)).put<uint64_t>(1).put<uint8_t>(8);
  empty.put<uint64_t>(0).put<uint64_t>(1).put<int64_t>(0);
  file_put(dir.path("e.idx"), empty.str());
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("e")), InputError, "holds no tokens");
}

// A hand-built pair of signed ids: int8 and int16 read with their sign, and
// validate_vocab names the dataset.
std::string idx_bytes(uint8_t code, const std::vector<int32_t>& lengths, int64_t width) {
  Bytes b;
  b.text(std::string(kMegatronIdxMagic, 9)).put<uint64_t>(1).put<uint8_t>(code);
  b.put<uint64_t>(lengths.size()).put<uint64_t>(lengths.size() + 1);
  b.put_all(lengths);
  int64_t p = 0;
  for (const int32_t n : lengths) {
    b.put<int64_t>(p);
    p += n * width;
  }
  for (size_t d = 0; d <= lengths.size(); ++d) b.put<int64_t>(static_cast<int64_t>(d));
  return b.str();
}

TEST(MegatronFiles, SignedIdsAndTheModelsVocab) {
  TempDir dir;
  file_put(dir.path("s8.idx"), idx_bytes(2, {2, 1}, 1));
  file_put(dir.path("s8.bin"), le_payload(std::vector<int8_t>{5, -3, 7}));
  file_put(dir.path("s16.idx"), idx_bytes(3, {3}, 2));
  file_put(dir.path("s16.bin"), le_payload(std::vector<int16_t>{300, 30000, 2}));
  const std::string p8 = dir.path("s8"), p16 = dir.path("s16");
  const auto s8 = token_source_open(p8);
  EXPECT_EQ(all_tokens(*s8), (std::vector<int64_t>{5, -3, 7}));
  WEFT_EXPECT_THROW_MSG(validate_vocab(*s8, 256), InputError, "token id -3", "negative",
                        p8.c_str());
  const auto s16 = token_source_open(p16);
  EXPECT_EQ(all_tokens(*s16), (std::vector<int64_t>{300, 30000, 2}));
  WEFT_EXPECT_THROW_MSG(validate_vocab(*s16, 1000), InputError, "token id 30000", "position 1",
                        "vocab [0, 1000)", p16.c_str());
  const auto big = token_source_open(fixture("megatron_i32"));
  WEFT_EXPECT_THROW_MSG(validate_vocab(*big, 65536), InputError, "token id 70000", "position 0",
                        "megatron_i32");
}

TEST(MegatronFiles, ShardFoldersAndLlmcBinsBesideThem) {
  TempDir dir;
  for (const char* split : {"train_000", "val_000"}) {
    dir.file(std::string("d/") + split + ".idx", file_bytes(fixture("megatron_u16.idx")));
    dir.file(std::string("d/") + split + ".bin", file_bytes(fixture("megatron_u16.bin")));
  }
  // An llm.c shard in the same folder is still read as llm.c.
  dir.file("d/train_001.bin", llmc_bytes(20240520, 1, std::vector<uint16_t>{42, 43}));
  const auto d = token_data_open(dir.path("d"));
  ASSERT_TRUE(d.train && d.val);
  EXPECT_EQ(d.train->size(), 20);
  EXPECT_EQ(d.train->token(18), 42);
  EXPECT_EQ(d.val->size(), 18);
}

TEST(MegatronFiles, SamplesAreWindowsOfTheSequenceStream) {
  // Sequences in index order, read across document ends like any token file.
  const auto src = token_source_open(fixture("megatron_u16"));
  const Loader l(*src, 4, 0, Loader::Order::sequential);
  EXPECT_EQ(l.windows(), 4);  // (18 - 1) / 4
  std::vector<int32_t> in(4), tg(4);
  l.sample(1, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{9, 10, 11, 12}));  // document 0's end, document 1's start
  EXPECT_EQ(tg, (std::vector<int32_t>{10, 11, 12, 13}));
}

TEST(MegatronFiles, PrepareWritesTheSameTokensAsTheWeftFormat) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Fortune " + std::to_string(i) + " for you.\n%\n";
  const auto in = dir.file("f.txt", text);
  PrepareOptions o;
  o.inputs = {in};
  o.val_fraction = 0.2;
  o.seed = 5;
  o.out = dir.path("weft");
  const auto a = data_prepare(o);
  o.out = dir.path("megatron");
  o.format = TokenFormat::megatron;
  const auto b = data_prepare(o);
  EXPECT_EQ(a.train_tokens, b.train_tokens);
  EXPECT_EQ(a.documents_val, b.documents_val);
  for (const char* f : {"train.bin", "train.idx", "val.bin", "val.idx", "meta.json"})
    EXPECT_TRUE(fs::exists(dir.path(std::string("megatron/") + f))) << f;
  const auto tw = token_data_open(dir.path("weft"));
  const auto tm = token_data_open(dir.path("megatron"));
  EXPECT_EQ(all_tokens(*tm.train), all_tokens(*tw.train));
  EXPECT_EQ(all_tokens(*tm.val), all_tokens(*tw.val));
  EXPECT_EQ(tm.meta["token_format"], "megatron");
  EXPECT_EQ(tm.meta["train"]["file"], "train.bin");
  EXPECT_EQ(tm.meta["train"]["documents"], a.documents_train);
  EXPECT_EQ(tm.meta["train"]["dtype"], "uint16");
  // One sequence per document.
  const auto m = megatron_open(*megatron_paths(dir.path("megatron/train")));
  EXPECT_EQ(m->info().documents, a.documents_train);
  EXPECT_EQ(m->info().sequences, a.documents_train);
  EXPECT_DOUBLE_EQ(token_data_baseline(tm), token_data_baseline(tw));
}

}  // namespace
}  // namespace weft::test
