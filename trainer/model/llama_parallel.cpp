// LlamaStage's communication: ZeRO-3's gathers of each group's weights, the
// gradient groups and their data-parallel
// reductions (ZeRO-2 buckets; ZeRO-0 all-reduces and ZeRO-1 reduce-scatters
// during the backward), the tensor-parallel row gathers and reductions of
// sequence parallelism, and the gradients of tied and replicated parameters.
#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "trainer/model/llama_run.h"
#include "trainer/optim/dense_split_comm.h"

namespace weft::trainer {

template <typename Elem, typename G>
G* LlamaStage<Elem, G>::grad_at(int64_t flat) {
  if (!zero2_) return grads_ + flat;
  // Only the group being back-propagated has gradients (elsewhere, e.g. the
  // forward's block views, there are none to point at).
  if (building_ < 0) return nullptr;
  int64_t at = 0;
  for (const Range& r : group_) {
    if (flat >= r.begin && flat <= r.end) return buckets_[size_t(building_)].data + at + (flat - r.begin);
    at += r.end - r.begin;
  }
  return nullptr;
}

template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::weight_at(int64_t flat) {
  if (!zero3_) return weights_ + flat;
  for (const Gathered& g : gathered_) {
    int64_t at = 0;
    for (const Range& r : g.ranges) {
      if (flat >= r.begin && flat < r.end) return g.data + at + (flat - r.begin);
      at += r.end - r.begin;
    }
  }
  return nullptr;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::gather(std::initializer_list<Range> ranges, bool next) {
  if (!zero3_) return;
  const std::vector<Range> want(ranges);
  auto settle = [](Gathered& g) {
    for (auto& p : g.pending) p->wait();
    g.pending.clear();
  };
  for (int i = 0; i < 2; ++i)
    if (gathered_[size_t(i)].ranges == want) {
      if (!next) {
        settle(gathered_[size_t(i)]);
        in_use_ = i;
      }
      return;
    }
  const int b = in_use_ == 0 ? 1 : 0;
  Gathered& g = gathered_[size_t(b)];
  settle(g);
  // Each range on its own: this rank's part of it is contiguous in its
  // shard (the parts of two ranges need not be), and the gathered range
  // lands after the ones before it. The communication waits for the compute
  // queued so far (the last use of this buffer among it).
  int64_t at = 0;
  for (const Range& r : want) {
    const std::vector<int64_t> counts = shard_parts({&r, 1});
    const int64_t begin = std::clamp(r.begin, shard_lo_, shard_hi_);
    WEFT_ASSERT(at + (r.end - r.begin) <= g.elements);
    g.pending.push_back(
        groups_.zero_shard().iall_gather_v(weights_ + (begin - shard_lo_), g.data + at,
                                           std::span<const int64_t>(counts)));
    at += r.end - r.begin;
  }
  g.ranges = want;
  if (!next) {
    settle(g);
    in_use_ = b;
  }
}

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::Range LlamaStage<Elem, G>::block_range(int64_t chunk, int64_t layer) const {
  const int64_t local = chunk_begin_[size_t(chunk)] + layer;
  if (params_.lora.enabled()) {  // the block's adapters, in a row
    const int64_t first = params_.adapter_first[size_t(local)], next = params_.adapter_first[size_t(local + 1)];
    WEFT_ASSERT(first < next);
    const ParamSpec& last = params_.specs[size_t(next - 1)];
    return {params_.specs[size_t(first)].offset, last.offset + last.local_elements()};
  }
  const auto& specs = params_.model_specs();
  const auto& first = specs[size_t(params_.block_first[size_t(local)])];
  const auto& last = specs[size_t(params_.block_first[size_t(local + 1)] - 1)];
  return {first.offset, last.offset + last.local_elements()};
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::gather_block(int64_t chunk, int64_t layer, bool next) {
  if (zero3_) gather({block_range(chunk, layer)}, next);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::gather_head() {
  if (!zero3_ || params_.lora.enabled()) return;  // LoRA: frozen, never sharded
  // The final norm and the head are the stage's last parameters; a head
  // tied to the embedding on this stage is the table at its start instead.
  const auto& fnorm = params_.model(ParamKind::final_norm);
  if (params_.head_is_embedding)
    gather({{0, params_.specs[0].local_elements()}, {fnorm.offset, params_.elements}});
  else
    gather({{fnorm.offset, params_.elements}});
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::group_begin(std::initializer_list<Range> ranges) {
  group_.assign(ranges);
  WEFT_ASSERT(zero2_ || group_.size() == 1);
  if (!zero2_) return;
  int64_t n = 0;
  for (const Range& r : group_) n += r.end - r.begin;
  // The bucket the last group did not use, unless only the other holds this one.
  int b = built_ == 0 ? 1 : 0;
  if (n > buckets_[size_t(b)].elements) b = 1 - b;
  Bucket& bucket = buckets_[size_t(b)];
  WEFT_ASSERT(n <= bucket.elements);
  drain(bucket);
  building_ = b;
  run(kernels::FillParams<G>{.n = n, .value = 0.0, .x = bucket.data}, "fill");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::drain(Bucket& b) {
  if (!b.pending) return;
  b.pending->wait();
  b.pending.reset();
  const G* x = b.own;
  for (const auto& [offset, n] : b.pieces) {
    run(kernels::AxpyParams<G>{.n = n, .alpha = 1.0, .x = x, .y = grads_ + offset}, "axpy");
    x += n;
  }
  // Hybrid sharding: the last micro-batch's sum is in; the shard groups add theirs.
  if (b.last)
    for (const auto& [offset, n] : b.pieces) reduce_over_replicas(grads_ + offset, shard_lo_ + offset, n);
  b.last = false;
}

template <typename Elem, typename G>
template <typename F>
void LlamaStage<Elem, G>::for_each_non_expert(int64_t flat, int64_t n, F f) const {
  memory::for_each_outside(expert_ranges_, flat, n, f);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::reduce_over_replicas(G* piece, int64_t flat, int64_t n) {
  if (!groups_.replica || n <= 0) return;
  if (split_) {
    reduce_scatter_dense(*groups_.replica, *split_, piece, flat, n, dp_pending_);
    return;
  }
  for_each_non_expert(flat, n, [&](int64_t offset, int64_t count) {
    dp_pending_.push_back(groups_.replica->iall_reduce(piece + offset, count));
  });
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::reduce_replicas(G* data, int64_t flat, int64_t n) {
  if (!groups_.replica || n <= 0) return;
  if (split_) {
    std::vector<std::unique_ptr<parallel::CommRequest>> pending;
    reduce_scatter_dense(*groups_.replica, *split_, data, flat, n, pending);
    for (auto& r : pending) r->wait();
    return;
  }
  for_each_non_expert(flat, n,
                      [&](int64_t offset, int64_t count) { groups_.replica->all_reduce(data + offset, count); });
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::settle_scatter() {
  if (!scatter_pending_) return;
  scatter_pending_->wait();
  scatter_pending_.reset();
  reduce_over_replicas(scatter_piece_, scatter_flat_, scatter_count_);
}

template <typename Elem, typename G>
std::vector<int64_t> LlamaStage<Elem, G>::shard_parts(std::span<const Range> ranges) const {
  // Shards and ranges both ascend, so each rank's part is contiguous in the
  // ranges' concatenation.
  std::vector<int64_t> counts;
  int64_t lo = 0;
  for (int64_t c : shard_counts_) {
    int64_t n = 0;
    for (const Range& r : ranges) n += std::max<int64_t>(0, std::min(r.end, lo + c) - std::max(r.begin, lo));
    counts.push_back(n);
    lo += c;
  }
  return counts;
}

template <typename Elem, typename G>
int64_t LlamaStage<Elem, G>::group_shard_offset() const {
  WEFT_ASSERT(group_.size() == 1);
  return std::clamp(group_[0].begin, shard_lo_, shard_hi_) - shard_lo_;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::group_end() {
  if (zero2_) {
    // Each dp rank sums the part of the group inside its shard over dp, in
    // place in the bucket, while the backward goes on; drain() adds it to
    // the accumulated shard.
    const std::vector<int64_t> counts = shard_parts(group_);
    Bucket& b = buckets_[size_t(building_)];
    b.own = b.data + std::accumulate(counts.begin(), counts.begin() + groups_.zero_shard().rank(), int64_t{0});
    b.pieces.clear();
    for (const Range& r : group_) {
      const int64_t begin = std::max(r.begin, shard_lo_), end = std::min(r.end, shard_hi_);
      if (begin < end) b.pieces.emplace_back(begin - shard_lo_, end - begin);
    }
    b.pending = groups_.zero_shard().ireduce_scatter_v(b.data, b.own, std::span<const int64_t>(counts));
    b.last = final_;
    built_ = building_;
    building_ = -1;
  } else if (final_ && overlap_dp_) {
    const Range& r = group_[0];
    dp_pending_.push_back(groups_.dpcp->iall_reduce(grads_ + r.begin, r.end - r.begin));
  } else if (final_ && scatter_dp_) {
    // The group's gradient is complete: its sum over dp goes straight to the
    // shard, while the backward of the groups below goes on.
    const std::vector<int64_t> counts = shard_parts(group_);
    auto scatter = groups_.zero_shard().ireduce_scatter_v(grads_ + group_[0].begin, dp_shard_ + group_shard_offset(),
                                                          std::span<const int64_t>(counts));
    if (!groups_.replica) {
      dp_pending_.push_back(std::move(scatter));
    } else {
      // Hybrid sharding: the group before's piece has landed by now (its
      // reduce-scatter ran beside this group's backward); its replicas'
      // all-reduce runs beside the next one's.
      settle_scatter();
      scatter_pending_ = std::move(scatter);
      scatter_piece_ = dp_shard_ + group_shard_offset();
      scatter_flat_ = shard_lo_ + group_shard_offset();
      scatter_count_ = counts[size_t(groups_.zero_shard().rank())];
    }
  }
  group_.clear();
}

template <typename Elem, typename G>
const Elem* LlamaStage<Elem, G>::gathered(const Elem* rows, Elem* all) {
  if (!l_.sp) return rows;
  groups_.tp->all_gather(rows, all, Msp_ * m_.hidden);
  return all;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::reduce_rows(Elem* buf) {
  if (l_.sp)
    groups_.tp->reduce_scatter(buf, buf, Msp_ * m_.hidden);  // this rank's rows land first
  else
    groups_.tp->all_reduce(buf, M_ * m_.hidden);
}

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::InputGather LlamaStage<Elem, G>::begin_input(const Elem* rows, Elem* all,
                                                                            const Fp8Kept& kept) {
  InputGather g;
  if (kept.codes) {
    g.kept = &kept;
    g.K = m_.hidden;  // the norms' outputs: q, k, v's and gate and up's input
    g.pending = fp8_restore_begin(kept, g.K);
    return g;
  }
  g.x = rows;
  if (l_.sp) {
    g.pending = groups_.tp_beside().iall_gather(rows, all, Msp_ * m_.hidden);
    g.x = all;
  }
  return g;
}

template <typename Elem, typename G>
const Elem* LlamaStage<Elem, G>::end_input(InputGather& g) {
  if (g.kept) {
    fp8_restore_end(*g.kept, g.K, g.pending.get());
    return nullptr;
  }
  if (g.pending) g.pending->wait();
  return g.x;
}

template <typename Elem, typename G>
std::unique_ptr<parallel::CommRequest> LlamaStage<Elem, G>::begin_reduce_rows(Elem* buf) {
  auto& tp = groups_.tp_beside();
  return l_.sp ? tp.ireduce_scatter(buf, buf, Msp_ * m_.hidden) : tp.iall_reduce(buf, M_ * m_.hidden);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::sync_tied_grads() {
  if (!m_.tied_embeddings || l_.pp == 1 || !(plan_.has_head || plan_.has_embedding) || params_.lora.enabled()) return;
  auto& pp = *groups_.pp;
  constexpr int64_t kTag = 1 << 20;
  const int64_t last = l_.pp - 1;
  // This stage's copy: the last stage's head, or the first's embedding table.
  const auto& p = params_.model(plan_.has_head ? ParamKind::lm_head : ParamKind::embed_tokens);
  const int64_t n = p.local_elements();
  G* shard = zero2_ ? grads_ : scatter_dp_ && reduced_ ? dp_shard_ : nullptr;
  if (!shard) {
    // Full gradients, equal or not yet reduced over dp: the last stage sends
    // its copy's, the first adds it to its own and sends the sum back.
    if (plan_.has_head) {
      pp.send(grad(p), n, 0, kTag);
      pp.recv(grad(p), n, 0, kTag + 1);
    } else {
      G* other = table_->get<G>("comm.tied_embedding_grad");
      pp.recv(other, n, last, kTag);
      run(kernels::AxpyParams<G>{.n = n, .alpha = 1.0, .x = other, .y = grad(p)}, "axpy");
      pp.send(grad(p), n, last, kTag + 1);
    }
    return;
  }
  // Reduced into shards, whose bounds differ between the two stages: each
  // gathers its copy's gradient over dp (the first after adding the last's
  // to its shard, so it gathers the sum) and keeps its shard of the sum.
  const Range copy_range{p.offset, p.offset + n};
  const std::vector<int64_t> counts = shard_parts({&copy_range, 1});
  const int64_t begin = std::clamp(p.offset, shard_lo_, shard_hi_);
  const int64_t mine = counts[size_t(groups_.zero_shard().rank())];
  G* part = shard + (begin - shard_lo_);  // this rank's part of the copy
  G* full = table_->get<G>("comm.tied_embedding_grad");
  // Under the dense split only this replica's part of the copy's gradient
  // is summed: the replicas complete it first.
  if (split_ && mine > 0 && plan_.has_head) all_gather_dense(*groups_.replica, *split_, part, begin, mine);
  if (plan_.has_head) {
    groups_.zero_shard().all_gather_v(part, full, std::span<const int64_t>(counts));
    pp.send(full, n, 0, kTag);
    pp.recv(full, n, 0, kTag + 1);
    copy(part, full + (begin - p.offset), mine * int64_t(sizeof(G)));
  } else {
    pp.recv(full, n, last, kTag);
    if (mine > 0)
      run(kernels::AxpyParams<G>{.n = mine, .alpha = 1.0, .x = full + (begin - p.offset), .y = part}, "axpy");
    if (split_ && mine > 0) all_gather_dense(*groups_.replica, *split_, part, begin, mine);
    groups_.zero_shard().all_gather_v(part, full, std::span<const int64_t>(counts));
    pp.send(full, n, last, kTag + 1);
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::reduce_replicated_grads() {
  // Without sequence parallelism every tp rank sees all rows and computes the
  // same norm-weight gradients; with it, each saw its own rows. LoRA's
  // adapters that are whole on every tp rank (A of a column-parallel layer,
  // B of a row-parallel one) saw only this rank's part of the layer's
  // outputs or inputs: theirs are partial sums, with or without sp. So are
  // Qwen3's q and k norms' (each rank normalises its own heads).
  const bool lora = params_.lora.enabled();
  if (!l_.sp && !(lora && l_.tp > 1) && !(params_.qk_norm && l_.tp > 1)) return;
  for (const auto& p : params_.specs) {
    if (p.shard != ShardDim::none) continue;
    // The routed experts' adapters are whole on every tp rank. At etp1, as
    // the experts: every tp rank computes the same rows' without sp, its
    // own with it. Under an expert tp degree each tp rank computes its part
    // of the experts' width over the same rows, so every adapter's gradient
    // is a partial sum (llama_moe_lora.cpp). Folded over tp (epfold) each
    // tp rank holds other experts (and their adapters), whose gradients
    // already hold every row routed to them.
    if (lora && p.expert >= 0 && !l_.sp && l_.etp == 1) continue;
    if (l_.ep_fold && p.expert >= 0) continue;
    const bool qk = p.kind == ParamKind::q_norm || p.kind == ParamKind::k_norm;
    if (!l_.sp && !(lora && l_.tp > 1) && !qk) continue;
    // Under ZeRO-2, and ZeRO-1 once the backward reduced the gradients, the
    // summed gradients are this rank's shard (equal ranges on every tp rank).
    G* shard = zero2_ ? grads_ : scatter_dp_ && reduced_ ? dp_shard_ : nullptr;
    if (!shard) {
      groups_.tp->all_reduce(grad(p), p.local_elements());
      continue;
    }
    const int64_t begin = std::max(shard_lo_, p.offset), end = std::min(shard_hi_, p.offset + p.local_elements());
    if (begin < end) groups_.tp->all_reduce(shard + (begin - shard_lo_), end - begin);
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::finish_dp_reduction() {
  if (zero2_ && built_ >= 0) {
    // Oldest first, so each shard element sums its micro-batches in order.
    drain(buckets_[size_t(1 - built_)]);
    drain(buckets_[size_t(built_)]);
    built_ = -1;
  }
  const bool any = scatter_pending_ || !dp_pending_.empty();
  settle_scatter();
  for (auto& r : dp_pending_) r->wait();
  dp_pending_.clear();
  reduced_ = any && !zero2_;
  replicas_reduced_ = groups_.replica && (zero2_ || reduced_);
}

// The members defined here, for each stage type llama.cpp instantiates.
#define WEFT_LLAMA_PARALLEL(E, G)                                                            \
  template G* LlamaStage<E, G>::grad_at(int64_t);                                            \
  template void LlamaStage<E, G>::group_begin(std::initializer_list<Range>);                 \
  template void LlamaStage<E, G>::group_end();                                               \
  template void LlamaStage<E, G>::drain(Bucket&);                                            \
  template void LlamaStage<E, G>::settle_scatter();                                          \
  template void LlamaStage<E, G>::reduce_over_replicas(G*, int64_t, int64_t);                \
  template void LlamaStage<E, G>::reduce_replicas(G*, int64_t, int64_t);                     \
  template std::vector<int64_t> LlamaStage<E, G>::shard_parts(std::span<const Range>) const; \
  template int64_t LlamaStage<E, G>::group_shard_offset() const;                             \
  template const E* LlamaStage<E, G>::gathered(const E*, E*);                                \
  template void LlamaStage<E, G>::reduce_rows(E*);                                           \
  template typename LlamaStage<E, G>::InputGather LlamaStage<E, G>::begin_input(const E*, E*, const Fp8Kept&); \
  template const E* LlamaStage<E, G>::end_input(InputGather&);                               \
  template std::unique_ptr<parallel::CommRequest> LlamaStage<E, G>::begin_reduce_rows(E*);   \
  template void LlamaStage<E, G>::sync_tied_grads();                                         \
  template void LlamaStage<E, G>::reduce_replicated_grads();                                 \
  template void LlamaStage<E, G>::finish_dp_reduction();                                     \
  template E* LlamaStage<E, G>::weight_at(int64_t);                                          \
  template void LlamaStage<E, G>::gather(std::initializer_list<Range>, bool);                \
  template typename LlamaStage<E, G>::Range LlamaStage<E, G>::block_range(int64_t, int64_t) const; \
  template void LlamaStage<E, G>::gather_block(int64_t, int64_t, bool);                      \
  template void LlamaStage<E, G>::gather_head();
WEFT_LLAMA_PARALLEL(float, float)
WEFT_LLAMA_PARALLEL(double, double)
WEFT_LLAMA_PARALLEL(kernels::bf16, float)
WEFT_LLAMA_PARALLEL(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_PARALLEL

}  // namespace weft::trainer
