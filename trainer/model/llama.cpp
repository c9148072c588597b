#include "trainer/model/llama.h"

#include <algorithm>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/attention/attention.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "memory/device.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using kernels::status_check;
using kernels::Write;
using memory::Fp8Gemm;

namespace {

// The saved activations of a block, in the shape table's names.
constexpr const char* kSavedNames[] = {
    "layer.attn_norm.input",       "layer.attn_norm.rstd", "layer.attn_norm.normed_fp32",
    "layer.attn_norm.output",      "layer.attn.q",         "layer.attn.k",
    "layer.attn.v",                "layer.attn.out",       "layer.attn.lse",
    "layer.attn.probs",            "layer.mlp_norm.input", "layer.mlp_norm.rstd",
    "layer.mlp_norm.normed_fp32",  "layer.mlp_norm.output", "layer.mlp.gate",
    "layer.mlp.up",                "layer.mlp.act",         "layer.attn_norm.output_fp8",
    "layer.mlp_norm.output_fp8",   "layer.mlp.act_fp8",     "layer.moe.stats",
    "layer.moe.scores",            "layer.moe.experts",     "layer.moe.weights",
    "layer.moe.routing",           "layer.moe.input",       "layer.moe.gate",
    "layer.moe.up",                "layer.moe.act",         "layer.moe.row_weights",
    "layer.moe.shared_gate",       "layer.moe.shared_up",   "layer.moe.shared_act",
    "layer.attn.q_raw",            "layer.attn.q_rstd",     "layer.attn.k_raw",
    "layer.attn.k_rstd"};

}  // namespace


template <typename Elem, typename G>
LlamaStage<Elem, G>::LlamaStage(const ModelSpec& m, const RunSpec& run, const Layout& l, int64_t stage,
                                const DeviceSpec& device, memory::Arena& arena,
                                parallel::ProcessGroups& groups, kernels::Stream stream)
    : m_(m), run_(run), l_(l), plan_(memory::stage_plan(m, run, l, stage)),
      params_(stage_params(m, l, plan_, groups.tp_rank(), groups.ep_rank())), groups_(groups), stream_(stream) {
  if (l.ep > 1 && (!groups.ep || groups.ep->size() != l.ep))
    throw InternalError(fmt::format("layout {} without an ep group of {} ranks", l.to_string(), l.ep));
  // The routed experts' ranges, which the replicas (the ep group) do not
  // sum: their weights', or under LoRA their adapters'.
  if (l.ep > 1 && params_.lora.enabled())
    for (int64_t i = 0; i < params_.layers; ++i) {
      const int64_t a = params_.expert_adapter_first[size_t(i)];
      if (a < 0) continue;
      const ParamSpec& last = params_.specs[size_t(a + params_.local_experts * params_.expert_adapters - 1)];
      expert_ranges_.push_back({params_.specs[size_t(a)].offset, last.offset + last.local_elements()});
    }
  else if (l.ep > 1)
    for (int64_t i = 0; i < params_.layers; ++i) {
      if (!params_.block_moe[size_t(i)]) continue;
      const ParamSpec& first = params_.model(ParamKind::expert_gate, i, params_.first_expert);
      const ParamSpec& last = params_.model(ParamKind::expert_down, i, params_.first_expert + params_.local_experts - 1);
      expert_ranges_.push_back({first.offset, last.offset + last.local_elements()});
    }
  if (std::is_same_v<Elem, kernels::bf16> != on_device() || on_device() != (device.kind == DeviceKind::gpu))
    throw InternalError(fmt::format("a {}-byte stage on a {} stream for device {}", sizeof(Elem),
                                    on_device() ? "CUDA" : "CPU", device.name));
  // The shape table sizes the gradients by the layout's grad knob (fp64
  // stages widen every fp32 tensor).
  if (int64_t(sizeof(G)) != (sizeof(Elem) == 8 ? 8 : l.grad_bytes()))
    throw InternalError(fmt::format("a stage with {}-byte gradients for layout {}", sizeof(G), l.to_string()));
  M_ = l.mb * l.local_seq(run);  // this rank's T / cp tokens of each sequence
  Msp_ = l.sp ? M_ / l.tp : M_;
  chunk_begin_.assign(1, 0);
  for (int64_t c = 0; c < l.vpp; ++c) chunk_begin_.push_back(chunk_begin_.back() + l.chunk_layers(m, stage, c));
  WEFT_ASSERT(chunk_begin_.back() == plan_.layers);
  table_ = std::make_unique<TensorTable>(memory::stage_shapes(m, run, l, device, plan_), arena,
                                         sizeof(Elem) == 8);
  weights_ = table_->get<Elem>("weights.flat");
  grads_ = table_->get<G>("grads.flat");
  if (table_->has("weights.frozen")) frozen_ = table_->get<Elem>("weights.frozen");
  fp8_shapes_ = memory::fp8_gemm_shapes(m, run, l);
  fp8_setup();
  // Tokens and targets of a few micro-batches in flight, M_ ids each.
  if (on_device())
    staging_ = std::make_unique<memory::HostStaging>(M_ * int64_t(sizeof(int32_t)), 8, stream_.backend);
  if (table_->has("loss.step_sum")) loss_device_ = table_->get<A>("loss.step_sum");
  // Gradients sum over dp x cp (groups_.dpcp; the dp group itself without
  // context parallelism), and ZeRO shards over it too, or under hybrid
  // sharding over the shard group (groups_.zero_shard()), whose shards the
  // optimizer then all-reduces over the replicas.
  const int64_t ways = l.zero_shards();
  zero2_ = ways > 1 && l.zero >= 2;
  zero3_ = ways > 1 && l.zero >= 3;
  // (Under expert parallelism the optimizer sums them in two steps, after the backward.)
  overlap_dp_ = ways > 1 && l.zero == 0 && l.ep == 1;
  // ZeRO-1 reduce-scatters each group as its final backward ends, in place:
  // this rank's shard of the sum replaces its own range of the flat
  // gradients, whose other ranges are spent (tied embeddings across stages
  // are summed on the shards afterwards).
  scatter_dp_ = ways > 1 && l.zero == 1;
  // The routed experts' flat positions by the memory model's rule, which
  // the stage's own must equal (the dense split's and the shards' cuts
  // depend on them).
  std::vector<memory::FlatRange> experts;
  memory::stage_expert_ranges(m, l, plan_, experts);
  WEFT_ASSERT(l.ep <= 1 || experts.size() == expert_ranges_.size());
  for (size_t i = 0; l.ep > 1 && i < experts.size(); ++i)
    WEFT_ASSERT(experts[i].begin == expert_ranges_[i].begin && experts[i].end == expert_ranges_[i].end);
  if (ways > 1 && l.zero >= 1) {
    // Rank r of the shard group owns the r-th cut of the flat parameters
    // (memory::zero_shard_counts: equal ones, or balanced for the dense
    // split under ZeRO-1); the optimizer uses the same.
    memory::zero_shard_counts(l, params_.elements, experts, shard_counts_);
    const int64_t me = groups.zero_shard().rank();
    WEFT_ASSERT(groups.zero_shard().size() == ways && int64_t(shard_counts_.size()) == ways);
    shard_lo_ = std::accumulate(shard_counts_.begin(), shard_counts_.begin() + me, int64_t{0});
    shard_hi_ = shard_lo_ + shard_counts_[size_t(me)];
  }
  if (zero2_) {
    for (size_t i = 0; const char* name : {"comm.dp_grad_bucket", "comm.dp_grad_bucket_next"}) {
      buckets_[i].data = table_->get<G>(name);
      buckets_[i++].elements = table_->elements(name);
    }
    WEFT_ASSERT(table_->elements("grads.flat") == (params_.elements + ways - 1) / ways);
  }
  if (scatter_dp_) dp_shard_ = grads_ + shard_lo_;
  if (memory::dense_split(l)) {
    // The ep replicas split the dense part of their shard (of the whole
    // stage where the shard group is one rank).
    WEFT_ASSERT(groups.replica && groups.replica->size() == l.zero_replicas());
    const bool shards = ways > 1;
    split_.emplace(shards ? shard_lo_ : 0, shards ? shard_hi_ : params_.elements, std::move(experts),
                   groups.replica->size(), groups.replica->rank());
  }
  if (zero3_) {
    WEFT_ASSERT(table_->elements("weights.flat") == (params_.elements + ways - 1) / ways);
    for (int i = 0; i < 2; ++i) {
      gathered_[size_t(i)].data = table_->get<Elem>("comm.dp_param_gather", i);
      gathered_[size_t(i)].elements = table_->elements("comm.dp_param_gather");
    }
  }

  // Which layers keep each saved tensor, and where: slot-major, then the
  // keeping layers in order; the rebuilt copy (if any) is the last instance.
  // A slot position keeps the lists of its FFN's kind (memory::SlotFfn).
  const memory::Fp8SavedInputs fp8_kept = memory::fp8_saved_inputs(m, run, l, plan_);
  std::vector<memory::SlotFfn> kinds;
  std::array<std::array<std::vector<memory::TensorShape>, 2>, 3> lists;  // [kind][checkpointed]
  for (int64_t i = 0; i < plan_.slot_layers; ++i) {
    kinds.push_back(memory::slot_ffn(m, l, stage, i));
    auto& kl = lists[size_t(kinds.back())];
    if (kl[0].empty()) {
      memory::block_saved_shapes(m, run, l, Checkpointing::none, fp8_kept, kl[0], kinds.back());
      memory::block_saved_shapes(m, run, l, l.ckpt, fp8_kept, kl[1], kinds.back());
    }
  }
  for (const char* name : kSavedNames) {
    if (!table_->has(name)) continue;
    auto keeps = [&](const std::vector<memory::TensorShape>& v) {
      return std::any_of(v.begin(), v.end(), [&](const auto& t) { return std::strcmp(t.name, name) == 0; });
    };
    SavedIndex idx;
    for (int64_t i = 0; i < plan_.slot_layers; ++i) {
      const auto& kl = lists[size_t(kinds[size_t(i)])];
      const bool saved = keeps(kl[mode(i) == Checkpointing::none ? 0 : 1]);
      idx.of_layer.push_back(saved ? idx.saving++ : -1);
      // A layer recomputing an FP8 input rebuilds it in the compute type, in
      // its scratch (memory::fp8_saved_name).
      idx.rebuilt = idx.rebuilt || (!saved && keeps(kl[0]) && !memory::fp8_saved_name(name));
    }
    WEFT_ASSERT(table_->count(name) == plan_.in_flight_chunks * idx.saving + (idx.rebuilt ? 1 : 0));
    saved_.emplace_back(name, std::move(idx));
  }
  slot_scale_.assign(size_t(plan_.in_flight_chunks), 0.0);
  if (table_->has("scratch.qk_ones"))
    this->run(kernels::FillParams<Elem>{.n = m.head_dim, .value = 1.0, .x = table_->get<Elem>("scratch.qk_ones")}, "fill");
  if (m.moe.enabled()) {
    const size_t n = size_t(moe_stats_count());
    moe_in_.assign(n * size_t(plan_.in_flight_chunks), 0.0);
    moe_totals_.assign(n * size_t(plan_.in_flight_chunks), 0.0);
    moe_out_.assign(n, 0.0);
    moe_totals_out_.assign(n, 0.0);
  }
  require_moe_layout(m, run, l, device);
}

template <typename Elem, typename G>
LlamaStage<Elem, G>::~LlamaStage() = default;

template <typename Elem, typename G>
Checkpointing LlamaStage<Elem, G>::mode(int64_t layer) const {
  // ckpt@K checkpoints the first K / vpp blocks of each chunk.
  return layer < plan_.slot_checkpointed ? l_.ckpt : Checkpointing::none;
}

template <typename Elem, typename G>
int64_t LlamaStage<Elem, G>::chunk_of(int64_t local) const {
  const auto it = std::upper_bound(chunk_begin_.begin(), chunk_begin_.end() - 1, local);
  return int64_t(it - chunk_begin_.begin()) - 1;
}

template <typename Elem, typename G>
int64_t LlamaStage<Elem, G>::instance(const char* name, int64_t slot, int64_t layer) const {
  for (const auto& [n, idx] : saved_) {
    if (n != name) continue;
    const int64_t i = idx.of_layer[size_t(layer)];
    if (i < 0) return idx.rebuilt ? plan_.in_flight_chunks * idx.saving : -1;
    return slot * idx.saving + i;
  }
  throw InternalError(fmt::format("no saved tensor '{}'", name));
}


template <typename Elem, typename G>
void LlamaStage<Elem, G>::upload(void* dst, const void* src, int64_t bytes) {
  if (!staging_) {
    copy(dst, src, bytes);
    return;
  }
  void* pinned = staging_->take();
  std::memcpy(pinned, src, size_t(bytes));
  copy(dst, pinned, bytes);
  staging_->queued(stream_);
}

namespace {

template <typename Elem>
Elem to_elem(double v) {
  if constexpr (std::is_same_v<Elem, kernels::bf16>)
    return kernels::float_to_bf16(float(v));
  else
    return Elem(v);
}

}  // namespace

template <typename Elem, typename G>
void LlamaStage<Elem, G>::init_weights(uint64_t seed, const std::function<void()>& progress, InitWhat what) {
  // Built on the host a parameter at a time, then copied (on the CPU, into
  // place). Each element's draw depends on its indices alone, so the rows
  // are spread over the OpenMP team without changing a value.
  // Under ZeRO-3 a rank keeps the part of each parameter in its shard.
  const int64_t lo = zero3_ ? shard_lo_ : 0, hi = zero3_ ? shard_hi_ : params_.elements;
  std::vector<Elem> host;
  for (const auto& p : params_.specs) {
    if (what == InitWhat::frozen) break;
    const int64_t begin = std::max(lo, p.offset), end = std::min(hi, p.offset + p.local_elements());
    if (begin < end) {
      host.resize(size_t(end - begin));
      const ParamInitDraw draw(p, seed);
      // Element i of the parameter is (r, c) = (i / local_cols, i % local_cols).
#pragma omp parallel for schedule(static) if (end - begin >= (int64_t{1} << 16))
      for (int64_t i = begin - p.offset; i < end - p.offset; ++i) {
        const int64_t r = i / p.local_cols, c = i % p.local_cols;
        host[size_t(i - (begin - p.offset))] = to_elem<Elem>(draw(p.row_begin + r, p.col_begin + c));
      }
      copy(weights_ + (begin - lo), host.data(), (end - begin) * int64_t(sizeof(Elem)));
      memory::synchronize(stream_);  // before the host buffer is rewritten
    }
    if (progress) progress();
  }
  // LoRA's frozen base model, whole on every dp rank.
  for (const auto& p : params_.frozen) {
    if (what == InitWhat::trainable) break;
    host.resize(size_t(p.local_elements()));
    const ParamInitDraw draw(p, seed);
#pragma omp parallel for schedule(static) if (p.local_elements() >= (int64_t{1} << 16))
    for (int64_t i = 0; i < p.local_elements(); ++i)
      host[size_t(i)] = to_elem<Elem>(draw(p.row_begin + i / p.local_cols, p.col_begin + i % p.local_cols));
    copy(frozen_ + p.offset, host.data(), p.local_elements() * int64_t(sizeof(Elem)));
    memory::synchronize(stream_);
    if (progress) progress();
  }
  weights_updated();
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::set_frozen_weights(const std::vector<A>& full) {
  WEFT_ASSERT(int64_t(full.size()) == params_.frozen_elements);
  if (full.empty()) return;
  if constexpr (std::is_same_v<Elem, A>) {
    copy(frozen_, full.data(), params_.frozen_elements * int64_t(sizeof(Elem)));
  } else {
    std::vector<Elem> rounded(full.size());
    for (size_t i = 0; i < full.size(); ++i) rounded[i] = to_elem<Elem>(full[i]);
    copy(frozen_, rounded.data(), params_.frozen_elements * int64_t(sizeof(Elem)));
  }
  memory::synchronize(stream_);
  weights_updated();
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::set_weights(const std::vector<A>& full) {
  WEFT_ASSERT(int64_t(full.size()) == params_.elements);
  // Under ZeRO-3 this rank's shard of them.
  const int64_t lo = zero3_ ? shard_lo_ : 0, n = zero3_ ? shard_hi_ - shard_lo_ : params_.elements;
  if constexpr (std::is_same_v<Elem, A>) {
    copy(weights_, full.data() + lo, n * int64_t(sizeof(Elem)));
  } else {
    std::vector<Elem> rounded(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rounded[size_t(i)] = to_elem<Elem>(full[size_t(lo + i)]);
    copy(weights_, rounded.data(), n * int64_t(sizeof(Elem)));
  }
  memory::synchronize(stream_);
  weights_updated();
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::weights_updated() {
  for (auto& g : gathered_) {
    for (auto& p : g.pending) p->wait();
    g.pending.clear();
    g.ranges.clear();
  }
  in_use_ = -1;
  std::fill(fp8_weight_ready_.begin(), fp8_weight_ready_.end(), 0);  // quantised from the old weights
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::zero_grads() {
  reduced_ = replicas_reduced_ = false;
  run(kernels::FillParams<G>{.n = table_->elements("grads.flat"), .value = 0.0, .x = grads_}, "fill");
}

template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::stage_input(int64_t slot, int64_t chunk) {
  if (chunk_layers(chunk) == 0) {
    if (plan_.has_head && chunk == l_.vpp - 1) return table_->get<Elem>("final_norm.input");
    throw InternalError(fmt::format("chunk {} of stage {} has no block to take an input", chunk, plan_.stage));
  }
  return table_->get<Elem>("layer.attn_norm.input", instance("layer.attn_norm.input", slot, 0));
}
template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::stage_output() {
  return table_->get<Elem>("comm.pp_p2p", 0);
}
template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::output_grad() {
  return table_->has("comm.pp_p2p") ? table_->get<Elem>("comm.pp_p2p", 1) : nullptr;
}
template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::input_grad() {
  return table_->get<Elem>("scratch.d_residual");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::forward(int64_t slot, const int32_t* tokens, const int32_t* targets,
                                  double grad_scale, int64_t chunk) {
  const int64_t C = m_.hidden;
  const bool embeds = plan_.has_embedding && chunk == 0;
  const bool heads = plan_.has_head && chunk == l_.vpp - 1;
  const int64_t Lc = chunk_layers(chunk);
  if (embeds) {
    // A first virtual stage without blocks sends the embedding on.
    Elem* x0 = Lc > 0 || heads ? stage_input(slot, chunk) : stage_output();
    if (!params_.lora.enabled()) gather({{0, params_.specs[0].local_elements()}});
    int32_t* tok = table_->get<int32_t>("embedding.tokens", slot);
    upload(tok, tokens, M_ * int64_t(sizeof(int32_t)));
    const auto& emb = params_.model(ParamKind::embed_tokens);
    const int64_t Vl = m_.padded_vocab(l_.tp) / l_.tp;
    run(kernels::EmbeddingForwardParams<Elem>{.rows = M_, .C = C, .V = m_.vocab,
                                              .vocab_start = groups_.tp_rank() * Vl, .V_local = Vl,
                                              .tokens = tok, .table = weight(emb),
                                              .out = l_.sp ? table_->get<Elem>("scratch.linear_out") : x0,
                                              .ids_checked = on_device()},
        "embedding_forward");
    // The vocab-parallel lookup sums over tp (scattered to this rank's rows
    // under sequence parallelism).
    if (l_.sp) {
      Elem* lin = table_->get<Elem>("scratch.linear_out");
      reduce_rows(lin);
      copy(x0, lin, Msp_ * C * int64_t(sizeof(Elem)));
    } else {
      reduce_rows(x0);
    }
  }
  for (int64_t i = 0; i < Lc; ++i) {
    gather_block(chunk, i);
    if (i + 1 < Lc) gather_block(chunk, i + 1, true);
    Elem* x_out = i + 1 < Lc ? block(slot, chunk, i + 1).x_in
                  : heads     ? table_->get<Elem>("final_norm.input")
                              : stage_output();
    block_forward(block(slot, chunk, i), x_out, false);
  }
  slot_scale_[size_t(slot)] = grad_scale;
  if (m_.moe.enabled()) moe_forward_end(slot, chunk, grad_scale);
  if (heads) {
    gather_head();
    head_forward(slot, targets, grad_scale);
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::backward(int64_t slot, int64_t chunk, bool final) {
  const int64_t C = m_.hidden;
  final_ = final;
  Elem* dx = table_->get<Elem>("scratch.d_residual");
  const int64_t Lc = chunk_layers(chunk);
  if (plan_.has_head && chunk == l_.vpp - 1) {
    gather_head();
    if (Lc > 0) gather_block(chunk, Lc - 1, true);
    head_backward(dx);
  } else {
    copy(dx, output_grad(), Msp_ * C * int64_t(sizeof(Elem)));
  }
  for (int64_t i = Lc - 1; i >= 0; --i) {
    group_begin({block_range(chunk, i)});
    gather_block(chunk, i);
    if (i > 0) gather_block(chunk, i - 1, true);
    const Block b = block(slot, chunk, i);
    block_recompute(b);
    block_backward(b, dx);
    group_end();
  }
  // The micro-batch's balancing-loss totals go back with its gradient.
  if (moe_stats_travel()) std::copy_n(moe_totals(slot), moe_stats_count(), moe_totals_out());
  // A frozen embedding (LoRA) has no gradient to compute.
  if (plan_.has_embedding && chunk == 0 && !params_.lora.enabled()) {
    group_begin({{0, params_.specs[0].local_elements()}});
    const auto& emb = params_.model(ParamKind::embed_tokens);
    const int64_t Vl = m_.padded_vocab(l_.tp) / l_.tp;
    // The vocab-parallel lookup's all-reduce is conjugate to the identity here.
    run(kernels::EmbeddingBackwardParams<Elem, G>{.rows = M_, .C = C, .V = m_.vocab,
                                                  .vocab_start = groups_.tp_rank() * Vl,
                                                  .V_local = Vl,
                                                  .tokens = table_->get<int32_t>("embedding.tokens", slot),
                                                  .dout = gathered(dx, table_->get<Elem>("scratch.linear_out")),
                                                  .dtable = grad(emb), .ids_checked = on_device()},
        "embedding_backward");
    group_end();
  }
}

template class LlamaStage<float>;
template class LlamaStage<double>;
template class LlamaStage<kernels::bf16>;
template class LlamaStage<kernels::bf16, kernels::bf16>;

}  // namespace weft::trainer
