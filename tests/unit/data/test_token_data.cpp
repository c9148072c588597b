// Opening data folders (prepared, and llm.c-style shards), checking ids
// against the model's vocab, and the sequence-length check.
#include <cmath>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data_test_util.h"
#include "data/token_data.h"

namespace weft::test {
namespace {

using namespace weft::data;

TEST(TokenData, ShardFolderConcatenatesInNameOrder) {
  TempDir dir;
  dir.file("d/data_train_000002.bin", llmc_bytes(20240520, 1, std::vector<uint16_t>{5, 6}));
  dir.file("d/data_train_000001.bin", llmc_bytes(20240520, 1, std::vector<uint16_t>{1, 2, 3}));
  dir.file("d/data_val_000000.bin", llmc_bytes(20240520, 1, std::vector<uint16_t>{9, 9}));
  dir.file("d/README.md", "not data");
  const auto d = token_data_open(dir.path("d"));
  ASSERT_TRUE(d.train && d.val);
  EXPECT_TRUE(d.meta.is_null());
  EXPECT_EQ(d.train->size(), 5);
  std::vector<int32_t> got(5);
  d.train->tokens_copy(0, 5, got.data());  // a copy that straddles the two shards
  EXPECT_EQ(got, (std::vector<int32_t>{1, 2, 3, 5, 6}));
  EXPECT_EQ(d.train->token(3), 5);
  std::vector<int32_t> mid(2);
  d.train->tokens_copy(2, 2, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(d.val->size(), 2);
}

TEST(TokenData, PreparedFolderByMeta) {
  TempDir dir;
  token_file_write(dir.path("p/train.tok"), std::vector<int32_t>{1, 2, 3, 4}, 256);
  token_file_write(dir.path("p/val.tok"), std::vector<int32_t>{7, 8}, 256);
  dir.file("p/meta.json", R"({"format": "weft-data", "version": 1, "train": {"file": "train.tok"},
                              "val": {"file": "val.tok"}, "unigram_entropy_nats": 1.25})");
  const auto d = token_data_open(dir.path("p"));
  EXPECT_EQ(d.train->size(), 4);
  EXPECT_EQ(d.val->size(), 2);
  EXPECT_DOUBLE_EQ(token_data_baseline(d), 1.25);
}

// Every field of meta.json that weft reads is checked when the folder is
// opened: a damaged or hand-edited file is one error naming the field.
TEST(TokenData, PreparedFolderMetaFieldsAreChecked) {
  TempDir dir;
  token_file_write(dir.path("p/train.tok"), std::vector<int32_t>{1, 2, 3, 4}, 256);
  token_file_write(dir.path("outside.tok"), std::vector<int32_t>{1, 2, 3, 4}, 256);
  const auto open_with = [&](const std::string& meta) {
    dir.file("p/meta.json", meta);
    return token_data_open(dir.path("p"));
  };
  const auto good = open_with(R"({"train": {"file": "train.tok"}, "vocab": 256, "tokenizer": "byte",
                                  "created_by": "weft 0.1.0", "document_tokens": {"description": "none"},
                                  "tokenizer_file": null})");
  EXPECT_EQ(token_data_meta_vocab(good), 256);
  const auto lines = token_data_meta_lines(good);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("prepared by weft 0.1.0, byte tokenizer, vocab 256"), std::string::npos);
  EXPECT_EQ(lines[1], "  documents: none");

  WEFT_EXPECT_THROW_MSG(open_with("[1, 2]"), FileFormatError, "meta.json", "not a JSON object");
  WEFT_EXPECT_THROW_MSG(open_with(R"({"train": {"file": 7}})"), FileFormatError, "\"train\"");
  WEFT_EXPECT_THROW_MSG(open_with(R"({"train": {"file": "../outside.tok"}})"), FileFormatError, "train.file",
                        "inside the folder", "../outside.tok");
  WEFT_EXPECT_THROW_MSG(open_with(R"({"train": {"file": "/etc/passwd"}})"), FileFormatError, "train.file");
  WEFT_EXPECT_THROW_MSG(open_with(R"({"train": {"file": ""}})"), FileFormatError, "train.file");
  for (const char* vocab : {"\"256\"", "-1", "2.5", "1e30", "4294967297", "18446744073709551615"})
    WEFT_EXPECT_THROW_MSG(open_with(std::string(R"({"train": {"file": "train.tok"}, "vocab": )") + vocab + "}"),
                          FileFormatError, "\"vocab\"", "whole number");
  for (const char* h : {"-0.5", "\"x\"", "1e400"})
    WEFT_EXPECT_THROW_MSG(
        open_with(std::string(R"({"train": {"file": "train.tok"}, "unigram_entropy_nats": )") + h + "}"),
        FileFormatError, "unigram_entropy_nats");
  WEFT_EXPECT_THROW_MSG(open_with(R"({"train": {"file": "train.tok"}, "tokenizer": 3})"), FileFormatError,
                        "\"tokenizer\"", "a string");
  WEFT_EXPECT_THROW_MSG(open_with(R"({"train": {"file": "train.tok"}, "tokenizer_file": "x"})"),
                        FileFormatError, "tokenizer_file", "an object or null");
  WEFT_EXPECT_THROW_MSG(open_with(R"({"train": {"file": "train.tok"}, "document_tokens": {"description": 1}})"),
                        FileFormatError, "document_tokens.description");
}

TEST(TokenData, SingleFileIsAllTrain) {
  TempDir dir;
  const auto path = dir.path("one.tok");
  token_file_write(path, std::vector<int32_t>{1, 1, 2, 2}, 256);
  const auto d = token_data_open(path);
  EXPECT_EQ(d.train->size(), 4);
  EXPECT_EQ(d.val, nullptr);
  EXPECT_NEAR(token_data_baseline(d), std::log(2.0), 1e-12);
}

TEST(TokenData, MissingOrEmptyDataIsAClearError) {
  TempDir dir;
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("nowhere")), InputError, "nowhere",
                        "does not exist");
  std::filesystem::create_directories(dir.path("empty"));
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("empty")), InputError, "empty", "is empty");
  dir.file("other/notes.txt", "hello");
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("other")), InputError, "meta.json", "*train*");
  dir.file("broken/meta.json", R"({"format": "weft-data", "train": {"file": "train.tok"}})");
  WEFT_EXPECT_THROW_MSG(token_data_open(dir.path("broken")), InputError, "train.tok",
                        "does not exist");
  WEFT_EXPECT_THROW_MSG(token_data_open(""), InputError, "no data path");
}

TEST(ValidateVocab, NamesTheFirstBadIdAndItsPosition) {
  TempDir dir;
  const auto path = dir.path("t.tok");
  token_file_write(path, std::vector<int32_t>{1, 2, 300, 3, 500}, 1000);
  const auto src = token_source_open(path);
  EXPECT_NO_THROW(validate_vocab(*src, 501));
  WEFT_EXPECT_THROW_MSG(validate_vocab(*src, 256), InputError, "token id 300", "position 2", "256",
                        path.c_str());
}

TEST(ValidateVocab, NegativeIdsFromSignedFiles) {
  TempDir dir;
  const auto path =
      dir.file("n.npy", npy_bytes("<i8", "(3,)", le_payload(std::vector<int64_t>{4, -1, 5})));
  WEFT_EXPECT_THROW_MSG(validate_vocab(*token_source_open(path), 256), InputError, "-1",
                        "position 1");
  // int64 ids beyond int32 are caught before they could wrap.
  const auto big = dir.file(
      "b.npy",
      npy_bytes("<i8", "(2,)", le_payload(std::vector<int64_t>{1, (int64_t{1} << 32) + 5})));
  WEFT_EXPECT_THROW_MSG(validate_vocab(*token_source_open(big), 256), InputError, "4294967301");
}

TEST(ValidateVocab, ConcatReportsTheGlobalPosition) {
  std::vector<std::unique_ptr<TokenSource>> parts;
  parts.push_back(std::make_unique<MemoryTokenSource>(std::vector<int32_t>{1, 2, 3}, 10));
  parts.push_back(std::make_unique<MemoryTokenSource>(std::vector<int32_t>{4, 12}, 10));
  const ConcatTokenSource cat(std::move(parts));
  WEFT_EXPECT_THROW_MSG(validate_vocab(cat, 10), InputError, "token id 12", "position 4");
}

TEST(TokenDataValidate, SequenceLongerThanTheData) {
  TempDir dir;
  token_file_write(dir.path("p/train.tok"), std::vector<int32_t>(100, 1), 256);
  token_file_write(dir.path("p/val.tok"), std::vector<int32_t>(10, 1), 256);
  dir.file("p/meta.json", R"({"train": {"file": "train.tok"}, "val": {"file": "val.tok"}})");
  const auto d = token_data_open(dir.path("p"));
  EXPECT_NO_THROW(token_data_validate(d, 256, 9));
  WEFT_EXPECT_THROW_MSG(token_data_validate(d, 256, 10), InputError, "sequence length 10", "11",
                        "val.tok", "10 tokens");
  WEFT_EXPECT_THROW_MSG(token_data_validate(d, 256, 0), InputError, "sequence length 0");
  WEFT_EXPECT_THROW_MSG(token_data_validate(d, 1, 4), InputError, "token id 1", "vocab [0, 1)");
}

}  // namespace
}  // namespace weft::test
