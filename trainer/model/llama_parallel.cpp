// LlamaStage's communication: the gradient groups and their data-parallel
// reductions (ZeRO-2 buckets; ZeRO-0 all-reduces and ZeRO-1 reduce-scatters
// during the backward), the tensor-parallel row gathers and reductions of
// sequence parallelism, and the gradients of tied and replicated parameters.
#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

template <typename Elem>
typename LlamaStage<Elem>::A* LlamaStage<Elem>::grad_at(int64_t flat) {
  if (!zero2_) return grads_ + flat;
  // Only the group being back-propagated has gradients (elsewhere, e.g. the
  // forward's block views, there are none to point at).
  if (flat < group_begin_ || flat > group_end_ || group_end_ == 0) return nullptr;
  return bucket_ + (flat - group_begin_);
}

template <typename Elem>
void LlamaStage<Elem>::group_begin(int64_t begin, int64_t end) {
  group_begin_ = begin;
  group_end_ = end;
  if (!zero2_) return;
  WEFT_ASSERT(end - begin <= bucket_elements_);
  run(kernels::FillParams<A>{.n = end - begin, .value = 0.0, .x = bucket_}, "fill");
}

template <typename Elem>
std::vector<int64_t> LlamaStage<Elem>::group_shard_counts() const {
  std::vector<int64_t> counts;
  int64_t lo = 0;
  for (int64_t c : shard_counts_) {
    counts.push_back(std::max<int64_t>(0, std::min(group_end_, lo + c) - std::max(group_begin_, lo)));
    lo += c;
  }
  return counts;
}

template <typename Elem>
int64_t LlamaStage<Elem>::group_shard_offset() const {
  return std::clamp(group_begin_, shard_lo_, shard_hi_) - shard_lo_;
}

template <typename Elem>
void LlamaStage<Elem>::group_end() {
  if (zero2_) {
    // Each dp rank sums the part of the group inside its shard over dp, in
    // place in the bucket, and adds it to its accumulated shard.
    const std::vector<int64_t> counts = group_shard_counts();
    const int64_t rank = groups_.dp_rank(), mine = counts[size_t(rank)];
    A* own = bucket_ + std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
    groups_.dp->reduce_scatter_v(bucket_, own, std::span<const int64_t>(counts));
    if (mine > 0)
      run(kernels::AxpyParams<A>{.n = mine, .alpha = 1.0, .x = own, .y = grads_ + group_shard_offset()}, "axpy");
  } else if (final_ && overlap_dp_) {
    dp_pending_.push_back(groups_.dp->iall_reduce(grads_ + group_begin_, group_end_ - group_begin_));
  } else if (final_ && scatter_dp_) {
    // The group's gradient is complete: its sum over dp goes straight to the
    // shard, while the backward of the groups below goes on.
    dp_pending_.push_back(groups_.dp->ireduce_scatter_v(grads_ + group_begin_, dp_shard_ + group_shard_offset(),
                                                        std::span<const int64_t>(group_shard_counts())));
  }
  group_begin_ = group_end_ = 0;
}

template <typename Elem>
const Elem* LlamaStage<Elem>::gathered(const Elem* rows, Elem* all) {
  if (!l_.sp) return rows;
  groups_.tp->all_gather(rows, all, Msp_ * m_.hidden);
  return all;
}

template <typename Elem>
void LlamaStage<Elem>::reduce_rows(Elem* buf) {
  if (l_.sp)
    groups_.tp->reduce_scatter(buf, buf, Msp_ * m_.hidden);  // this rank's rows land first
  else
    groups_.tp->all_reduce(buf, M_ * m_.hidden);
}

template <typename Elem>
void LlamaStage<Elem>::sync_tied_grads() {
  if (!m_.tied_embeddings || l_.pp == 1) return;
  auto& pp = *groups_.pp;
  constexpr int64_t kTag = 1 << 20;
  if (plan_.has_head) {
    const auto& head = params_.specs[size_t(params_.index(ParamKind::lm_head))];
    pp.send(grad(head), head.local_elements(), 0, kTag);
    pp.recv(grad(head), head.local_elements(), 0, kTag + 1);
  } else if (plan_.has_embedding) {
    const auto& emb = params_.specs[size_t(params_.index(ParamKind::embed_tokens))];
    A* other = table_->get<A>("comm.tied_embedding_grad");
    pp.recv(other, emb.local_elements(), l_.pp - 1, kTag);
    run(kernels::AxpyParams<A>{.n = emb.local_elements(), .alpha = 1.0, .x = other, .y = grad(emb)}, "axpy");
    pp.send(grad(emb), emb.local_elements(), l_.pp - 1, kTag + 1);
  }
}

template <typename Elem>
void LlamaStage<Elem>::reduce_replicated_grads() {
  // Without sequence parallelism every tp rank sees all rows and computes the
  // same norm-weight gradients; with it, each saw its own rows.
  if (!l_.sp) return;
  for (const auto& p : params_.specs) {
    if (p.shard != ShardDim::none) continue;
    // Under ZeRO-2, and ZeRO-1 once the backward reduced the gradients, the
    // summed gradients are this rank's shard (equal ranges on every tp rank).
    A* shard = zero2_ ? grads_ : scatter_dp_ && reduced_ ? dp_shard_ : nullptr;
    if (!shard) {
      groups_.tp->all_reduce(grad(p), p.local_elements());
      continue;
    }
    const int64_t begin = std::max(shard_lo_, p.offset), end = std::min(shard_hi_, p.offset + p.local_elements());
    if (begin < end) groups_.tp->all_reduce(shard + (begin - shard_lo_), end - begin);
  }
}

template <typename Elem>
void LlamaStage<Elem>::finish_dp_reduction() {
  reduced_ = !dp_pending_.empty();
  for (auto& r : dp_pending_) r->wait();
  dp_pending_.clear();
}

// The members defined here, for each stage type llama.cpp instantiates.
#define WEFT_LLAMA_PARALLEL(E)                                                         \
  template LlamaStage<E>::A* LlamaStage<E>::grad_at(int64_t);                          \
  template void LlamaStage<E>::group_begin(int64_t, int64_t);                          \
  template void LlamaStage<E>::group_end();                                            \
  template std::vector<int64_t> LlamaStage<E>::group_shard_counts() const;             \
  template int64_t LlamaStage<E>::group_shard_offset() const;                          \
  template const E* LlamaStage<E>::gathered(const E*, E*);                             \
  template void LlamaStage<E>::reduce_rows(E*);                                        \
  template void LlamaStage<E>::sync_tied_grads();                                      \
  template void LlamaStage<E>::reduce_replicated_grads();                              \
  template void LlamaStage<E>::finish_dp_reduction();
WEFT_LLAMA_PARALLEL(float)
WEFT_LLAMA_PARALLEL(double)
WEFT_LLAMA_PARALLEL(kernels::bf16)
#undef WEFT_LLAMA_PARALLEL

}  // namespace weft::trainer
