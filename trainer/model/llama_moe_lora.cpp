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
// The adapters are whole on every rank that holds their expert. Under an
// expert tp degree each tp rank holds 1 / etp of an expert's width, and
// computes with its part of the adapters on that width: its rows of each
// half of gate_up's B (its gate and up outputs) and its columns of down's A
// (its SwiGLU outputs), the others whole. Each rank's A (gate_up) and B
// (down) gradients are then partial sums over the width, its B (gate_up)
// and A (down) gradients its own rows and columns, zero elsewhere: summed
// over tp, every adapter's whole gradient (reduce_replicated_grads), and
// the partial products into the input gradient and the output sum over tp
// with the experts' own. So nothing here communicates: the gradients are
// reduced with the experts' own (over the expert data-parallel group, and
// over tp under sp or an expert tp degree).
#include <array>
#include <span>
#include <vector>

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
    const int64_t rg = sp.lora.experts_gate_up_rank();
    a.gu_a = a.stride;
    a.gu_b = a.gu_a + rg * C;
    a.stride = a.gu_b + 2 * Fe * rg;
  }
  if (sp.expert_down) {
    a.d_a = a.stride;
    a.d_b = a.d_a + r * Fe;
    a.stride = a.d_b + C * r;
  }
  return a;
}

// One adapter pair of every local expert over its runs of rows: A (r, K) at
// `a` within each expert's adapters, read by the input x (K wide); B's
// halves (the gate's and the up's rows of gate_up's B, or down's one), each
// N rows at `b`, whose outputs y (forward) or output gradients dy
// (backward) are N wide.
// (a_ld: A's row stride, K where A is whole; the experts' width under an
// expert tp degree, for this rank's columns of down's A.)
template <typename Elem>
struct Site {
  const Elem* x;
  int64_t K, a, a_ld;
  struct Half {
    Elem* y;
    const Elem* dy;
    int64_t N, b;
  };
  std::vector<Half> halves;
};

// The products over every run, one grouped GEMM each, the weight gradients
// in waves; `launch(params, op)` runs one, `w` and `gw` are the first local
// expert's adapters and their gradients (null: frozen), `stride` apart, h
// and g (rows, r) scratch.
template <typename Elem, typename G, typename Runs, typename Launch>
struct SiteRun {
  Launch& launch;
  const Runs& runs;
  const Elem* w;
  G* gw;
  int64_t stride, r;
  kernels::Acc<Elem> s;
  Elem *h, *g;

  const Elem* at(int64_t expert, int64_t offset) const { return w + expert * stride + offset; }
  // h = x A^T.
  void rebuild_h(const Site<Elem>& site, const char* op) {
    std::vector<kernels::GemmParams<Elem>> gemms;
    for (const auto& e : runs) {
      auto p = kernels::linear_forward_gemm(e.rows, site.K, r, site.x + e.offset * site.K, at(e.expert, site.a),
                                            h + e.offset * r);
      p.ldb = site.a_ld;
      gemms.push_back(p);
    }
    launch(grouped(gemms), op);
  }
  // y += s h B^T, each half.
  void forward(const Site<Elem>& site, const char* op_a, const char* op_b) {
    rebuild_h(site, op_a);
    std::vector<kernels::GemmParams<Elem>> gemms;
    for (const auto& e : runs)
      for (const auto& half : site.halves) {
        auto p = kernels::linear_forward_gemm(e.rows, r, half.N, static_cast<const Elem*>(h + e.offset * r),
                                              at(e.expert, half.b), half.y + e.offset * half.N, Write::accumulate);
        p.alpha = s;
        gemms.push_back(p);
      }
    launch(grouped(gemms), op_b);
  }
  // g = s sum dy B (a launch a half: each adds to the last), dx += g A,
  // dA += g^T x, h rebuilt, dB += s dy^T h. `ops`: the five products' names
  // (string literals: the profiler keeps them).
  void backward(const Site<Elem>& site, Elem* dx, const std::array<const char*, 5>& ops) {
    for (size_t j = 0; j < site.halves.size(); ++j) {
      const auto& half = site.halves[j];
      std::vector<kernels::GemmParams<Elem>> gemms;
      for (const auto& e : runs) {
        auto p = kernels::linear_dgrad_gemm(e.rows, r, half.N, half.dy + e.offset * half.N, at(e.expert, half.b),
                                            g + e.offset * r, j > 0 ? Write::accumulate : Write::overwrite);
        p.alpha = s;
        gemms.push_back(p);
      }
      launch(grouped(gemms), ops[0]);
    }
    std::vector<kernels::GemmParams<Elem>> gemms;
    for (const auto& e : runs) {
      auto p = kernels::linear_dgrad_gemm(e.rows, site.K, r, static_cast<const Elem*>(g + e.offset * r),
                                          at(e.expert, site.a), dx + e.offset * site.K, Write::accumulate);
      p.ldb = site.a_ld;
      gemms.push_back(p);
    }
    launch(grouped(gemms), ops[1]);
    if (!gw) return;
    std::vector<kernels::WgradGemmParams<Elem, G>> wgrads;
    for (const auto& e : runs) {
      auto p = kernels::linear_wgrad_gemm(e.rows, site.K, r, static_cast<const Elem*>(g + e.offset * r),
                                          site.x + e.offset * site.K, gw + e.expert * stride + site.a);
      p.ldc = site.a_ld;
      wgrads.push_back(p);
    }
    for (const auto& wave : waves(wgrads)) launch(grouped(wave), ops[2]);
    rebuild_h(site, ops[3]);
    wgrads.clear();
    for (const auto& e : runs)
      for (const auto& half : site.halves) {
        auto p = kernels::linear_wgrad_gemm(e.rows, r, half.N, half.dy + e.offset * half.N,
                                            static_cast<const Elem*>(h + e.offset * r),
                                            gw + e.expert * stride + half.b);
        p.alpha = s;
        wgrads.push_back(p);
      }
    for (const auto& wave : waves(wgrads)) launch(grouped(wave), ops[4]);
  }
};

}  // namespace

// The experts' gate_up site (x their permuted input, B's halves the gate's
// and the up's) and down site (x their SwiGLU output, into `out`), for the
// forward (y) or the backward (dy).
// (`r_site`: the site's rank, the experts' gate_up's its own where it has
// one; alpha / rank is every site's. Fe: the experts' whole width, Fl this
// rank's part of it, from column or row `part` x Fl.)
#define WEFT_MOE_LORA_SETUP(r_site)                                                                     \
  const int64_t C = m_.hidden, Fe = m_.moe.expert_intermediate, Fl = Fe / l_.etp;                     \
  const int64_t part = l_.etp > 1 ? groups_.tp->rank() : 0;                                            \
  const ExpertAdapters at = expert_adapters(m_, params_);                                              \
  auto launch = [this](const auto& p, const char* op) { run(p, op); };                                 \
  SiteRun<Elem, G, std::span<const ExpertRun>, decltype(launch)> site_run{                             \
      launch, runs, b.lora_experts, b.lora_g_experts, at.stride, r_site,                               \
      A(params_.lora.scale()), table_->get<Elem>("scratch.moe_lora", 0), table_->get<Elem>("scratch.moe_lora", 1)}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_gate_up(const Block& b, std::span<const ExpertRun> runs) {
  WEFT_MOE_LORA_SETUP(params_.lora.experts_gate_up_rank());
  const int64_t rg = params_.lora.experts_gate_up_rank(), gate = at.gu_b + part * Fl * rg, up = gate + Fe * rg;
  site_run.forward({b.moe_in, C, at.gu_a, C, {{b.moe_gate, nullptr, Fl, gate}, {b.moe_up, nullptr, Fl, up}}},
                   "gemm experts gate_up lora_a", "gemm experts gate_up lora_b");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_down(const Block& b, std::span<const ExpertRun> runs, Elem* out) {
  WEFT_MOE_LORA_SETUP(params_.lora.rank);
  site_run.forward({b.moe_act, Fl, at.d_a + part * Fl, Fe, {{out, nullptr, C, at.d_b}}}, "gemm experts down lora_a",
                   "gemm experts down lora_b");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_down_backward(const Block& b, std::span<const ExpertRun> runs, const Elem* d_out,
                                                 Elem* d_act) {
  WEFT_MOE_LORA_SETUP(params_.lora.rank);
  site_run.backward({b.moe_act, Fl, at.d_a + part * Fl, Fe, {{nullptr, d_out, C, at.d_b}}}, d_act,
                    {"gemm experts down lora_b dgrad", "gemm experts down lora_a dgrad",
                     "gemm experts down lora_a wgrad", "gemm experts down lora_a", "gemm experts down lora_b wgrad"});
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_lora_gate_up_backward(const Block& b, std::span<const ExpertRun> runs,
                                                    const Elem* d_gate, const Elem* d_up, Elem* d_in) {
  WEFT_MOE_LORA_SETUP(params_.lora.experts_gate_up_rank());
  const int64_t rg = params_.lora.experts_gate_up_rank(), gate = at.gu_b + part * Fl * rg, up = gate + Fe * rg;
  site_run.backward({b.moe_in, C, at.gu_a, C, {{nullptr, d_gate, Fl, gate}, {nullptr, d_up, Fl, up}}}, d_in,
                    {"gemm experts gate_up lora_b dgrad", "gemm experts gate_up lora_a dgrad",
                     "gemm experts gate_up lora_a wgrad", "gemm experts gate_up lora_a",
                     "gemm experts gate_up lora_b wgrad"});
}

#undef WEFT_MOE_LORA_SETUP

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
