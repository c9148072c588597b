// The search's memory bounds (space_bounds.h): a subspace's, and its
// layouts' one by one.
#include "tuner/space_bounds.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "memory/shapes.h"

namespace weft::tuner {

namespace {

// The data-parallel buffers of ZeRO and tied embeddings (memory/shapes_comm),
// whose size follows ZeRO and the gradient type.
bool sharding_buffer(const memory::TensorShape& t) {
  return t.category == memory::Category::comm &&
         (std::strncmp(t.name, "comm.dp_", 8) == 0 || std::strncmp(t.name, "comm.tied_", 10) == 0);
}

// A stage's bytes that neither ZeRO nor the gradient type sets, from its
// table's part after the state (memory::stage_other_shapes): all but FP8's
// state and the data-parallel buffers.
int64_t rest_bytes(const std::vector<memory::TensorShape>& other) {
  int64_t sum = 0;
  for (const auto& t : other) {
    const bool state = t.category == memory::Category::weights || t.category == memory::Category::grads ||
                       t.category == memory::Category::optimizer;
    if (!state && !sharding_buffer(t)) sum += t.bytes();
  }
  return sum;
}

}  // namespace

// A lower bound on memory::estimate(...).peak() of every valid layout of a
// subspace. Of a stage's table (memory/shapes), with everything else of the
// shape fixed:
// - weights, gradients and optimizer state are at least the stage's
//   parameters sharded over dp x cp, at the narrowest gradient type;
// - the saved activations are at least full checkpointing's on every layer
//   (the block inputs every mode keeps, and one block's rebuilt tensors,
//   which every other mode keeps for at least one block);
// - the rest (logits, scratch, kernel workspaces, the tp, pp and cp
//   buffers, the runtime) depends only on the shape, the attention and the
//   norm, less the data-parallel buffers of ZeRO and tied embeddings (whose
//   size follows ZeRO and the gradient type): taken at the least over the
//   valid attention kinds and the norms.
// The worst stage holds at least the first's and the last's.
// Asked whether the bound lies past `past`, it stops as soon as it knows:
// an end whose state and least rest so far come to at most `past` is not
// priced further, and the first end past it ends the walk.
int64_t memory_lower_bound(const SpaceContext& ctx, const Subspace& s, const std::vector<size_t>& valid_attentions,
                           int64_t past) {
  const ModelSpec& m = ctx.model;
  const RunSpec& run = ctx.run;
  int64_t narrowest = 4;
  for (GradPrecision g : s.grads) narrowest = std::min<int64_t>(narrowest, g == GradPrecision::bf16 ? 2 : 4);
  const int64_t per_param = run.compute_bytes() + narrowest + (run.precision == Precision::bf16 ? 12 : 8);
  thread_local std::vector<memory::TensorShape> table;
  const bool asked = past < std::numeric_limits<int64_t>::max();  // (else the bound itself)
  int64_t bound = 0;
  const int64_t ends[] = {0, s.shape.pp - 1};  // at pp 1 one stage, the first and the last
  for (int e = 0; e < (s.shape.pp > 1 ? 2 : 1); ++e) {
    const int64_t stage = ends[e];
    Layout l = s.shape;
    const memory::StagePlan plan = memory::stage_plan(m, run, l, stage);
    const int64_t params = memory::stage_param_elements(m, l, plan) / l.shard_ways();
    // LoRA's frozen base: whole on every dp rank, in the compute type.
    const int64_t frozen = memory::stage_frozen_elements(m, l, plan) * run.compute_bytes();
    const int64_t state = params * per_param + frozen;
    int64_t least = std::numeric_limits<int64_t>::max();
    l.ckpt = Checkpointing::full;
    l.ckpt_layers = 0;
    const memory::StagePlan full = memory::stage_plan(m, run, l, stage);  // (neither kernel sets the plan)
    for (size_t a : valid_attentions) {
      for (NormKind norm : s.norms) {
        l.attention = s.attentions[a];
        l.norm = norm;
        memory::stage_other_shapes(m, run, l, ctx.cluster.device, full, table);
        least = std::min(least, rest_bytes(table));
        if (asked && least + state <= past) break;
      }
      if (asked && least + state <= past) break;
    }
    bound = std::max(bound, least + state);
    if (bound > past) return bound;
  }
  return bound;
}

Member member_of(const Subspace& s, int64_t i) {
  Member x;
  const auto take = [&i](size_t n) {
    const size_t k = size_t(i % int64_t(n));
    i /= int64_t(n);
    return k;
  };
  x.g = take(s.grads.size());
  x.z = take(s.zeros.size());
  x.n = take(s.norms.size());
  x.a = take(s.attentions.size());
  x.c = take(s.ckpts.size());
  return x;
}

MemoryBounds::MemoryBounds(const SpaceContext& ctx, const Subspace& s) : ctx_(ctx), s_(s), work_(s.shape) {
  for (int k = 0; k < 2; ++k) {
    rest_[k].assign(s.ckpts.size() * s.attentions.size() * s.norms.size(), -1);
    params_[k].assign(s.zeros.size() * s.grads.size(), -1);
  }
}

int64_t MemoryBounds::of(const Member& x, int64_t past) {
  int64_t bound = 0;
  for (int k = 0; k < (s_.shape.pp > 1 ? 2 : 1); ++k) {  // at pp 1 one stage, the first and the last
    int64_t& rest = rest_[k][(x.c * s_.attentions.size() + x.a) * s_.norms.size() + x.n];
    if (rest < 0) rest = part(k, x, false);
    int64_t& params = params_[k][x.z * s_.grads.size() + x.g];
    if (params < 0) params = part(k, x, true);
    bound = std::max(bound, rest + params);
    if (bound > past) break;  // (the first end past it answers)
  }
  return bound;
}

// One term on the first (0) or last (1) stage: the state's bytes (params),
// or the rest less the data-parallel buffers.
int64_t MemoryBounds::part(int stage_end, const Member& x, bool params) {
  Layout& l = work_;  // the shape with this term's knobs (no copy: a Layout's split allocates)
  l.zero = s_.shape.zero;
  l.zero_group = s_.shape.zero_group;
  l.grad = s_.shape.grad;
  l.ckpt = s_.shape.ckpt;
  l.ckpt_layers = s_.shape.ckpt_layers;
  l.attention = s_.shape.attention;
  l.norm = s_.shape.norm;
  if (params) {
    s_.zeros[x.z].apply(l);
    l.grad = s_.grads[x.g];
  } else {
    l.ckpt = s_.ckpts[x.c].first;
    l.ckpt_layers = s_.ckpts[x.c].second;
    l.attention = s_.attentions[x.a];
    l.norm = s_.norms[x.n];
  }
  const memory::StagePlan plan = memory::stage_plan(ctx_.model, ctx_.run, l, stage_end == 0 ? 0 : l.pp - 1);
  if (params) return memory::stage_state_bytes(ctx_.model, ctx_.run, l, ctx_.cluster.device, plan);
  thread_local std::vector<memory::TensorShape> table;
  memory::stage_other_shapes(ctx_.model, ctx_.run, l, ctx_.cluster.device, plan, table);
  return rest_bytes(table);
}

}  // namespace weft::tuner
