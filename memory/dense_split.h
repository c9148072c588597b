// Expert parallelism under ZeRO: who keeps the optimizer state of a stage's
// dense parameters.
//
// The ZeRO shard group under expert parallelism is the expert data-parallel
// group: it splits the stage's flat parameters into equal shards as it would
// without experts. The shard groups holding the same shard (the ep replicas)
// hold different experts at the shard's expert positions but the same dense
// parameters (attention, norms, router, shared expert, embedding, head) at
// the others. Each replica keeps the optimizer state of the shard's experts
// and of 1/R of its dense elements, in flat order: replica r takes dense
// elements [r * part, (r + 1) * part) of the shard's, part = ceil(dense / R).
// So the dense state is sharded over every dp x cp rank, as Megatron's
// distributed optimizer shards it, and the experts' over the expert
// data-parallel group. The replicas reduce-scatter the dense gradients
// instead of all-reducing them, and all-gather the updated dense weights.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/layout.h"
#include "core/model_spec.h"
#include "memory/shapes.h"

namespace weft::memory {

struct FlatRange {
  int64_t begin = 0, end = 0;
  bool operator==(const FlatRange&) const = default;
};

// f(offset, count) for each part of [flat, flat + n) outside `ranges`
// (ascending, each with begin and end), offsets from flat.
template <typename Ranges, typename F>
void for_each_outside(const Ranges& ranges, int64_t flat, int64_t n, F f) {
  int64_t at = flat;
  const int64_t end = flat + n;
  for (const auto& r : ranges) {
    if (r.end <= at) continue;
    if (r.begin >= end) break;
    if (r.begin > at) f(at - flat, r.begin - at);
    at = r.end;
  }
  if (at < end) f(at - flat, end - at);
}

// Whether the layout splits the dense state over the ep replicas: expert
// parallelism with ZeRO 1-3 and more than one shard group per shard.
bool dense_split(const Layout& l);

// One MoE block's routed experts' flat elements on one rank: their weights
// (E / ep experts, their width over etp), or under LoRA their adapters.
int64_t moe_block_expert_elements(const ModelSpec& m, const Layout& l, const LoraSpec& lora);

// The routed experts' flat ranges of one rank of `stage` (each MoE block's
// local experts, or under LoRA their adapters), ascending; empty without
// expert parallelism. The order of the trainer's flat buffers
// (trainer/model/params.h).
void stage_expert_ranges(const ModelSpec& m, const Layout& l, const StagePlan& plan, std::vector<FlatRange>& out);

// One replica's part of one shard.
class DenseSplit {
 public:
  DenseSplit() = default;
  // The shard [lo, hi) of the flat parameters, the stage's expert ranges
  // (ascending), and the replica `replica` of `replicas`.
  DenseSplit(int64_t lo, int64_t hi, std::vector<FlatRange> experts, int64_t replicas, int64_t replica);

  int64_t lo() const { return lo_; }
  int64_t hi() const { return hi_; }
  int64_t dense() const { return dense_; }  // the shard's dense elements
  // The flat ranges whose state this replica keeps (the shard's experts and
  // its dense part), ascending, and their total.
  const std::vector<FlatRange>& owned() const { return owned_; }
  int64_t owned_elements() const { return owned_elements_; }
  // f(offset, count) for each dense run of [flat, flat + n) (within the
  // shard), offsets from flat.
  template <typename F>
  void for_each_dense(int64_t flat, int64_t n, F f) const {
    for_each_outside(experts_, flat, n, f);
  }
  // Each replica's elements of the dense run [flat, flat + n) (no expert
  // position inside it), in replica order: contiguous and ascending, so a
  // reduce-scatter or all-gather over the replicas moves them in place; and
  // where this replica's start in the run.
  void run_counts(int64_t flat, int64_t n, std::vector<int64_t>& counts, int64_t& mine_at) const;

 private:
  // Dense elements of the shard in [lo, x), x within the shard.
  int64_t dense_before(int64_t x) const;

  int64_t lo_ = 0, hi_ = 0, replicas_ = 1, replica_ = 0, dense_ = 0, part_ = 0;
  std::vector<FlatRange> experts_;  // clipped to the shard
  std::vector<FlatRange> owned_;
  int64_t owned_elements_ = 0;
};

// The ZeRO shards' sizes over the shard group (l.zero_shards() of them),
// shard r starting where r - 1 ends: equal cuts of the psi flat elements
// (the last one fewer), or under the dense split with ZeRO-1 (whose
// gradients and weights are whole on every rank) cuts that give every shard
// the same state to keep: an expert element weighs `replicas`, a dense one
// 1, so a shard of the embedding's dense elements takes more of the flat
// buffer than one of experts. `experts` ascending (stage_expert_ranges).
void zero_shard_counts(const Layout& l, int64_t psi, std::span<const FlatRange> experts, std::vector<int64_t>& counts);

// The optimizer state elements a rank of `stage` keeps under dense_split():
// the largest over the shard groups and replicas (every rank allocates it).
// `psi` is stage_param_elements.
int64_t dense_split_state_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan, int64_t psi);

}  // namespace weft::memory
