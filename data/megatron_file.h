// Megatron-LM indexed datasets, the mmap format that Megatron's
// preprocess_data.py writes (megatron/core/datasets/indexed_dataset.py): a
// PREFIX.bin holding the tokens of every sequence back to back, and a
// PREFIX.idx describing them, all little-endian:
//
//   offset    size  field
//        0       9  magic "MMIDIDX\0\0"
//        9       8  version (uint64), 1
//       17       1  dtype code (uint8): 1 uint8, 2 int8, 3 int16, 4 int32,
//                   5 int64, 6 float64, 7 float32, 8 uint16
//       18       8  sequence count S (uint64)
//       26       8  document index entries D (uint64): documents + 1
//       34     4*S  tokens in each sequence (int32)
//    34+4S     8*S  byte offset of each sequence in the .bin (int64)
//   34+12S     8*D  document index (int64): document d is sequences
//                   [index[d], index[d+1]); index[0] = 0, index[D-1] = S
//
// A document is one or more sequences (one per document unless the data was
// split into sentences). Multimodal datasets add a mode byte per sequence at
// the end of the .idx; weft reads token datasets only and refuses them.
//
// weft reads a dataset as the stream of its sequences in index order, which
// must lie back to back from byte 0 of the .bin and fill it exactly (as
// Megatron's builder always writes them), so the .bin is one token array and
// samples are cut from it as from any other token file (loader.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/checksum.h"
#include "data/token_file.h"
#include "data/token_source.h"

namespace weft::data {

inline constexpr char kMegatronIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMegatronIdxVersion = 1;
inline constexpr int64_t kMegatronIdxHeaderBytes = 34;

// The two files of one dataset.
struct MegatronPaths {
  std::string prefix;  // without extension
  std::string bin, idx;
};

// The dataset `path` names, if it names one: PREFIX.idx, PREFIX.bin with a
// PREFIX.idx beside it, or a PREFIX that is no file itself while PREFIX.bin
// or PREFIX.idx exists. Looks at names and existence only.
std::optional<MegatronPaths> megatron_paths(const std::string& path);

// What a dataset's .idx says, beside its tokens.
struct MegatronInfo {
  TokenDtype dtype = TokenDtype::u16;
  int64_t tokens = 0;
  int64_t sequences = 0;
  int64_t documents = 0;
};

// A dataset read as one token stream (its sequences in index order).
class MegatronTokenSource final : public TokenSource {
 public:
  MegatronTokenSource(MegatronPaths paths, MegatronInfo info,
                      std::unique_ptr<MappedTokenSource> tokens);
  int64_t size() const override { return tokens_->size(); }
  int64_t vocab() const override { return 0; }  // the format does not record it
  int64_t token(int64_t index) const override { return tokens_->token(index); }
  void tokens_copy(int64_t start, int64_t count, int32_t* out) const override {
    tokens_->tokens_copy(start, count, out);
  }
  std::optional<BadToken> token_find_bad(int64_t vocab) const override {
    return tokens_->token_find_bad(vocab);
  }
  // "Megatron .bin/.idx 'data/x' (uint16, 1000 tokens, 12 sequences in 10 documents)"
  std::string describe() const override;
  const MegatronPaths& paths() const { return paths_; }
  const MegatronInfo& info() const { return info_; }

 private:
  MegatronPaths paths_;
  MegatronInfo info_;
  std::unique_ptr<MappedTokenSource> tokens_;
};

// Opens a dataset by mmap and checks its .idx against its .bin: magic,
// version and dtype code, the .idx's size against its counts, the document
// index (from 0 to S, never decreasing), and every sequence's length and
// offset (with Integrity::header only the first and last: O(1) for huge
// datasets). FileFormatError naming the file and what is wrong; InputError
// when a file is missing or the dataset holds no tokens.
std::unique_ptr<MegatronTokenSource> megatron_open(const MegatronPaths& paths,
                                                   Integrity integrity = Integrity::full);

// The dtype weft writes for ids below `vocab`: uint16 while every id fits
// (vocab <= 65536), else int32. Megatron's reader takes either.
TokenDtype megatron_dtype_for(int64_t vocab);

struct MegatronWritten {
  MegatronInfo info;
  uint64_t checksum = 0;  // XXH64 of the .bin (checksum.h)
};

// Streams documents into PREFIX.bin and PREFIX.idx. As with TokenFileWriter,
// nothing appears under the real names until finish(): both files are written
// beside them under temporary names, synced, and renamed, the .bin first, so
// a dataset is complete or absent (a crash between the two renames leaves a
// .bin that its old .idx no longer matches, which the reader refuses). A
// writer destroyed without finish() removes its temporary files.
class MegatronWriter {
 public:
  // `vocab` > 0: every appended id must be below it; it picks the dtype.
  MegatronWriter(std::string prefix, int64_t vocab);
  ~MegatronWriter();
  MegatronWriter(const MegatronWriter&) = delete;
  MegatronWriter& operator=(const MegatronWriter&) = delete;

  // Adds one sequence to the current document. One longer than an int32
  // length can say is stored as several sequences.
  void sequence_append(std::span<const int32_t> tokens);
  // Ends the current document (one with no sequences is allowed, as in Megatron).
  void document_end();
  // A whole document of one sequence.
  void document_append(std::span<const int32_t> tokens) {
    sequence_append(tokens);
    document_end();
  }
  int64_t count() const { return count_; }
  // Ends an open document, writes the .idx and renames both into place.
  MegatronWritten finish();

 private:
  void bin_write(const void* data, size_t bytes);
  MegatronPaths paths_;
  std::string bin_tmp_, idx_tmp_;
  std::FILE* bin_ = nullptr;
  int64_t vocab_;
  TokenDtype dtype_;
  int64_t count_ = 0;
  std::vector<int32_t> lengths_;       // (S)
  std::vector<int64_t> document_index_; // (documents + 1)
  Checksum64 checksum_;
};

}  // namespace weft::data
