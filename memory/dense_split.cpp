#include "memory/dense_split.h"

#include <algorithm>

#include "core/error.h"

namespace weft::memory {

bool dense_split(const Layout& l) { return l.ep > 1 && l.zero >= 1 && l.zero_group == 0 && l.zero_replicas() > 1; }

namespace {

// One MoE block's flat elements before its routed experts (or their
// adapters), theirs, and after them.
struct MoeBlockRuns {
  int64_t before = 0, experts = 0, after = 0;
};

MoeBlockRuns moe_block_runs(const ModelSpec& m, const Layout& l, const LoraSpec& lora) {
  const MoeSpec& e = m.moe;
  const int64_t C = m.hidden, local = e.experts / std::max<int64_t>(1, l.ep);
  MoeBlockRuns b;
  if (!lora.enabled()) {
    // Norms and attention, the router; the experts; the shared expert.
    b.experts = 3 * local * (e.expert_intermediate / std::max<int64_t>(1, l.etp)) * C;
    b.after = 3 * (e.shared_intermediate / l.tp) * C;
    b.before = moe_block_param_elements(m, l) - b.experts - b.after;
    return b;
  }
  // The attention's adapters; the experts'; the shared expert's.
  const int64_t r = lora.rank;
  for (int g = 0; g < int(Linear::gate); ++g)
    if (lora.targets_linear(Linear(g))) {
      const LinearShape s = linear_shape(m, l, Linear(g));
      b.before += r * (s.K + s.N);
    }
  if (lora.targets_linear(Linear::gate)) b.experts += local * lora.experts_gate_up_rank() * (C + 2 * e.expert_intermediate);
  if (lora.targets_linear(Linear::down)) b.experts += local * r * (e.expert_intermediate + C);
  b.after = lora_block_elements(m, l, lora, true) - b.before - b.experts;
  return b;
}

}  // namespace

int64_t moe_block_expert_elements(const ModelSpec& m, const Layout& l, const LoraSpec& lora) {
  return m.moe.enabled() ? moe_block_runs(m, l, lora).experts : 0;
}

void stage_expert_ranges(const ModelSpec& m, const Layout& l, const StagePlan& plan, std::vector<FlatRange>& out) {
  out.clear();
  if (l.ep <= 1 || !m.moe.enabled()) return;
  const bool lora = plan.lora.enabled();
  int64_t at = 0;
  if (plan.has_embedding && !lora) at += (m.padded_vocab(l.tp) / l.tp) * m.hidden;
  const int64_t dense_block = lora ? lora_block_elements(m, l, plan.lora, false) : dense_block_param_elements(m, l);
  const MoeBlockRuns moe = moe_block_runs(m, l, plan.lora);
  // The stage's blocks in order: chunk 0's, then chunk 1's, ...
  for (int64_t c = 0; c < l.vpp; ++c)
    for (int64_t i = 0, n = l.chunk_layers(m, plan.stage, c); i < n; ++i) {
      if (!m.moe_layer(global_layer(m, l, plan.stage, c, i))) {
        at += dense_block;
        continue;
      }
      at += moe.before;
      if (moe.experts > 0) out.push_back({at, at + moe.experts});
      at += moe.experts + moe.after;
    }
}

DenseSplit::DenseSplit(int64_t lo, int64_t hi, std::vector<FlatRange> experts, int64_t replicas, int64_t replica)
    : lo_(lo), hi_(hi), replicas_(replicas), replica_(replica) {
  WEFT_ASSERT(lo <= hi && replicas >= 1 && replica >= 0 && replica < replicas);
  for (const FlatRange& r : experts) {
    const int64_t b = std::max(r.begin, lo), e = std::min(r.end, hi);
    if (b < e) experts_.push_back({b, e});
  }
  int64_t expert = 0;
  for (const FlatRange& r : experts_) expert += r.end - r.begin;
  dense_ = hi - lo - expert;
  part_ = (dense_ + replicas - 1) / replicas;
  // This replica's dense interval, and the shard's experts, in flat order.
  const int64_t first = std::min(dense_, replica * part_), last = std::min(dense_, first + part_);
  int64_t seen = 0;  // dense elements before the current run
  auto add = [&](int64_t b, int64_t e) {
    if (b >= e) return;
    if (!owned_.empty() && owned_.back().end == b)
      owned_.back().end = e;
    else
      owned_.push_back({b, e});
    owned_elements_ += e - b;
  };
  int64_t at = lo;
  auto dense_run = [&](int64_t b, int64_t e) {
    const int64_t from = std::max(first, seen), to = std::min(last, seen + (e - b));
    if (from < to) add(b + (from - seen), b + (to - seen));
    seen += e - b;
  };
  for (const FlatRange& r : experts_) {
    dense_run(at, r.begin);
    add(r.begin, r.end);
    at = r.end;
  }
  dense_run(at, hi);
}

int64_t DenseSplit::dense_before(int64_t x) const {
  WEFT_ASSERT(x >= lo_ && x <= hi_);
  int64_t expert = 0;
  for (const FlatRange& r : experts_) {
    if (r.begin >= x) break;
    expert += std::min(r.end, x) - r.begin;
  }
  return x - lo_ - expert;
}

void DenseSplit::run_counts(int64_t flat, int64_t n, std::vector<int64_t>& counts, int64_t& mine_at) const {
  const int64_t d = dense_before(flat);
  counts.assign(size_t(replicas_), 0);
  mine_at = 0;
  for (int64_t r = 0; r < replicas_; ++r) {
    const int64_t first = std::min(dense_, r * part_), last = std::min(dense_, first + part_);
    counts[size_t(r)] = std::max<int64_t>(0, std::min(last, d + n) - std::max(first, d));
    if (r < replica_) mine_at += counts[size_t(r)];
  }
}

void zero_shard_counts(const Layout& l, int64_t psi, std::span<const FlatRange> experts, std::vector<int64_t>& counts) {
  const int64_t ways = std::max<int64_t>(1, l.zero_shards());
  counts.clear();
  if (!(dense_split(l) && l.zero == 1)) {
    const int64_t shard = (psi + ways - 1) / ways;
    for (int64_t r = 0; r < ways; ++r) counts.push_back(std::max<int64_t>(0, std::min(psi, (r + 1) * shard) - r * shard));
    return;
  }
  // Cut s ends where the weight before it first reaches s x target.
  const int64_t R = l.zero_replicas();
  int64_t expert = 0;
  for (const FlatRange& r : experts) expert += r.end - r.begin;
  const int64_t total = (psi - expert) + R * expert, target = (total + ways - 1) / ways;
  int64_t at = 0, weight = 0, begin = 0;  // position, weight before it, this shard's start
  size_t next = 0;                         // the expert range at or after `at`
  for (int64_t s = 1; s < ways; ++s) {
    const int64_t need = s * target;
    while (weight < need && at < psi) {
      const bool in_expert = next < experts.size() && experts[next].begin <= at;
      const int64_t run_end = in_expert ? experts[next].end : next < experts.size() ? experts[next].begin : psi;
      const int64_t per = in_expert ? R : 1;
      const int64_t take = std::min(run_end - at, (need - weight + per - 1) / per);
      at += take;
      weight += take * per;
      if (in_expert && at == experts[next].end) ++next;
    }
    counts.push_back(at - begin);
    begin = at;
  }
  counts.push_back(psi - begin);
}

int64_t dense_split_state_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan, int64_t psi) {
  thread_local std::vector<FlatRange> experts;
  thread_local std::vector<int64_t> counts;
  stage_expert_ranges(m, l, plan, experts);
  zero_shard_counts(l, psi, experts, counts);
  const int64_t ways = l.zero_shards(), replicas = l.zero_replicas();
  int64_t most = 0, hi = 0;
  size_t next = 0;  // the first expert range not wholly before the shard
  for (int64_t s = 0; s < ways; ++s) {
    const int64_t lo = hi;
    hi = lo + counts[size_t(s)];
    while (next < experts.size() && experts[next].end <= lo) ++next;
    int64_t expert = 0;
    for (size_t i = next; i < experts.size() && experts[i].begin < hi; ++i)
      expert += std::min(experts[i].end, hi) - std::max(experts[i].begin, lo);
    const int64_t dense = hi - lo - expert;
    most = std::max(most, expert + (dense + replicas - 1) / replicas);
  }
  return most;
}

}  // namespace weft::memory
