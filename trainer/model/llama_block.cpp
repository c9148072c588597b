// One block of LlamaStage (trainer/model/llama.h): its tensors for a slot
// (block()), its norms, and its forward, rebuild and backward, written out
// in Hugging Face LlamaForCausalLM semantics; an MoE block's FFN is
// llama_moe.cpp's, the attention core llama_context.cpp's, the linear
// layers' FP8 paths llama_fp8.cpp's.
#include <cmath>
#include <tuple>
#include <type_traits>

#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using kernels::Write;
using memory::Fp8Gemm;

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::Block LlamaStage<Elem, G>::block(int64_t slot, int64_t chunk, int64_t layer) {
  Block b{};
  b.slot = slot;
  b.layer = layer;
  b.mode = mode(layer);
  const int64_t local = chunk_begin_[size_t(chunk)] + layer;  // the stage's block index
  b.index = local;
  b.global = memory::global_layer(m_, l_, plan_.stage, chunk, layer);
  b.fp8 = l_.fp8_layer(m_, b.global);
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
    b.w_experts = weight(params_.model(ParamKind::expert_gate, local, params_.first_expert));
    b.g_experts = grad(params_.model(ParamKind::expert_gate, local, params_.first_expert));
    if (params_.lora.enabled())
      if (const int64_t a = params_.expert_adapter_first[size_t(local)]; a >= 0) {
        b.lora_experts = weight(params_.specs[size_t(a)]);
        b.lora_g_experts = grad(params_.specs[size_t(a)]);
      }
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
    b.moe_row_weights = act("layer.moe.row_weights", (A*)nullptr);
    b.sh_gate = act("layer.moe.shared_gate", (Elem*)nullptr);
    b.sh_up = act("layer.moe.shared_up", (Elem*)nullptr);
    b.sh_act = act("layer.moe.shared_act", (Elem*)nullptr);
  }
  fp8_kept_inputs(b, slot, layer);
  return b;
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
    // With a norm of q and k (Qwen3's before RoPE, Llama 4's L2 norm after
    // it, in RoPE layers) the GEMMs write the norm's inputs.
    const bool roped = rope_layer(b);
    const bool rms = m_.attention.qk_norm == QkNorm::rms, l2 = m_.attention.qk_norm == QkNorm::l2 && roped;
    Elem* q = rms || l2 ? b.q_raw : b.q;
    Elem* k = rms || l2 ? b.k_raw : b.k;
    linear_forward(b, Fp8Gemm::q, ln1, false, b.wq, q, "gemm q", &b.in_qkv, codes1);
    linear_forward(b, Fp8Gemm::k, ln1, true, b.wk, k, "gemm k");
    linear_forward(b, Fp8Gemm::v, ln1, true, b.wv, b.v, "gemm v");
    lora_forward(b, Linear::q, ln1, q);
    lora_forward(b, Linear::k, ln1, k);
    lora_forward(b, Linear::v, ln1, b.v);
    if (l2) rope(q, k, kernels::RopeDirection::forward);
    if (rms || l2) {
      const int64_t D = m_.head_dim;
      const Elem* ones = l2 ? table_->get<Elem>("scratch.qk_ones") : nullptr;
      run(kernels::RmsnormForwardParams<Elem>{.rows = M_ * (m_.heads / t), .C = D, .eps = m_.norm_eps, .x = q,
                                              .weight = l2 ? ones : b.w_q_norm, .y = b.q, .rstd = b.q_rstd},
          "rmsnorm_forward q");
      run(kernels::RmsnormForwardParams<Elem>{.rows = M_ * (m_.kv_heads / t), .C = D, .eps = m_.norm_eps, .x = k,
                                              .weight = l2 ? ones : b.w_k_norm, .y = b.k, .rstd = b.k_rstd},
          "rmsnorm_forward k");
    }
    if (roped && !l2) rope(b.q, b.k, kernels::RopeDirection::forward);
    if (!roped && m_.attention.temperature_scale > 0) temperature(b.q);
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
  // The forward's q and k steps in reverse: the temperature (NoPE layers),
  // RoPE, the norm (Qwen3's RMSNorm before RoPE, Llama 4's L2 norm after).
  const bool roped = rope_layer(b);
  const bool rms = m_.attention.qk_norm == QkNorm::rms, l2 = m_.attention.qk_norm == QkNorm::l2 && roped;
  if (!roped && m_.attention.temperature_scale > 0) temperature(dq);
  if (roped && !l2) rope(dq, dk, kernels::RopeDirection::backward);
  if (rms || l2) {
    // Back through d_out (spent): dq and dk become the norm inputs'
    // gradients. The L2 norm has no weight (ones, no gradient).
    const Elem* ones = l2 ? table_->get<Elem>("scratch.qk_ones") : nullptr;
    for (const auto& [d, raw, rstd, w, gw, heads] :
         {std::tuple{dq, b.q_raw, b.q_rstd, l2 ? ones : b.w_q_norm, l2 ? nullptr : b.g_q_norm, Hl},
          std::tuple{dk, b.k_raw, b.k_rstd, l2 ? ones : b.w_k_norm, l2 ? nullptr : b.g_k_norm, Kl}}) {
      run(kernels::RmsnormBackwardParams<Elem, G>{.rows = M_ * heads, .C = D, .x = raw, .weight = w, .rstd = rstd,
                                                  .dy = d, .dx = d_out, .dweight = gw},
          "rmsnorm_backward qk");
      copy(d, d_out, M_ * heads * D * int64_t(sizeof(Elem)));
    }
  }
  if (l2) rope(dq, dk, kernels::RopeDirection::backward);
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
bool LlamaStage<Elem, G>::rope_layer(const Block& b) const {
  const int64_t n = m_.attention.nope_interval;
  return n == 0 || (b.global + 1) % n != 0;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::temperature(Elem* q) {
  // Each row's query heads times 1 + scale * log(floor((pos + 1) / floor)
  // + 1), pos its position in the sequence (under cp, its chunk's).
  if constexpr (std::is_same_v<Elem, kernels::bf16>) {
    throw InternalError("the attention temperature runs on the CPU (Llama 4's MoE blocks train there only)");
  } else {
    const int64_t T = M_ / l_.mb, width = (m_.heads / l_.tp) * m_.head_dim, half = T / 2;
    const double scale = m_.attention.temperature_scale, floor_ = double(m_.attention.temperature_floor);
    for (int64_t r = 0; r < M_; ++r) {
      const int64_t t = r % T;
      const int64_t pos = l_.cp == 1 ? t : chunk_offset(groups_.cp_rank(), t / half) + t % half;
      const double s = 1.0 + scale * std::log1p(std::floor(double(pos + 1) / floor_));
      for (int64_t j = 0; j < width; ++j) q[r * width + j] = Elem(double(q[r * width + j]) * s);
    }
  }
}

#define WEFT_LLAMA_BLOCK(E, G)                                                                                 \
  template typename LlamaStage<E, G>::Block LlamaStage<E, G>::block(int64_t, int64_t, int64_t);              \
  template void LlamaStage<E, G>::norm_forward(const E*, const E*, E*, const E*, E*, kernels::Acc<E>*,        \
                                               kernels::Acc<E>*);                                            \
  template void LlamaStage<E, G>::norm_backward(const E*, const kernels::Acc<E>*, const kernels::Acc<E>*,     \
                                                const E*, const E*, E*, kernels::Write, G*);                 \
  template void LlamaStage<E, G>::block_forward(const Block&, E*, bool);                                      \
  template void LlamaStage<E, G>::block_recompute(const Block&);                                              \
  template void LlamaStage<E, G>::block_backward(const Block&, E*);                                           \
  template bool LlamaStage<E, G>::rope_layer(const Block&) const;                                             \
  template void LlamaStage<E, G>::temperature(E*);
WEFT_LLAMA_BLOCK(float, float)
WEFT_LLAMA_BLOCK(double, double)
WEFT_LLAMA_BLOCK(kernels::bf16, float)
WEFT_LLAMA_BLOCK(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_BLOCK

}  // namespace weft::trainer
