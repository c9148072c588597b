// LoRA on an MoE block's routed experts (RunSpec::lora with gate, up or
// down targeted), as PEFT adapts transformers' 3-D expert tensors
// (checkpoint::ExpertLora): each expert's fused gate and up take one A
// (r, C) both read and one B (2 F_e, r), the gate's rows then the up's; its
// down one A (r, F_e) and one B (C, r); every output scaled by s = alpha / r.
// Over each run of rows an expert computes (x: its rows of the permuted
// input, act: of the SwiGLU output), with h = x A^T (rows, r) in scratch:
//   forward    gate += s h B_g^T, up += s h B_u^T;  out += s (act A_d^T) B_d^T
//   backward   g = s (d_gate B_g + d_up B_u), d_in += g A, dA += g^T x,
//              dB_g += s d_gate^T h, dB_u += s d_up^T h (h rebuilt);
//              the down's alike from the output gradient into d_act.
// Each product over every local expert's runs is one grouped GEMM, the
// weight gradients in waves (an expert's runs from several ep ranks add to
// one gradient, never in one launch). No dropout: an adapter on a 3-D
// expert tensor cannot factor it out of the input (lora_check_model).
// Experts are whole on every rank that holds them (etp1), so nothing here
// communicates: the gradients are reduced with the experts' own (over the
// expert data-parallel group, and over tp under sp).
#include "kernels/gemm/gemm.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using kernels::Write;

namespace {

// One expert's adapters' elements and where each starts among them.
struct ExpertAdapters {
  int64_t stride = 0;                          // one expert's, all of them
  int64_t gu_a = 0, gu_b = 0, d_a = 0, d_b = 0;  // offsets
};

ExpertAdapters expert_adapters(const ModelSpec& m, const StageParams& sp) {
  const int64_t r = sp.lora.rank, C = m.hidden, Fe = m.moe.expert_intermediate;
  ExpertAdapters a;
  if (sp.expert_gate_up) {
    a.gu_a = a.stride;
    a.gu_b = a.gu_a + r * C;
    a.stride = a.gu_b + 2 * Fe * r;
  }
  if (sp.expert_down) {
    a.d_a = a.stride;
    a.d_b = a.d_a + r * Fe;
    a.stride = a.d_b + C * r;
  }
  return a;
}

}  // namespace

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_gate_up(const Block& b, std::span<const ExpertRun> runs) {
  const int64_t C = m_.hidden, Fe = m_.moe.expert_intermediate, r = params_.lora.rank;
  const ExpertAdapters at = expert_adapters(m_, params_);
  Elem* h = table_->get<Elem>("scratch.moe_lora", 0);
  std::vector<kernels::GemmParams<Elem>> gemms;
  for (const ExpertRun& e : runs) {
    const Elem* a = b.lora_experts + e.expert * at.stride + at.gu_a;
    gemms.push_back(kernels::linear_forward_gemm(e.rows, C, r, b.moe_in + e.offset * C, a, h + e.offset * r));
  }
  run(grouped(gemms), "gemm experts gate_up lora_a");
  gemms.clear();
  for (const ExpertRun& e : runs) {
    const Elem* bw = b.lora_experts + e.expert * at.stride + at.gu_b;
    const Elem* he = h + e.offset * r;
    auto gate = kernels::linear_forward_gemm(e.rows, r, Fe, he, bw, b.moe_gate + e.offset * Fe, Write::accumulate);
    auto up = kernels::linear_forward_gemm(e.rows, r, Fe, he, bw + Fe * r, b.moe_up + e.offset * Fe,
                                           Write::accumulate);
    gate.alpha = up.alpha = A(params_.lora.scale());
    gemms.push_back(gate);
    gemms.push_back(up);
  }
  run(grouped(gemms), "gemm experts gate_up lora_b");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_down(const Block& b, std::span<const ExpertRun> runs, Elem* out) {
  const int64_t C = m_.hidden, Fe = m_.moe.expert_intermediate, r = params_.lora.rank;
  const ExpertAdapters at = expert_adapters(m_, params_);
  Elem* h = table_->get<Elem>("scratch.moe_lora", 0);
  std::vector<kernels::GemmParams<Elem>> gemms;
  for (const ExpertRun& e : runs) {
    const Elem* a = b.lora_experts + e.expert * at.stride + at.d_a;
    gemms.push_back(kernels::linear_forward_gemm(e.rows, Fe, r, b.moe_act + e.offset * Fe, a, h + e.offset * r));
  }
  run(grouped(gemms), "gemm experts down lora_a");
  gemms.clear();
  for (const ExpertRun& e : runs) {
    const Elem* bw = b.lora_experts + e.expert * at.stride + at.d_b;
    auto g = kernels::linear_forward_gemm(e.rows, r, C, static_cast<const Elem*>(h + e.offset * r), bw,
                                          out + e.offset * C, Write::accumulate);
    g.alpha = A(params_.lora.scale());
    gemms.push_back(g);
  }
  run(grouped(gemms), "gemm experts down lora_b");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_down_backward(const Block& b, std::span<const ExpertRun> runs, const Elem* d_out,
                                                 Elem* d_act) {
  const int64_t C = m_.hidden, Fe = m_.moe.expert_intermediate, r = params_.lora.rank;
  const ExpertAdapters at = expert_adapters(m_, params_);
  const A s = A(params_.lora.scale());
  Elem* h = table_->get<Elem>("scratch.moe_lora", 0);
  Elem* gr = table_->get<Elem>("scratch.moe_lora", 1);
  std::vector<kernels::GemmParams<Elem>> gemms;
  std::vector<kernels::WgradGemmParams<Elem, G>> wgrads;
  // g = s dY B_d, then its part of the SwiGLU output's gradient, g A_d.
  for (const ExpertRun& e : runs) {
    auto g = kernels::linear_dgrad_gemm(e.rows, r, C, d_out + e.offset * C,
                                        b.lora_experts + e.expert * at.stride + at.d_b, gr + e.offset * r);
    g.alpha = s;
    gemms.push_back(g);
  }
  run(grouped(gemms), "gemm experts down lora_b dgrad");
  gemms.clear();
  for (const ExpertRun& e : runs)
    gemms.push_back(kernels::linear_dgrad_gemm(e.rows, Fe, r, static_cast<const Elem*>(gr + e.offset * r),
                                               b.lora_experts + e.expert * at.stride + at.d_a,
                                               d_act + e.offset * Fe, Write::accumulate));
  run(grouped(gemms), "gemm experts down lora_a dgrad");
  if (!b.lora_g_experts) return;
  // dA_d += g^T act; h = act A_d^T rebuilt; dB_d += s dY^T h.
  for (const ExpertRun& e : runs)
    wgrads.push_back(kernels::linear_wgrad_gemm(e.rows, Fe, r, static_cast<const Elem*>(gr + e.offset * r),
                                                b.moe_act + e.offset * Fe,
                                                b.lora_g_experts + e.expert * at.stride + at.d_a));
  for (const auto& wave : waves(wgrads)) run(grouped(wave), "gemm experts down lora_a wgrad");
  gemms.clear();
  for (const ExpertRun& e : runs)
    gemms.push_back(kernels::linear_forward_gemm(e.rows, Fe, r, b.moe_act + e.offset * Fe,
                                                 b.lora_experts + e.expert * at.stride + at.d_a, h + e.offset * r));
  run(grouped(gemms), "gemm experts down lora_a");
  wgrads.clear();
  for (const ExpertRun& e : runs) {
    auto w = kernels::linear_wgrad_gemm(e.rows, r, C, d_out + e.offset * C, static_cast<const Elem*>(h + e.offset * r),
                                        b.lora_g_experts + e.expert * at.stride + at.d_b);
    w.alpha = s;
    wgrads.push_back(w);
  }
  for (const auto& wave : waves(wgrads)) run(grouped(wave), "gemm experts down lora_b wgrad");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_gate_up_backward(const Block& b, std::span<const ExpertRun> runs,
                                                    const Elem* d_gate, const Elem* d_up, Elem* d_in) {
  const int64_t C = m_.hidden, Fe = m_.moe.expert_intermediate, r = params_.lora.rank;
  const ExpertAdapters at = expert_adapters(m_, params_);
  const A s = A(params_.lora.scale());
  Elem* h = table_->get<Elem>("scratch.moe_lora", 0);
  Elem* gr = table_->get<Elem>("scratch.moe_lora", 1);
  std::vector<kernels::GemmParams<Elem>> gemms;
  std::vector<kernels::WgradGemmParams<Elem, G>> wgrads;
  // g = s (d_gate B_g + d_up B_u): the up's adds to the gate's, a launch after.
  for (const bool up : {false, true}) {
    gemms.clear();
    for (const ExpertRun& e : runs) {
      auto g = kernels::linear_dgrad_gemm(e.rows, r, Fe, (up ? d_up : d_gate) + e.offset * Fe,
                                          b.lora_experts + e.expert * at.stride + at.gu_b + (up ? Fe * r : 0),
                                          gr + e.offset * r, up ? Write::accumulate : Write::overwrite);
      g.alpha = s;
      gemms.push_back(g);
    }
    run(grouped(gemms), up ? "gemm experts up lora_b dgrad" : "gemm experts gate lora_b dgrad");
  }
  gemms.clear();
  for (const ExpertRun& e : runs)
    gemms.push_back(kernels::linear_dgrad_gemm(e.rows, C, r, static_cast<const Elem*>(gr + e.offset * r),
                                               b.lora_experts + e.expert * at.stride + at.gu_a,
                                               d_in + e.offset * C, Write::accumulate));
  run(grouped(gemms), "gemm experts gate_up lora_a dgrad");
  if (!b.lora_g_experts) return;
  // dA += g^T x; h = x A^T rebuilt; dB_g += s d_gate^T h, dB_u += s d_up^T h.
  for (const ExpertRun& e : runs)
    wgrads.push_back(kernels::linear_wgrad_gemm(e.rows, C, r, static_cast<const Elem*>(gr + e.offset * r),
                                                b.moe_in + e.offset * C,
                                                b.lora_g_experts + e.expert * at.stride + at.gu_a));
  for (const auto& wave : waves(wgrads)) run(grouped(wave), "gemm experts gate_up lora_a wgrad");
  gemms.clear();
  for (const ExpertRun& e : runs)
    gemms.push_back(kernels::linear_forward_gemm(e.rows, C, r, b.moe_in + e.offset * C,
                                                 b.lora_experts + e.expert * at.stride + at.gu_a, h + e.offset * r));
  run(grouped(gemms), "gemm experts gate_up lora_a");
  wgrads.clear();
  for (const ExpertRun& e : runs)
    for (const bool up : {false, true}) {
      auto w = kernels::linear_wgrad_gemm(e.rows, r, Fe, (up ? d_up : d_gate) + e.offset * Fe,
                                          static_cast<const Elem*>(h + e.offset * r),
                                          b.lora_g_experts + e.expert * at.stride + at.gu_b + (up ? Fe * r : 0));
      w.alpha = s;
      wgrads.push_back(w);
    }
  for (const auto& wave : waves(wgrads)) run(grouped(wave), "gemm experts gate_up lora_b wgrad");
}

#define WEFT_LLAMA_MOE_LORA(E, G)                                                                              \
  template void LlamaStage<E, G>::moe_lora_gate_up(const Block&, std::span<const ExpertRun>);                  \
  template void LlamaStage<E, G>::moe_lora_down(const Block&, std::span<const ExpertRun>, E*);                 \
  template void LlamaStage<E, G>::moe_lora_down_backward(const Block&, std::span<const ExpertRun>, const E*, E*); \
  template void LlamaStage<E, G>::moe_lora_gate_up_backward(const Block&, std::span<const ExpertRun>, const E*, \
                                                            const E*, E*);
WEFT_LLAMA_MOE_LORA(float, float)
WEFT_LLAMA_MOE_LORA(double, double)
WEFT_LLAMA_MOE_LORA(kernels::bf16, float)
WEFT_LLAMA_MOE_LORA(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_MOE_LORA

}  // namespace weft::trainer
