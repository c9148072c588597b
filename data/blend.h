// Weighted blends of token data (`--data 0.7 a 0.3 b`), after Megatron-LM's
// BlendedDataset: each sample comes from one part, and the parts' shares of
// the samples follow their weights.
//
// Which part sample i comes from is a pure function of i and the weights, so
// any rank can ask for any index and a run resumes from a saved global index
// with nothing rebuilt. The parts sit at the leaves of a balanced binary tree;
// each inner node sends its samples left or right like Bresenham's line: of
// its first n samples, floor(p*n + 1/2) go left, p being the left subtree's
// share of the node's weight. Sample i walks down from the root, and its
// index among the samples a node has received is all the walk needs. Each
// level rounds by at most half a sample, so every prefix of n samples holds
// w*n samples of a part of normalised weight w to within half the tree's
// depth, ceil(log2 parts) / 2, at O(log parts) per sample.
//
// Megatron instead materialises the whole order up front, greedily giving
// each sample to the part furthest below its share: shares as close, but an
// index array as long as the run. Neither order depends on the seed; the
// seed shuffles the windows within each part (loader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_source.h"

namespace weft::data {

class BlendSchedule {
 public:
  // One weight per part, each >= 0, summing to more than 0 (the caller has
  // checked; see data_spec.h).
  explicit BlendSchedule(const std::vector<double>& weights);

  struct Pick {
    int64_t part = 0;   // which part sample i comes from
    int64_t index = 0;  // how many samples of that part came before it
  };
  Pick pick(int64_t global_index) const;
  int64_t parts() const { return parts_; }

 private:
  struct Node {
    int64_t left = -1, right = -1;  // children, or -1 at a leaf
    int64_t part = -1;              // at a leaf
    uint64_t share = 0;             // left subtree's share in units of 2^-53
  };
  int64_t build(const std::vector<double>& weights, int64_t lo, int64_t hi);
  std::vector<Node> nodes_;  // nodes_[0] is the root
  int64_t parts_ = 0;
};

// The parts of a blend read back to back as one source (for the vocab scan,
// the size and describe()), whose blend_parts() tells the loader to draw
// samples from each part by its weight.
class BlendTokenSource final : public TokenSource {
 public:
  BlendTokenSource(std::vector<std::unique_ptr<TokenSource>> parts, std::vector<double> weights);
  int64_t size() const override { return all_.size(); }
  int64_t vocab() const override { return all_.vocab(); }
  int64_t token(int64_t index) const override { return all_.token(index); }
  void tokens_copy(int64_t start, int64_t count, int32_t* out) const override {
    all_.tokens_copy(start, count, out);
  }
  std::optional<BadToken> token_find_bad(int64_t vocab) const override {
    return all_.token_find_bad(vocab);
  }
  // "blend of 0.7 x weft .tok 'a.tok' (...), 0.3 x ..."
  std::string describe() const override;
  std::vector<WeightedPart> blend_parts() const override;

 private:
  ConcatTokenSource all_;
  std::vector<double> weights_;
};

}  // namespace weft::data
