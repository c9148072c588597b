// cross_entropy: softmax cross-entropy over a vocab shard, in three phases so
// that a vocab-parallel loss can reduce over the tp ranks in between:
//
//   (a) CrossEntropyMaxParams      row_max = max of the local logits
//       -> all-reduce max over tp
//   (b) CrossEntropySumExpParams   sum_exp = sum of exp(logit - row_max) of the shard
//       -> all-reduce sum over tp
//   (c) CrossEntropyLossGradParams per-row loss, and the gradient
//       (softmax - onehot(target)) * grad_scale written over the logits
//
// On one rank the reductions are the identity and the phases compose to the
// ordinary loss. The logits are read three times but exist once: phase (c)
// overwrites them with their gradient.
//
// Partial target logits: only the rank whose shard holds a row's target adds
// the target term, and it writes the whole row loss
//   loss = log(sum_exp) + row_max - logit[target];
// the other ranks write 0. Summing the loss over the tp ranks therefore gives
// the loss, and that sum can ride on the logging all-reduce: the gradient does
// not need it. Rows whose target is ignore_index get loss 0 and a zero
// gradient on every rank. Targets outside [0, V) that are not ignore_index
// throw weft::InputError naming the target, its row and V, unless
// ids_checked says the caller checked them (as for embedding: the CUDA
// backend then skips the check and its stream synchronisation, and such a
// target is owned by no rank: loss 0, and the softmax alone as gradient).
//
// rows = B * T tokens; V_local = V / tp, or of a padded vocabulary Vp / tp
// (ModelSpec::padded_vocab). Padding columns, those of ids vocab_start + j >=
// V, get no probability: phases (a) and (b) read only the first `valid`
// columns, and phase (c) writes their gradient as 0. The loss is then the
// unpadded model's, and the padded rows of the head get no gradient. A shard
// may be all padding (valid 0: row max -inf, sum 0).
#pragma once

#include <cstdint>

#include "kernels/kernel.h"

namespace weft::kernels {

template <typename Elem>
struct CrossEntropyMaxParams {
  int64_t rows = 0;
  int64_t V_local = 0;
  const Elem* logits = nullptr;  // (rows, V_local)
  Acc<Elem>* row_max = nullptr;  // (rows) this shard's max
  int64_t valid = -1;            // columns [0, valid) are vocabulary, the rest padding; -1: all
};

template <typename Elem>
struct CrossEntropySumExpParams {
  int64_t rows = 0;
  int64_t V_local = 0;
  const Elem* logits = nullptr;        // (rows, V_local)
  const Acc<Elem>* row_max = nullptr;  // (rows) max over all shards
  Acc<Elem>* sum_exp = nullptr;        // (rows) this shard's sum
  int64_t valid = -1;                  // columns [0, valid) are vocabulary, the rest padding; -1: all
};

template <typename Elem>
struct CrossEntropyLossGradParams {
  int64_t rows = 0;
  int64_t V = 0;            // full vocabulary, unpadded: ids >= V are padding
  int64_t vocab_start = 0;  // the id of column 0
  int64_t V_local = 0;
  Elem* logits = nullptr;              // (rows, V_local) in: logits; out: their gradient
  const int32_t* targets = nullptr;    // (rows) in [0, V) or ignore_index
  const Acc<Elem>* row_max = nullptr;  // (rows) max over all shards
  const Acc<Elem>* sum_exp = nullptr;  // (rows) sum over all shards
  Acc<Elem>* loss = nullptr;           // (rows) optional: the row loss on the owning rank, else 0
  double grad_scale = 1.0;             // e.g. 1 / (non-ignored tokens of the step)
  int32_t ignore_index = -100;
  bool ids_checked = false;
};

// The vocabulary columns of a shard: [0, valid_columns) of V_local.
inline int64_t valid_columns(int64_t valid, int64_t V_local) { return valid < 0 ? V_local : valid; }
inline int64_t valid_columns(int64_t V, int64_t vocab_start, int64_t V_local) {
  return V - vocab_start <= 0 ? 0 : (V - vocab_start < V_local ? V - vocab_start : V_local);
}

template <typename Elem>
bool supports(const CrossEntropyMaxParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const CrossEntropyMaxParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const CrossEntropyMaxParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const CrossEntropySumExpParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const CrossEntropySumExpParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const CrossEntropySumExpParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const CrossEntropyLossGradParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const CrossEntropyLossGradParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const CrossEntropyLossGradParams<Elem>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
