// Byte-pair encoding of one pre-token, as Hugging Face tokenizers' BPE model
// does it, on raw bytes.
//
// A pre-token starts as one symbol per byte (the byte's token). Then, again
// and again, the adjacent pair whose merge has the lowest rank is merged,
// the leftmost such pair first, until no adjacent pair has a merge. With
// ignore_merges (Llama 3) a pre-token that is itself a vocab entry is taken
// whole first. A byte without a token becomes the unk token when the model
// has one (consecutive ones fused with fuse_unk), and is dropped otherwise.
//
// Short words (nearly all) scan an array of pair ranks; longer ones use a
// min-heap of (rank, position) with lazy deletion, as the reference does,
// so a megabyte-long "word" costs n log n, not n^2. Both give the same
// merges (tests check them against each other). Words that needed merging
// are cached per thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/hf_tokenizer_json.h"
#include "data/string_table.h"

namespace weft::data {

enum class MergeStrategy { automatic, scan, heap };

// One thread's working memory: the words it has merged (bounded, cleared
// when full) and the symbol buffer.
class BpeState {
 public:
  static constexpr size_t kMaxWordBytes = 64;
  static constexpr int64_t kMaxWords = 1 << 16;

  const int32_t* find(std::string_view word, size_t& count) const;
  void insert(std::string_view word, const int32_t* ids, size_t count);

 private:
  StringTable index_;  // word -> (offset into ids_) << 16 | count
  std::vector<int32_t> ids_;
  std::vector<int32_t> symbols_;
  friend class BpeModel;
};

class BpeModel {
 public:
  explicit BpeModel(const HfTokenizerSpec& spec);

  // Appends the ids of one pre-token (raw bytes, not empty) to `out`.
  // `strategy` other than automatic is for tests, and bypasses the cache.
  void encode_word(std::string_view word, std::vector<int32_t>& out, BpeState& state,
                   MergeStrategy strategy = MergeStrategy::automatic) const;

 private:
  // Open addressing from a pair of ids to the merge's rank and result.
  struct Merge {
    int32_t rank = -1;
    int32_t id = -1;
  };
  struct Slot {
    uint64_t key = ~uint64_t{0};
    Merge merge;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  Merge merge_of(int32_t a, int32_t b) const;
  void merges_build(const std::vector<std::pair<int32_t, int32_t>>& pairs,
                    const std::vector<int32_t>& results);

  void symbols_init(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge_scan(std::vector<int32_t>& symbols) const;
  void merge_heap(std::vector<int32_t>& symbols) const;

  StringTable vocab_;  // raw bytes -> id
  std::array<int32_t, 256> byte_ids_;  // the token of each single byte, -1 when none
  std::vector<Slot> slots_;
  uint64_t slot_mask_ = 0;
  bool ignore_merges_;
  int32_t unk_;
  bool fuse_unk_;
};

}  // namespace weft::data
