#include "trainer/model/llama.h"

#include <algorithm>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <cstring>
#include <tuple>
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
    "layer.moe.up",                "layer.moe.act",         "layer.moe.output",
    "layer.moe.shared_gate",       "layer.moe.shared_up",   "layer.moe.shared_act",
    "layer.attn.q_raw",            "layer.attn.q_rstd",     "layer.attn.k_raw",
    "layer.attn.k_rstd"};

}  // namespace


template <typename Elem, typename G>
LlamaStage<Elem, G>::LlamaStage(const ModelSpec& m, const RunSpec& run, const Layout& l, int64_t stage,
                                const DeviceSpec& device, memory::Arena& arena,
                                parallel::ProcessGroups& groups, kernels::Stream stream)
    : m_(m), run_(run), l_(l), plan_(memory::stage_plan(m, run, l, stage)),
      params_(stage_params(m, l, plan_, groups.tp_rank())), groups_(groups), stream_(stream) {
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
  overlap_dp_ = ways > 1 && l.zero == 0;
  // ZeRO-1 reduce-scatters each group as its final backward ends, in place:
  // this rank's shard of the sum replaces its own range of the flat
  // gradients, whose other ranges are spent (tied embeddings across stages
  // are summed on the shards afterwards).
  scatter_dp_ = ways > 1 && l.zero == 1;
  if (ways > 1 && l.zero >= 1) {
    // Rank r of the shard group owns elements [r * shard, (r + 1) * shard) of
    // the flat parameters (the last one fewer); the optimizer uses the same.
    const int64_t psi = params_.elements, shard = (psi + ways - 1) / ways;
    for (int64_t r = 0; r < ways; ++r)
      shard_counts_.push_back(std::max<int64_t>(0, std::min(psi, (r + 1) * shard) - r * shard));
    const int64_t me = groups.zero_shard().rank();
    WEFT_ASSERT(groups.zero_shard().size() == ways);
    shard_lo_ = std::min(psi, me * shard);
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
typename LlamaStage<Elem, G>::Block LlamaStage<Elem, G>::block(int64_t slot, int64_t chunk, int64_t layer) {
  Block b{};
  b.slot = slot;
  b.layer = layer;
  b.mode = mode(layer);
  const int64_t local = chunk_begin_[size_t(chunk)] + layer;  // the stage's block index
  b.index = local;
  b.fp8 = l_.fp8_layer(m_, memory::global_layer(m_, l_, plan_.stage, chunk, layer));
  auto w = [&](ParamKind k) { return weight(params_.model(k, local)); };
  auto g = [&](ParamKind k) { return grad(params_.model(k, local)); };
  for (int i = 0; i < kLinears; ++i)
    if (const int64_t a = params_.adapter(local, Linear(i)); a >= 0) {
      b.lora_a[size_t(i)] = weight(params_.specs[size_t(a)]);
      b.lora_b[size_t(i)] = weight(params_.specs[size_t(a + 1)]);
      b.lora_ga[size_t(i)] = grad(params_.specs[size_t(a)]);
      b.lora_gb[size_t(i)] = grad(params_.specs[size_t(a + 1)]);
    }
  b.w_attn_norm = w(ParamKind::input_layernorm);
  b.wq = w(ParamKind::q_proj);
  b.wk = w(ParamKind::k_proj);
  b.wv = w(ParamKind::v_proj);
  b.wo = w(ParamKind::o_proj);
  b.w_mlp_norm = w(ParamKind::post_attention_layernorm);
  if (params_.qk_norm) {
    b.w_q_norm = w(ParamKind::q_norm);
    b.w_k_norm = w(ParamKind::k_norm);
    b.g_q_norm = g(ParamKind::q_norm);
    b.g_k_norm = g(ParamKind::k_norm);
  }
  b.g_attn_norm = g(ParamKind::input_layernorm);
  b.gq = g(ParamKind::q_proj);
  b.gk = g(ParamKind::k_proj);
  b.gv = g(ParamKind::v_proj);
  b.go = g(ParamKind::o_proj);
  b.g_mlp_norm = g(ParamKind::post_attention_layernorm);
  b.moe = params_.block_moe[size_t(local)] != 0;
  if (!b.moe) {
    b.wg = w(ParamKind::gate_proj);
    b.wu = w(ParamKind::up_proj);
    b.wd = w(ParamKind::down_proj);
    b.gg = g(ParamKind::gate_proj);
    b.gu = g(ParamKind::up_proj);
    b.gd = g(ParamKind::down_proj);
  } else {
    b.w_router = w(ParamKind::router);
    b.g_router = g(ParamKind::router);
    b.w_experts = weight(params_.model(ParamKind::expert_gate, local, 0));
    b.g_experts = grad(params_.model(ParamKind::expert_gate, local, 0));
    if (params_.shared_expert) {
      b.w_sg = w(ParamKind::shared_gate);
      b.w_su = w(ParamKind::shared_up);
      b.w_sd = w(ParamKind::shared_down);
      b.g_sg = g(ParamKind::shared_gate);
      b.g_su = g(ParamKind::shared_up);
      b.g_sd = g(ParamKind::shared_down);
    }
  }
  // (null where its slot position keeps none: an MoE block's dense FFN
  // tensors, a dense block's MoE ones)
  auto act = [&]<typename T>(const char* name, T*) -> T* {
    if (!table_->has(name)) return nullptr;
    const int64_t i = instance(name, slot, layer);
    return i < 0 ? nullptr : table_->get<T>(name, i);
  };
  b.x_in = act("layer.attn_norm.input", (Elem*)nullptr);
  b.rstd1 = act("layer.attn_norm.rstd", (A*)nullptr);
  b.xhat1 = act("layer.attn_norm.normed_fp32", (A*)nullptr);
  b.ln1 = act("layer.attn_norm.output", (Elem*)nullptr);
  b.q = act("layer.attn.q", (Elem*)nullptr);
  b.k = act("layer.attn.k", (Elem*)nullptr);
  b.v = act("layer.attn.v", (Elem*)nullptr);
  b.q_raw = act("layer.attn.q_raw", (Elem*)nullptr);
  b.k_raw = act("layer.attn.k_raw", (Elem*)nullptr);
  b.q_rstd = act("layer.attn.q_rstd", (A*)nullptr);
  b.k_rstd = act("layer.attn.k_rstd", (A*)nullptr);
  b.out = act("layer.attn.out", (Elem*)nullptr);
  b.lse = act("layer.attn.lse", (A*)nullptr);
  b.probs = act("layer.attn.probs", (Elem*)nullptr);
  b.x_mid = act("layer.mlp_norm.input", (Elem*)nullptr);
  b.rstd2 = act("layer.mlp_norm.rstd", (A*)nullptr);
  b.xhat2 = act("layer.mlp_norm.normed_fp32", (A*)nullptr);
  b.ln2 = act("layer.mlp_norm.output", (Elem*)nullptr);
  b.gate = act("layer.mlp.gate", (Elem*)nullptr);
  b.up = act("layer.mlp.up", (Elem*)nullptr);
  b.act = act("layer.mlp.act", (Elem*)nullptr);
  // LoRA with a frozen, unadapted down_proj keeps no SwiGLU output: its
  // backward reads none (memory::block_saved_shapes).
  if (!b.act && !b.moe) b.act = table_->get<Elem>("scratch.mlp_act");
  if (b.moe) {
    // Its FFN's tensors, where its slot position keeps them or a rebuild
    // refills them.
    b.moe_stats = act("layer.moe.stats", (int64_t*)nullptr);
    b.moe_scores = act("layer.moe.scores", (A*)nullptr);
    b.moe_experts = act("layer.moe.experts", (int32_t*)nullptr);
    b.moe_weights = act("layer.moe.weights", (A*)nullptr);
    b.moe_routing = act("layer.moe.routing", (int64_t*)nullptr);
    b.moe_in = act("layer.moe.input", (Elem*)nullptr);
    b.moe_gate = act("layer.moe.gate", (Elem*)nullptr);
    b.moe_up = act("layer.moe.up", (Elem*)nullptr);
    b.moe_act = act("layer.moe.act", (Elem*)nullptr);
    b.moe_out = act("layer.moe.output", (Elem*)nullptr);
    b.sh_gate = act("layer.moe.shared_gate", (Elem*)nullptr);
    b.sh_up = act("layer.moe.shared_up", (Elem*)nullptr);
    b.sh_act = act("layer.moe.shared_act", (Elem*)nullptr);
  }
  fp8_kept_inputs(b, slot, layer);
  return b;
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
      // Element i of the parameter is (r, c) = (i / local_cols, i % local_cols).
#pragma omp parallel for schedule(static) if (end - begin >= (int64_t{1} << 16))
      for (int64_t i = begin - p.offset; i < end - p.offset; ++i) {
        const int64_t r = i / p.local_cols, c = i % p.local_cols;
        host[size_t(i - (begin - p.offset))] =
            to_elem<Elem>(param_init_value(p, seed, p.row_begin + r, p.col_begin + c));
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
#pragma omp parallel for schedule(static) if (p.local_elements() >= (int64_t{1} << 16))
    for (int64_t i = 0; i < p.local_elements(); ++i)
      host[size_t(i)] = to_elem<Elem>(
          param_init_value(p, seed, p.row_begin + i / p.local_cols, p.col_begin + i % p.local_cols));
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
void LlamaStage<Elem, G>::norm_forward(const Elem* x, const Elem* residual, Elem* sum, const Elem* w,
                                       Elem* y, A* rstd, A* x_hat) {
  const int64_t C = m_.hidden;
  if (l_.norm == NormKind::fused) {
    run(kernels::RmsnormForwardParams<Elem>{.rows = Msp_, .C = C, .eps = m_.norm_eps, .x = x,
                                            .residual = residual, .sum = sum, .weight = w, .y = y,
                                            .rstd = rstd},
        "rmsnorm_forward");
    return;
  }
  const Elem* in = x;
  if (residual) {
    run(kernels::AddParams<Elem>{.n = Msp_ * C, .a = x, .b = residual, .out = sum}, "add");
    in = sum;
  }
  run(kernels::RmsnormUnfusedForwardParams<Elem>{.rows = Msp_, .C = C, .eps = m_.norm_eps, .x = in,
                                                 .weight = w, .y = y, .rstd = rstd, .x_hat = x_hat},
      "rmsnorm_unfused_forward");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::norm_backward(const Elem* x, const A* x_hat, const A* rstd, const Elem* w,
                                        const Elem* dy, Elem* dx, Write write, G* dw) {
  const int64_t C = m_.hidden;
  if (l_.norm == NormKind::fused) {
    run(kernels::RmsnormBackwardParams<Elem, G>{.rows = Msp_, .C = C, .x = x, .weight = w,
                                                .rstd = rstd, .dy = dy, .dx = dx, .dx_write = write,
                                                .dweight = dw},
        "rmsnorm_backward");
    return;
  }
  const kernels::RmsnormUnfusedBackwardParams<Elem, G> p{.rows = Msp_, .C = C, .x_hat = x_hat,
                                                         .rstd = rstd, .weight = w, .dy = dy,
                                                         .dx = dx, .dx_write = write, .dweight = dw};
  run(p, "rmsnorm_unfused_backward", "scratch.norm_unfused");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::block_forward(const Block& b, Elem* x_out, bool recompute) {
  const int64_t C = m_.hidden, t = l_.tp;
  const int64_t Fl = m_.intermediate / t;
  const bool full = !recompute || b.mode == Checkpointing::full;
  Elem* lin = table_->get<Elem>("scratch.linear_out");
  Elem* all_rows = l_.sp ? table_->get<Elem>("comm.sp_gather") : nullptr;

  if (full) {
    norm_forward(b.x_in, nullptr, nullptr, b.w_attn_norm, b.ln1, b.rstd1, b.xhat1);
    // The column-parallel input, or this rank's rows whose FP8 codes q's cast gathers.
    const bool codes1 = fp8_gathers_codes(b, Fp8Gemm::q);
    const Elem* ln1 = codes1 ? b.ln1 : gathered(b.ln1, all_rows);
    // With Qwen3's q and k norms the GEMMs write their inputs.
    Elem* q = b.q_raw ? b.q_raw : b.q;
    Elem* k = b.k_raw ? b.k_raw : b.k;
    linear_forward(b, Fp8Gemm::q, ln1, false, b.wq, q, "gemm q", &b.in_qkv, codes1);
    linear_forward(b, Fp8Gemm::k, ln1, true, b.wk, k, "gemm k");
    linear_forward(b, Fp8Gemm::v, ln1, true, b.wv, b.v, "gemm v");
    lora_forward(b, Linear::q, ln1, q);
    lora_forward(b, Linear::k, ln1, k);
    lora_forward(b, Linear::v, ln1, b.v);
    if (b.q_raw) {
      const int64_t D = m_.head_dim;
      run(kernels::RmsnormForwardParams<Elem>{.rows = M_ * (m_.heads / t), .C = D, .eps = m_.norm_eps, .x = q,
                                              .weight = b.w_q_norm, .y = b.q, .rstd = b.q_rstd},
          "rmsnorm_forward q");
      run(kernels::RmsnormForwardParams<Elem>{.rows = M_ * (m_.kv_heads / t), .C = D, .eps = m_.norm_eps, .x = k,
                                              .weight = b.w_k_norm, .y = b.k, .rstd = b.k_rstd},
          "rmsnorm_forward k");
    }
    rope(b.q, b.k, kernels::RopeDirection::forward);
  }
  if (full || b.mode == Checkpointing::selective) attention_forward(b);
  if (full) {
    linear_forward(b, Fp8Gemm::o, b.out, false, b.wo, lin, "gemm o");
    lora_forward(b, Linear::o, b.out, lin);
    reduce_rows(lin);  // row-parallel output
  }
  if (full || b.mode == Checkpointing::ffn) {
    // The residual add is fused into the norm: x_mid = x_in + attention.
    if (full)
      norm_forward(lin, b.x_in, b.x_mid, b.w_mlp_norm, b.ln2, b.rstd2, b.xhat2);
    else
      norm_forward(b.x_mid, nullptr, nullptr, b.w_mlp_norm, b.ln2, b.rstd2, b.xhat2);
    if (b.moe) {
      moe_forward(b, lin, recompute);
    } else {
      const bool codes2 = fp8_gathers_codes(b, Fp8Gemm::gate);
      const Elem* ln2 = codes2 ? b.ln2 : gathered(b.ln2, all_rows);
      linear_forward(b, Fp8Gemm::gate, ln2, false, b.wg, b.gate, "gemm gate", &b.in_gate_up, codes2);
      linear_forward(b, Fp8Gemm::up, ln2, true, b.wu, b.up, "gemm up");
      lora_forward(b, Linear::gate, ln2, b.gate);
      lora_forward(b, Linear::up, ln2, b.up);
      run(kernels::SwigluForwardParams<Elem>{.rows = M_, .F = Fl, .gate = b.gate, .up = b.up, .act = b.act},
          "swiglu_forward");
    }
  }
  // A rebuild stops here: the block's output was consumed already.
  if (recompute) return;
  if (!b.moe) {  // (an MoE FFN's output is whole already)
    linear_forward(b, Fp8Gemm::down, b.act, false, b.wd, lin, "gemm down", &b.in_down);
    lora_forward(b, Linear::down, b.act, lin);
    reduce_rows(lin);
  }
  run(kernels::AddParams<Elem>{.n = Msp_ * C, .a = b.x_mid, .b = lin, .out = x_out}, "add");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::block_recompute(const Block& b) {
  if (b.mode != Checkpointing::none) block_forward(b, nullptr, true);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::block_backward(const Block& b, Elem* dx) {
  const int64_t D = m_.head_dim, t = l_.tp;
  const int64_t Hl = m_.heads / t, Kl = m_.kv_heads / t, Fl = m_.intermediate / t;
  Elem* d_norm = table_->get<Elem>("scratch.d_norm");
  Elem* lin = table_->get<Elem>("scratch.linear_out");
  Elem* all_rows = l_.sp ? table_->get<Elem>("comm.sp_gather") : nullptr;
  Elem* d_out = table_->get<Elem>("scratch.d_attn_out");
  Elem* dq = table_->get<Elem>("scratch.d_qkv");
  Elem* dk = dq + M_ * Hl * D;
  Elem* dv = dk + M_ * Kl * D;

  // MLP: dx holds the gradient of the block output, which the residual
  // passes to x_mid unchanged; the norm's backward adds its part in place.
  // Under sequence parallelism dx holds this rank's rows: the conjugate of
  // the forward's reduce-scatter gathers them. The MLP norm's output (or its
  // kept FP8 codes) is re-gathered for gate and up's weight gradients while
  // SwiGLU's backward and their input gradients run, and the input gradient
  // is reduced over tp while the weight gradients run (begin_input). An MoE
  // block's FFN runs its own backward (llama_moe.cpp).
  if (b.moe) {
    moe_backward(b, dx, d_norm);
    norm_backward(b.x_mid, b.xhat2, b.rstd2, b.w_mlp_norm, d_norm, dx, Write::accumulate, b.g_mlp_norm);
  } else {
    Elem* d_act = table_->get<Elem>("scratch.d_mlp", 0);
    Elem* d_gate = table_->get<Elem>("scratch.d_mlp", 1);
    Elem* d_up = table_->get<Elem>("scratch.d_mlp", 2);
    const Elem* dxo = gathered(dx, lin);
    linear_dgrad(b, Fp8Gemm::down, dxo, false, b.wd, d_act, Write::overwrite, "gemm down dgrad");
    linear_wgrad(b, Fp8Gemm::down, dxo, true, b.act, false, b.gd, "gemm down wgrad", &b.in_down);
    lora_backward(b, Linear::down, dxo, b.act, d_act);
    InputGather in2 = begin_input(b.ln2, all_rows, b.in_gate_up);
    run(kernels::SwigluBackwardParams<Elem>{.rows = M_, .F = Fl, .gate = b.gate, .up = b.up,
                                            .dact = d_act, .dgate = d_gate, .dup = d_up},
        "swiglu_backward");
    linear_dgrad(b, Fp8Gemm::gate, d_gate, false, b.wg, d_norm, Write::overwrite, "gemm gate dgrad");
    linear_dgrad(b, Fp8Gemm::up, d_up, false, b.wu, d_norm, Write::accumulate, "gemm up dgrad");
    const Elem* ln2 = end_input(in2);
    lora_backward(b, Linear::gate, d_gate, ln2, d_norm);
    lora_backward(b, Linear::up, d_up, ln2, d_norm);
    auto reduce = begin_reduce_rows(d_norm);  // column-parallel input
    linear_wgrad(b, Fp8Gemm::gate, d_gate, false, ln2, false, b.gg, "gemm gate wgrad", &b.in_gate_up);
    linear_wgrad(b, Fp8Gemm::up, d_up, false, ln2, true, b.gu, "gemm up wgrad", &b.in_gate_up);
    reduce->wait();
    norm_backward(b.x_mid, b.xhat2, b.rstd2, b.w_mlp_norm, d_norm, dx, Write::accumulate, b.g_mlp_norm);
  }

  // Attention, the same way: the attention norm's output re-gathered beside
  // the attention's backward and q, k and v's input gradients.
  const Elem* dxm = gathered(dx, lin);
  linear_dgrad(b, Fp8Gemm::o, dxm, false, b.wo, d_out, Write::overwrite, "gemm o dgrad");
  linear_wgrad(b, Fp8Gemm::o, dxm, true, b.out, false, b.go, "gemm o wgrad");
  lora_backward(b, Linear::o, dxm, b.out, d_out);
  InputGather in1 = begin_input(b.ln1, all_rows, b.in_qkv);
  attention_backward(b, d_out, dq, dk, dv);
  rope(dq, dk, kernels::RopeDirection::backward);
  if (b.q_raw) {
    // Qwen3's q and k norms, back through d_out (spent): dq and dk become
    // their inputs' gradients.
    for (const auto& [d, raw, rstd, w, gw, heads] :
         {std::tuple{dq, b.q_raw, b.q_rstd, b.w_q_norm, b.g_q_norm, Hl}, std::tuple{dk, b.k_raw, b.k_rstd, b.w_k_norm, b.g_k_norm, Kl}}) {
      run(kernels::RmsnormBackwardParams<Elem, G>{.rows = M_ * heads, .C = D, .x = raw, .weight = w, .rstd = rstd,
                                                  .dy = d, .dx = d_out, .dweight = gw},
          "rmsnorm_backward qk");
      copy(d, d_out, M_ * heads * D * int64_t(sizeof(Elem)));
    }
  }
  linear_dgrad(b, Fp8Gemm::q, dq, false, b.wq, d_norm, Write::overwrite, "gemm q dgrad");
  linear_dgrad(b, Fp8Gemm::k, dk, false, b.wk, d_norm, Write::accumulate, "gemm k dgrad");
  linear_dgrad(b, Fp8Gemm::v, dv, false, b.wv, d_norm, Write::accumulate, "gemm v dgrad");
  const Elem* ln1 = end_input(in1);
  lora_backward(b, Linear::q, dq, ln1, d_norm);
  lora_backward(b, Linear::k, dk, ln1, d_norm);
  lora_backward(b, Linear::v, dv, ln1, d_norm);
  auto reduce = begin_reduce_rows(d_norm);
  linear_wgrad(b, Fp8Gemm::q, dq, false, ln1, false, b.gq, "gemm q wgrad", &b.in_qkv);
  linear_wgrad(b, Fp8Gemm::k, dk, false, ln1, true, b.gk, "gemm k wgrad", &b.in_qkv);
  linear_wgrad(b, Fp8Gemm::v, dv, false, ln1, true, b.gv, "gemm v wgrad", &b.in_qkv);
  reduce->wait();
  norm_backward(b.x_in, b.xhat1, b.rstd1, b.w_attn_norm, d_norm, dx, Write::accumulate, b.g_attn_norm);
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
