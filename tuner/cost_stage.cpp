// The stage pieces of the cost model (tuner/cost_parts.h): the blocks a
// stage holds, priced once per shape's kernel knobs (BlockCostCache), and
// the first and last stage's time with the embedding and the head.
#include "tuner/cost_parts.h"

#include <algorithm>
#include <array>
#include <memory>
#include <unordered_map>

namespace weft::tuner {

// The knobs of the layout block_cost() reads, with the Model's FP8 flag:
// two layouts equal in these price a block alike (on one model, run,
// cluster and constants). A knob block_cost starts to read joins the key;
// SpaceSearch.BlockCostCacheChangesNoBound fails until it does.
using BlockKey = std::array<int64_t, 14>;
struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int64_t v : key) h = (h ^ uint64_t(v)) * 0x100000001b3ULL;
    return size_t(h ^ (h >> 29));
  }
};

struct BlockCostCache::Impl {
  const ModelSpec* m = nullptr;
  const RunSpec* run = nullptr;
  const ClusterSpec* c = nullptr;
  const CostConstants* k = nullptr;
  std::unordered_map<BlockKey, cost_parts::Part, BlockKeyHash> parts;
  std::unordered_map<BlockKey, cost_parts::EdgeCosts, BlockKeyHash> edges;
};

BlockCostCache::BlockCostCache() : impl_(std::make_unique<Impl>()) {}
BlockCostCache::~BlockCostCache() = default;
BlockCostCache::BlockCostCache(BlockCostCache&&) noexcept = default;
BlockCostCache& BlockCostCache::operator=(BlockCostCache&&) noexcept = default;

}  // namespace weft::tuner

namespace weft::tuner::cost_parts {
namespace {

// Every knob a block's cost reads: an MoE block's the expert grid's too
// (its all-to-alls, local experts and their width), and where FP8 in MoE
// blocks is emulated, dp (the scale tables it reduces over dp x cp).
BlockKey block_key(const Model& x) {
  const Layout& l = x.l;
  const bool emulated_moe_fp8 = x.fp8 && x.m.moe.enabled() && !x.c.device.has_fp8();
  return {l.tp,           l.cp,           int64_t(l.cp_comm), l.mb, int64_t(l.sp),       int64_t(l.attention),
          int64_t(l.norm), int64_t(l.fp8), int64_t(x.fp8),     l.ep, l.etp,               int64_t(l.dispatch),
          int64_t(l.ep_fold), emulated_moe_fp8 ? l.dp : 0};
}

// The cache for x's model, run, cluster and constants (emptied when they
// change).
BlockCostCache::Impl& cache_for(const Model& x, BlockCostCache* cache) {
  BlockCostCache::Impl& c = cache->impl();
  if (c.m != &x.m || c.run != &x.run || c.c != &x.c || c.k != &x.k) {
    c.parts.clear();
    c.edges.clear();
    c.m = &x.m;
    c.run = &x.run;
    c.c = &x.c;
    c.k = &x.k;
  }
  return c;
}

Part cached_block_cost(const Model& x, BlockCostCache* cache) {
  if (!cache) return block_cost(x);
  BlockCostCache::Impl& c = cache_for(x, cache);
  const BlockKey key = block_key(x);
  if (auto it = c.parts.find(key); it != c.parts.end()) return it->second;
  return c.parts.emplace(key, block_cost(x)).first->second;
}

}  // namespace

Blocks stage_blocks(const Model& x) { return stage_blocks(x, nullptr); }

Blocks stage_blocks(const Model& x, BlockCostCache* cache) {
  Model plain = x;
  plain.fp8 = false;
  const Part p16 = cached_block_cost(plain, cache);
  if (x.l.fp8 == Fp8Recipe::off) return {p16, p16, p16};
  Model f8 = x;
  f8.fp8 = true;
  const Part p8 = cached_block_cost(f8, cache);
  const auto share = [&](int64_t stage) {
    return double(fp8_stage_blocks(x.m, x.l, stage)) / double(std::max<int64_t>(1, x.l.stage_layers(x.m, stage)));
  };
  const int64_t mid = middle_stage(x.m, x.l);
  return {mix(p8, p16, share(0)), mix(p8, p16, share(x.l.pp - 1)), mix(p8, p16, share(mid))};
}

Blocks with_recompute(const Blocks& b, Checkpointing mode) {
  return {with_recompute(b.first, mode), with_recompute(b.last, mode), with_recompute(b.mid, mode)};
}

StageLayers stage_layers_of(const ModelSpec& m, const Layout& l, int64_t stage) {
  return {l.stage_layers(m, stage), l.checkpointed_layers(m, stage)};
}

int64_t middle_stage(const ModelSpec& m, const Layout& l) {
  if (!l.uneven() || l.pp < 3) return 0;
  if (l.edge_split()) return 1;
  int64_t best = 1;
  for (int64_t s = 2; s < l.pp - 1; ++s)
    if (l.stage_layers(m, s) > l.stage_layers(m, best)) best = s;
  return best;
}

StageCost middle_cost(const Part& keep, const Part& ckpt, StageLayers n) {
  StageCost s;
  s.fwd = double(n.layers) * keep.fwd;
  s.bwd = double(n.layers) * keep.bwd;
  s.tp = double(n.layers) * keep.tp + double(n.n_ckpt) * ckpt.recompute_tp;
  s.cp = double(n.layers) * keep.cp + double(n.n_ckpt) * ckpt.recompute_cp;
  s.recompute = double(n.n_ckpt) * ckpt.recompute;
  return s;
}

// The first and last stage's time per micro-batch: each stage's blocks, of
// which `n_ckpt` recompute as `ckpt` says; the first adds the vocab-parallel
// embedding (gather, then a sum over tp), the last the final norm, LM head
// and the fused vocab-parallel loss, whose max, sum-exp and target logit are
// reduced over tp. One stage (pp 1) holds both.
EdgeCosts edge_costs(const Model& x) {
  const Layout& l = x.l;
  const double t = double(l.tp), M = double(l.mb * x.run.seq) / double(l.cp), C = double(x.m.hidden);
  const double Vl = double(x.m.padded_vocab(l.tp)) / t, Msp = l.sp ? M / t : M;
  const double act = M * C * x.a;
  const Group tg = x.tp_group();
  EdgeCosts e;
  e.embedding_fwd = x.stream("embedding_fwd", M, C);
  if (!x.run.lora.enabled()) e.embedding_bwd = x.stream("embedding_bwd", M, C);  // a frozen table has no gradient
  e.embedding_tp = l.sp ? reduce_scatter(act, tg) + all_gather(act, tg) : all_reduce(act, tg);
  e.head_fwd = x.norm_fwd(Msp) + x.linear_fwd(M, Vl, C) + x.stream("cross_entropy", M, Vl);
  // A frozen head (LoRA) computes its input gradient alone.
  e.head_bwd = x.norm_bwd(Msp) + (x.run.lora.enabled() ? x.gemm(M, C, Vl) : x.linear_bwd(M, Vl, C));
  e.head_tp = 3 * all_reduce(4 * M, tg) + (l.sp ? 2 * all_gather(act, tg) + reduce_scatter(act, tg) : all_reduce(act, tg));
  return e;
}

EdgeCosts edge_costs(const Model& x, BlockCostCache* cache) {
  if (!cache) return edge_costs(x);
  BlockCostCache::Impl& c = cache_for(x, cache);
  // Every knob edge_costs reads (SpaceSearch.BlockCostCacheChangesNoBound
  // fails where one is missing).
  const Layout& l = x.l;
  const BlockKey key = {l.tp, l.cp, l.mb, int64_t(l.sp), int64_t(l.norm), 0, 0, 0, 0, 0, 0, 0, 0, 0};
  if (auto it = c.edges.find(key); it != c.edges.end()) return it->second;
  return c.edges.emplace(key, edge_costs(x)).first->second;
}

std::pair<StageCost, StageCost> stage_costs(const Model& x, const Blocks& keeps, const Blocks& ckpts,
                                            StageLayers first_n, StageLayers last_n) {
  return stage_costs(x, edge_costs(x), keeps, ckpts, first_n, last_n);
}

std::pair<StageCost, StageCost> stage_costs(const Model& x, const EdgeCosts& e, const Blocks& keeps,
                                            const Blocks& ckpts, StageLayers first_n, StageLayers last_n) {
  StageCost first = middle_cost(keeps.first, ckpts.first, first_n),
            last = middle_cost(keeps.last, ckpts.last, last_n);
  first.fwd += e.embedding_fwd;
  first.bwd += e.embedding_bwd;
  first.tp += e.embedding_tp;
  last.fwd += e.head_fwd;
  last.bwd += e.head_bwd;
  last.tp += e.head_tp;
  if (x.l.pp == 1) {
    // One stage: its blocks are the first's (the same as the last's).
    const StageCost blocks = middle_cost(keeps.first, ckpts.first, first_n);
    first.fwd += last.fwd - blocks.fwd;
    first.bwd += last.bwd - blocks.bwd;
    first.tp += last.tp - blocks.tp;
    last = first;
  }
  return {first, last};
}

}  // namespace weft::tuner::cost_parts
