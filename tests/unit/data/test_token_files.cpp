// weft .tok, llm.c .bin and numpy .npy: round trips, and every kind of
// broken file refused with a message naming the path and the problem.
#include <numeric>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data_test_util.h"
#include "data/checksum.h"
#include "data/token_data.h"
#include "data/token_file.h"

namespace weft::test {
namespace {

using namespace weft::data;

std::vector<int32_t> all_tokens(const TokenSource& s) {
  std::vector<int32_t> out(static_cast<size_t>(s.size()));
  s.tokens_copy(0, s.size(), out.data());
  return out;
}

// ---- checksum ---------------------------------------------------------------

TEST(Checksum, MatchesPublishedXxh64Values) {
  // Reference values from `xxhsum -H1`.
  EXPECT_EQ(checksum64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(checksum64("a", 1), 0xd24ec4f1a98c6e5bull);
}

TEST(Checksum, PiecewiseEqualsOneShot) {
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131 + 7) % 251);
  for (const int64_t n : {0, 1, 3, 4, 7, 8, 31, 32, 33, 63, 64, 100, 1000}) {
    const uint64_t whole = checksum64(data.data(), n);
    for (const int64_t piece : {1, 5, 32, 77}) {
      Checksum64 c;
      for (int64_t at = 0; at < n; at += piece) c.update(data.data() + at, std::min(piece, n - at));
      EXPECT_EQ(c.digest(), whole) << "n=" << n << " piece=" << piece;
    }
  }
}

// ---- weft .tok --------------------------------------------------------------

TEST(WeftTokenFile, RoundTripUint16) {
  TempDir dir;
  const std::vector<int32_t> tokens = {0, 1, 255, 65535, 7, 42};
  const auto path = dir.path("a.tok");
  const auto h = token_file_write(path, tokens, 65536);
  EXPECT_EQ(h.dtype, TokenDtype::u16);
  EXPECT_EQ(h.count, 6);
  EXPECT_EQ(file_bytes(path).size(), 64u + 2 * tokens.size());
  const auto src = token_file_open(path);
  EXPECT_EQ(src->size(), 6);
  EXPECT_EQ(src->vocab(), 65536);
  EXPECT_EQ(src->dtype(), TokenDtype::u16);
  EXPECT_EQ(all_tokens(*src), tokens);
  EXPECT_EQ(src->token(3), 65535);
  EXPECT_NE(src->describe().find(path), std::string::npos);
}

TEST(WeftTokenFile, RoundTripUint32AndHeaderBytes) {
  TempDir dir;
  std::vector<int32_t> tokens(5000);
  std::iota(tokens.begin(), tokens.end(), 100000);
  const auto path = dir.path("big.tok");
  const auto h = token_file_write(path, tokens, 128256);
  EXPECT_EQ(h.dtype, TokenDtype::u32);
  const std::string bytes = file_bytes(path);
  ASSERT_EQ(bytes.size(), 64u + 4 * tokens.size());
  EXPECT_EQ(bytes.substr(0, 8), std::string("WEFTTOK\0", 8));
  EXPECT_EQ(checksum64(bytes.data() + 64, int64_t(bytes.size()) - 64), h.checksum);
  const auto src = token_source_open(path);
  EXPECT_EQ(all_tokens(*src), tokens);
  std::vector<int32_t> mid(10);
  src->tokens_copy(4990, 10, mid.data());
  EXPECT_EQ(mid[9], 104999);
}

TEST(WeftTokenFile, WriterRejectsIdOutsideVocabAndLeavesNothing) {
  TempDir dir;
  const auto path = dir.path("x.tok");
  const std::vector<int32_t> tokens = {1, 2, 256};
  WEFT_EXPECT_THROW_MSG(token_file_write(path, tokens, 256), InputError, "256", "position 2");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(WeftTokenFile, FailedWriteKeepsTheOldFile) {
  TempDir dir;
  const auto path = dir.path("x.tok");
  token_file_write(path, std::vector<int32_t>{1, 2, 3}, 256);
  const std::string before = file_bytes(path);
  EXPECT_THROW(token_file_write(path, std::vector<int32_t>{4, 999}, 256), InputError);
  EXPECT_EQ(file_bytes(path), before);
}

class CorruptWeftFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<int32_t> tokens(100);
    std::iota(tokens.begin(), tokens.end(), 0);
    token_file_write(good, tokens, 256);
    bytes = file_bytes(good);
  }
  // Writes `b` to a fresh file and expects opening it to fail with `frags`.
  template <typename... F>
  void expect_refused(const std::string& b, F... frags) {
    file_put(bad, b);
    WEFT_EXPECT_THROW_MSG(token_source_open(bad), FileFormatError, bad.c_str(), frags...);
  }
  TempDir dir;
  std::string good = dir.path("good.tok");
  std::string bad = dir.path("bad.tok");
  std::string bytes;
};

TEST_F(CorruptWeftFile, Truncated) {
  expect_refused(bytes.substr(0, bytes.size() - 3), "truncated", "100");
}
TEST_F(CorruptWeftFile, TruncatedHeader) {
  expect_refused(bytes.substr(0, 20), "truncated", "header");
}
TEST_F(CorruptWeftFile, TrailingBytes) { expect_refused(bytes + "xx", "longer than its header"); }

TEST_F(CorruptWeftFile, FlippedPayloadByte) {
  bytes[64 + 17] ^= 0x01;
  expect_refused(bytes, "checksum");
  // Header-only integrity skips the payload scan, by request.
  EXPECT_EQ(token_source_open(bad, Integrity::header)->size(), 100);
}

TEST_F(CorruptWeftFile, FutureVersion) {
  bytes[8] = 3;
  expect_refused(bytes, "version 3", "versions 1 and 2");
}

// The vocab is outside the payload checksum; the header checksum covers it.
TEST_F(CorruptWeftFile, ChangedVocab) {
  bytes[24] = 0x7f;  // vocab 256 -> 383: still a plausible file
  expect_refused(bytes, "header checksum");
  // Even when only the header is checked.
  WEFT_EXPECT_THROW_MSG(token_source_open(bad, Integrity::header), FileFormatError, "header checksum");
}

// Files written before the header checksum (version 1) are still read.
TEST_F(CorruptWeftFile, VersionOneIsStillRead) {
  bytes[8] = 1;
  std::fill(bytes.begin() + 40, bytes.begin() + 48, '\0');
  file_put(bad, bytes);
  EXPECT_EQ(token_source_open(bad)->size(), 100);
}

TEST_F(CorruptWeftFile, UnknownDtype) {
  bytes[12] = 3;
  expect_refused(bytes, "dtype code 3", "uint16");
}

TEST_F(CorruptWeftFile, CountDisagreesWithSize) {
  bytes[16] = 101;
  expect_refused(bytes, "truncated", "101");
}

TEST(WeftTokenFile, ZeroTokensIsEmptyData) {
  TempDir dir;
  const auto path = dir.path("empty.tok");
  token_file_write(path, std::vector<int32_t>{}, 256);
  WEFT_EXPECT_THROW_MSG(token_source_open(path), InputError, path.c_str(), "no tokens");
}

// ---- llm.c .bin -------------------------------------------------------------

TEST(LlmcBin, ReadsUint16Gpt2Files) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0, 65535};
  const auto path = dir.file("fineweb_train_000001.bin", llmc_bytes(20240520, 1, tokens));
  const auto src = token_source_open(path);
  EXPECT_EQ(src->size(), 6);
  EXPECT_EQ(src->vocab(), 0);
  EXPECT_EQ(all_tokens(*src), std::vector<int32_t>(tokens.begin(), tokens.end()));
  EXPECT_NE(src->describe().find("llm.c"), std::string::npos);
}

TEST(LlmcBin, ReadsUint32Llama3Files) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {128000, 9906, 1917, 128001};
  const auto path = dir.file("l3.bin", llmc_bytes(20240801, 7, tokens));
  EXPECT_EQ(all_tokens(*token_source_open(path)),
            std::vector<int32_t>(tokens.begin(), tokens.end()));
}

TEST(LlmcBin, BrokenFilesAreRefused) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {1, 2, 3, 4};
  const std::string good = llmc_bytes(20240520, 1, tokens);
  struct Case {
    std::string bytes;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {good.substr(0, good.size() - 1), {"truncated", "4 uint16 tokens"}},
      {good.substr(0, 500), {"truncated", "1024-byte header"}},
      {good + "zz", {"longer than its header"}},
      {llmc_bytes(20240520, 2, tokens), {"version 2", "20240801 version 7"}},
      {llmc_bytes(20240520, 1, tokens, 9), {"truncated", "9 uint16"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto path = dir.file("bad" + std::to_string(i) + ".bin", cases[i].bytes);
    try {
      token_source_open(path);
      ADD_FAILURE() << "case " << i << " was accepted";
    } catch (const FileFormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const char* s : cases[i].says) EXPECT_NE(msg.find(s), std::string::npos) << msg;
    }
  }
}

// ---- numpy .npy -------------------------------------------------------------

TEST(Npy, ReadsEveryIntegerDtype) {
  TempDir dir;
  const std::vector<int64_t> want = {0, 1, 200, 255};
  const std::vector<int32_t> want32(want.begin(), want.end());
  const auto u2 = dir.file(
      "u2.npy", npy_bytes("<u2", "(4,)", le_payload(std::vector<uint16_t>{0, 1, 200, 255})));
  const auto i4 = dir.file(
      "i4.npy", npy_bytes("<i4", "(4,)", le_payload(std::vector<int32_t>{0, 1, 200, 255})));
  const auto u4 = dir.file(
      "u4.npy", npy_bytes("<u4", "(4,)", le_payload(std::vector<uint32_t>{0, 1, 200, 255}), 2));
  const auto i8 = dir.file("i8.npy", npy_bytes("<i8", "(4,)", le_payload(want)));
  const auto u1 = dir.file(
      "u1.npy", npy_bytes("|u1", "(4,)", le_payload(std::vector<uint8_t>{0, 1, 200, 255})));
  for (const auto& p : {u2, i4, u4, i8, u1}) {
    const auto src = token_source_open(p);
    EXPECT_EQ(all_tokens(*src), want32) << p;
    EXPECT_NE(src->describe().find("numpy"), std::string::npos);
  }
}

TEST(Npy, HeaderPaddingIsNumpys) {
  // numpy aligns the data to 64 bytes; the builder must match for the test to mean anything.
  const std::string b = npy_bytes("<u2", "(3,)", le_payload(std::vector<uint16_t>{1, 2, 3}));
  EXPECT_EQ((b.size() - 6) % 64, 0u);
}

TEST(Npy, BrokenOrUnsupportedFilesAreRefused) {
  TempDir dir;
  const std::string payload = le_payload(std::vector<uint16_t>{1, 2, 3, 4});
  const std::string good = npy_bytes("<u2", "(4,)", payload);
  struct Case {
    std::string bytes;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {good.substr(0, good.size() - 2), {"truncated", "4 uint16"}},
      {good + "x", {"longer than its header"}},
      {good.substr(0, 30), {"truncated", "header dict"}},
      {npy_bytes(">u2", "(4,)", payload), {"'>u2'", "little-endian"}},
      {npy_bytes("<f4", "(2,)", payload), {"'<f4'"}},
      {npy_bytes("<u2", "(2, 2)", payload), {"2-D", "1-D"}},
      {npy_bytes("<u2", "()", payload), {"0-D"}},
      {npy_bytes("<u2", "(4,)", payload, 4), {"version 4"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto path = dir.file("bad" + std::to_string(i) + ".npy", cases[i].bytes);
    try {
      token_source_open(path);
      ADD_FAILURE() << "case " << i << " was accepted";
    } catch (const FileFormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const char* s : cases[i].says)
        EXPECT_NE(msg.find(s), std::string::npos) << "case " << i << ": " << msg;
    }
  }
}

TEST(Npy, EmptyArrayIsEmptyData) {
  TempDir dir;
  const auto path = dir.file("e.npy", npy_bytes("<u2", "(0,)", ""));
  WEFT_EXPECT_THROW_MSG(token_source_open(path), InputError, "no tokens");
}

// ---- detection --------------------------------------------------------------

TEST(TokenSourceOpen, UnreadableInputsSayWhatToDo) {
  TempDir dir;
  WEFT_EXPECT_THROW_MSG(token_source_open(dir.path("nope.tok")), InputError, "nope.tok",
                        "does not exist");
  WEFT_EXPECT_THROW_MSG(token_source_open(dir.file("empty.bin", "")), InputError, "empty.bin",
                        "is empty");
  WEFT_EXPECT_THROW_MSG(token_source_open(dir.file("story.txt", "Once upon a time\n")),
                        FileFormatError, "looks like text", "weft data prepare");
  WEFT_EXPECT_THROW_MSG(
      token_source_open(dir.file("junk.dat", std::string("\x01\x02\x03\x04\x05", 5))),
      FileFormatError, "junk.dat", "not a token file", "20240520");
  dir.file("mega.idx", "MMIDIDX");
  WEFT_EXPECT_THROW_MSG(token_source_open(dir.file("mega.bin", std::string("\x01\x00\x02\x00", 4))),
                        FileFormatError, "Megatron");
}

}  // namespace
}  // namespace weft::test
