// The training data loader: which tokens sample i of a run reads.
//
// The source is cut into W = (N - 1) / T non-overlapping windows of T + 1
// tokens (window w starts at token w*T; neighbours share one token, the last
// target of one window being the first input of the next). Sample i reads
// window perm_e(i mod W) where e = i / W is its epoch and perm_e is a seeded
// permutation of [0, W) drawn afresh for each epoch. inputs are the window's
// first T tokens, targets its last T.
//
// A sample depends only on (source, T, seed, i): not on the number of ranks,
// the parallel layout, or which samples were read before. A rank reads
// exactly the global indices it owns (by convention sample b of step s is
// i = s * global_batch + b, and a data-parallel rank owns a contiguous range
// of b), a run resumes from a saved global index, and two layouts of the same
// run see the same samples in the same order.
//
// The permutation is a Feistel bijection evaluated per index (permutation.h)
// rather than a shuffled index array: O(1) memory and set-up at any corpus
// size, and no epoch-sized work on the first sample of each epoch.
//
// Every format is read as one stream of tokens: a Megatron dataset as its
// sequences in index order, which is how its .bin stores them. Windows are
// cut from that stream without regard to document ends, exactly as for
// weft .tok or llm.c .bin files, so a sample may hold the end of one document
// and the start of the next (a separator token, such as the EOD that
// Megatron's preprocess_data appends with --append-eod, tells the model
// where); documents are never reordered. Megatron's GPTDataset also packs samples across documents,
// but in a per-epoch shuffled document order.
//
// A blend (blend.h) is sampled part by part: its schedule says which part
// sample i comes from and that it is the part's k-th sample, and the part
// reads window perm_e(k mod W_part) of its own windows, as above, with a seed
// of its own drawn from the run's seed. A source that is not a blend is one
// part and reads exactly as described above.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/blend.h"
#include "data/permutation.h"
#include "data/token_source.h"

namespace weft::data {

class Loader {
 public:
  enum class Order {
    shuffled,    // seeded permutation per epoch (training)
    sequential,  // window i mod W (inspection, debugging)
  };

  // `source` must outlive the loader. InputError when seq < 1 or the source
  // (each part of weight > 0, for a blend) holds fewer than seq + 1 tokens.
  Loader(const TokenSource& source, int64_t seq, uint64_t seed, Order order = Order::shuffled);

  int64_t seq() const { return seq_; }
  // Windows of all parts together.
  int64_t windows() const;
  int64_t parts() const { return static_cast<int64_t>(parts_.size()); }
  // The part sample `global_index` comes from and its index among that
  // part's samples: {0, global_index} unless the source is a blend.
  BlendSchedule::Pick pick(int64_t global_index) const;
  // The epoch of the part's windows the sample falls in.
  int64_t epoch(int64_t global_index) const;
  // The window the sample reads, in [0, windows of its part).
  int64_t window(int64_t global_index) const;

  // Thread-safe: reads only the immutable source.
  void sample(int64_t global_index, int32_t* inputs /* (T) */, int32_t* targets /* (T) */) const;
  // Samples first .. first + count - 1, row b holding sample first + b.
  void batch(int64_t first, int64_t count, int32_t* inputs /* (B, T) */,
             int32_t* targets /* (B, T) */) const;

 private:
  struct Part {
    const TokenSource* source;
    int64_t windows;  // 0 for a part of weight 0, which is never read
    uint64_t seed;
  };
  int64_t part_window(BlendSchedule::Pick pick) const;
  int64_t seq_;
  Order order_;
  std::vector<Part> parts_;
  std::optional<BlendSchedule> schedule_;  // for two parts or more
};

// Validation samples: a fixed order of the val split's windows, the same for
// every run and training seed, shuffled so that the first K samples spread
// over the whole split instead of its first K windows. Evaluate samples
// 0 .. K-1 each time.
inline constexpr uint64_t kValidationSeed = 0x76616C6964617465ull;  // "validate"
Loader validation_loader(const TokenSource& val, int64_t seq);

// How many validation samples to evaluate when `asked` were asked for (by
// `flag`, e.g. "--eval-samples"): at most the distinct windows the split
// holds, since more would only repeat them (and a huge request would run
// for ever). `note` says why when the count was capped, e.g. "the data holds
// 2 windows of 257 tokens; --eval-samples 1000 asked for more", and is empty
// otherwise.
struct ValidationSamples {
  int64_t samples = 0;
  int64_t windows = 0;
  std::string note;
};
ValidationSamples validation_samples(const TokenSource& val, int64_t seq, int64_t asked, const std::string& flag);

}  // namespace weft::data
