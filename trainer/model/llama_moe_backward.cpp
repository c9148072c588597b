// An MoE block's backward on one rank (llama_moe.cpp says the block and
// its forward): the shared expert's, the combine's, the experts' GEMMs over
// the rows they received (under expert parallelism the output gradients
// sent out and the input gradients back, with the gate on the output each
// row's weight gradient with them), the permutation's, and the router's
// with the balancing loss's gradient at its scores.
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/gemm/gemm.h"
#include "kernels/moe/moe.h"
#include "kernels/swiglu/swiglu.h"
#include "trainer/model/llama_moe_rows.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using kernels::Write;
using memory::Fp8Gemm;
using namespace moe_rows;

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_backward(const Block& b, const Elem* dy, Elem* dx) {
  const MoeSpec& e = m_.moe;
  const bool etp_sp = l_.sp && l_.etp > 1, shared = params_.shared_expert;
  const int64_t C = m_.hidden, E = e.experts, k = e.top_k, Fe = e.expert_intermediate / l_.etp;
  const int64_t rows = Msp_;
  const int64_t stride = 3 * Fe * C;
  // All rows' input and output gradient, gathered under sp, for the shared
  // expert (the forward's way).
  Elem* all_rows = l_.sp ? table_->get<Elem>("comm.sp_gather") : nullptr;
  Elem* all_dy = table_->get<Elem>("scratch.linear_out");
  const Elem* x_all = shared ? gathered(b.ln2, all_rows) : nullptr;
  const Elem* dy_all = shared ? gathered(dy, all_dy) : nullptr;
  const Elem* x = b.ln2;
  // FP8 (llama_moe_fp8.cpp): the weights quantised again, as in the forward.
  const bool f8 = b.fp8 && memory::moe_fp8_experts(m_, l_), sf8 = shared && b.fp8 && memory::moe_fp8_shared(m_, l_);
  Elem* wq = f8 || sf8 ? table_->get<Elem>("scratch.moe_fp8_weight") : nullptr;
  if (wq) moe_fp8_weights(b, wq);
  const Elem* experts_w = f8 ? wq : b.w_experts;
  Elem* copies = moe_fp8_copies(f8 || sf8);
  // Block scaling: the weight gradients' operands quantised again, down the
  // tokens, into their own scratch (null otherwise: they read the values
  // the forward and the dgrads quantised in place).
  Elem* wt = moe_fp8_wgrad_scratch(f8 || sf8);
  if (shared) {
    // Over all rows, its input gradient reduced over tp (to this rank's rows
    // under sp) before the routed experts' adds to them.
    const int64_t Fs = e.shared_intermediate / l_.tp;
    Elem* d_act = table_->get<Elem>("scratch.d_mlp", 0);
    Elem* d_gate = table_->get<Elem>("scratch.d_mlp", 1);
    Elem* d_up = table_->get<Elem>("scratch.d_mlp", 2);
    const Elem* ws = sf8 ? wq + (f8 ? 3 * (E / l_.ep) * Fe * C : 0) : nullptr;
    const Elem* dys = sf8 ? moe_fp8_shared_grad(b, dy_all) : dy_all;
    run(kernels::linear_dgrad_gemm(M_, Fs, C, dys, sf8 ? ws + 2 * Fs * C : b.w_sd, d_act), "gemm shared down dgrad");
    // (LoRA: the base's weights are frozen, without gradients.)
    // Block scaling quantises both operands again, down the tokens: the
    // output gradient into scratch.fp8_grad (its row-tiled copy is spent),
    // the SwiGLU output into scratch.moe_fp8_wgrad.
    // Under cp a tile's rows lie on several cp ranks (shared_token_tiles).
    const TokenTiles cp_tiles = sf8 && wt && l_.cp > 1 ? shared_token_tiles() : TokenTiles{};
    const auto over_tokens = [&](Fp8Gemm g, int role, const Elem* v, int64_t width, Elem* into) -> const Elem* {
      if (cp_tiles.of_row.empty())
        fp8_quantize(b, g, role, v, M_, width, true, into);
      else
        fp8_token_tiles(v, into, width, cp_tiles);
      if (into == fp8_input_) fp8_input_of_ = nullptr;
      if (into == fp8_grad_) fp8_grad_of_ = nullptr;
      return into;
    };
    const bool tiles = sf8 && wt;
    if (b.g_sd)
      run(kernels::linear_wgrad_gemm(M_, Fs, C, tiles ? over_tokens(Fp8Gemm::down, 2, dy_all, C, fp8_grad_) : dys,
                                     tiles ? over_tokens(Fp8Gemm::down, 0, b.sh_act, Fs, wt) : b.sh_act, b.g_sd),
          "gemm shared down wgrad");
    lora_backward(b, Linear::down, dy_all, b.sh_act, d_act, Fs, C);
    run(kernels::SwigluBackwardParams<Elem>{.rows = M_, .F = Fs, .gate = b.sh_gate, .up = b.sh_up,
                                            .dact = d_act, .dgate = d_gate, .dup = d_up},
        "swiglu_backward");
    // Under FP8 each quantised just before its dgrad: in place, or under
    // LoRA into the one scratch (the adapters read them as they are below).
    const auto quantised = [&](Fp8Gemm g, Elem* d) {
      if (!sf8) return d;
      Elem* q = copies ? copies : d;
      fp8_quantize(b, g, 2, d, M_, Fs, false, q);
      return q;
    };
    run(kernels::linear_dgrad_gemm(M_, C, Fs, quantised(Fp8Gemm::gate, d_gate), sf8 ? ws : b.w_sg, dx),
        "gemm shared gate dgrad");
    run(kernels::linear_dgrad_gemm(M_, C, Fs, quantised(Fp8Gemm::up, d_up), sf8 ? ws + Fs * C : b.w_su, dx,
                                   Write::accumulate),
        "gemm shared up dgrad");
    WEFT_ASSERT(!copies || wt || !(b.g_sg || b.g_su || b.g_sd));
    const Elem* xs = !(sf8 && (b.g_sg || b.g_su)) ? x_all
                     : tiles                       ? over_tokens(Fp8Gemm::gate, 0, x_all, C, fp8_input_)
                                                   : moe_fp8_shared_input(b, x_all);
    if (b.g_sg)
      run(kernels::linear_wgrad_gemm(M_, C, Fs, tiles ? over_tokens(Fp8Gemm::gate, 2, d_gate, Fs, wt) : d_gate, xs,
                                     b.g_sg),
          "gemm shared gate wgrad");
    if (b.g_su)
      run(kernels::linear_wgrad_gemm(M_, C, Fs, tiles ? over_tokens(Fp8Gemm::up, 2, d_up, Fs, wt) : d_up, xs, b.g_su),
          "gemm shared up wgrad");
    lora_backward(b, Linear::gate, d_gate, x_all, dx, C, Fs);
    lora_backward(b, Linear::up, d_up, x_all, dx, C, Fs);
    begin_reduce_rows(dx)->wait();
  }
  const int64_t* position = b.moe_routing;
  const bool ep = l_.ep > 1;
  // The forward's offsets and exchanged counts, on the host (moe_host):
  // under etp with sp, the tp ranks' received counts after them.
  const int64_t exchanged = !ep ? 0 : l_.dispatch == MoeDispatch::allgather ? l_.ep * E : E;
  const int64_t gathered_counts = etp_sp ? l_.tp * E : 0;
  const std::vector<int64_t> tail = moe_host(b.moe_routing + rows * k, E + 1 + exchanged + gathered_counts);
  const int64_t* offsets = tail.data();
  const int64_t* counts = ep ? offsets + E + 1 : nullptr;
  const std::vector<int64_t> sent = expert_counts(offsets, E);
  const std::vector<int64_t> received =
      etp_sp ? std::vector<int64_t>(tail.end() - gathered_counts, tail.end())
      : ep   ? received_counts(counts, E, l_.ep, groups_.ep->rank(), l_.dispatch)
             : std::vector<int64_t>{};
  const std::vector<int64_t> blocks = etp_sp ? tp_blocks(received, l_.tp, E, C) : std::vector<int64_t>{};
  Elem* staged = ep && etp_sp ? table_->get<Elem>("scratch.moe_staged") : nullptr;
  Elem* d_rows = table_->get<Elem>("scratch.moe_d_rows");
  Elem* d_act = table_->get<Elem>("scratch.moe_d_mlp", 0);
  Elem* d_gate = table_->get<Elem>("scratch.moe_d_mlp", 1);
  Elem* d_up = table_->get<Elem>("scratch.moe_d_mlp", 2);
  A* dweights = table_->get<A>("scratch.moe_dweights");
  const bool on_output = e.gate_on == GateOn::output;
  // The combine's gradient (a plain sum's): each choice's row of the
  // experts' output gradient. With the gate on the output the experts'
  // SwiGLU backward gives the weights' gradients, one a row, which come
  // back as the input gradients do (moe_row_dweights, then in this rank's
  // expert order moe_row_weights).
  run(kernels::MoeUnpermuteBackwardParams<Elem>{.rows = rows, .C = C, .top_k = k, .gate = GateOn::input,
                                                .position = position, .dout = dy, .dy = d_rows},
      "moe_unpermute_backward");
  A* row_dweights = on_output ? table_->get<A>("scratch.moe_row_dweights") : nullptr;
  // Under expert parallelism the output gradient goes where the rows were
  // computed, and the input gradient comes back; under etp with sp the tp
  // ranks gather their received rows' output gradients, and the input
  // gradients' sums go back to each.
  Elem* d_in = ep || etp_sp ? table_->get<Elem>("scratch.moe_received") : d_rows;
  int64_t rows_in = offsets[E];
  if (ep) rows_in = moe_exchange(sent.data(), counts, d_rows, etp_sp ? staged : d_in, C, false);
  if (etp_sp) {
    groups_.tp->all_gather_v(ep ? staged : d_rows, d_in, blocks);
    rows_in = std::accumulate(blocks.begin(), blocks.end(), int64_t{0}) / C;
  }
  // Each projection's GEMMs over every local expert's rows as one grouped
  // GEMM: the down projection's input and weight gradients, then the gate's
  // and the up's input gradients (the up's adding to the gate's, so after
  // them) and their weight gradients together.
  const std::vector<ExpertRun> segments = expert_rows<ExpertRun>(offsets, received, E, l_.ep);
  // FP8: each output gradient quantised just before its dgrad, in place
  // (the weight gradients read them too) or under LoRA on the FFN into
  // scratch.moe_fp8_rows (the base frozen, the adapters reading d_in,
  // d_gate and d_up as they are). Block scaling quantises into that scratch
  // too, and its weight gradients take both operands again, down the
  // tokens of each run, two at a time in scratch.moe_fp8_wgrad (`wt`).
  WEFT_ASSERT(!copies || !b.g_experts || wt);
  const auto quantised = [&](int gemm, Elem* d, int64_t width) {
    return f8 ? moe_fp8_rows(b, gemm, d, copies ? copies : d, width, segments, etp_sp, 2) : d;
  };
  const bool tiles = f8 && wt && b.g_experts;
  // The weight gradients' operands: the output gradient (C or Fe wide) at
  // the scratch's start, the input after it; their tiles down the tokens
  // (each run's own without sp and cp).
  const TokenTiles token_tiles = tiles ? moe_token_tiles(b, segments, rows_in, etp_sp) : TokenTiles{};
  const auto wgrad_operand = [&](int gemm, const Elem* v, int64_t width, int role, int64_t at) -> const Elem* {
    return tiles ? moe_fp8_rows(b, gemm, v, wt + at, width, segments, etp_sp, role, &token_tiles) : v;
  };
  const Elem* dq = quantised(2, d_in, C);
  const Elem* dy_w = wgrad_operand(2, d_in, C, 2, 0);
  const Elem* act_w = wgrad_operand(2, b.moe_act, Fe, 0, rows_in * C);
  std::vector<kernels::GemmParams<Elem>> gemms;
  std::vector<kernels::WgradGemmParams<Elem, G>> wgrads;
  for (const ExpertRun& r : segments) {
    const Elem* wd = experts_w + r.expert * stride + 2 * Fe * C;
    gemms.push_back(kernels::linear_dgrad_gemm(r.rows, Fe, C, dq + r.offset * C, wd, d_act + r.offset * Fe));
    if (b.g_experts)
      wgrads.push_back(kernels::linear_wgrad_gemm(r.rows, Fe, C, dy_w + r.offset * C, act_w + r.offset * Fe,
                                                  b.g_experts + r.expert * stride + 2 * Fe * C));
  }
  run(grouped(gemms), "gemm experts down dgrad");
  for (const auto& wave : waves(wgrads)) run(grouped(wave), "gemm experts down wgrad");
  if (b.lora_experts && params_.expert_down) moe_lora_down_backward(b, segments, d_in, d_act);
  run(kernels::SwigluBackwardParams<Elem>{.rows = rows_in, .F = Fe, .gate = b.moe_gate, .up = b.moe_up,
                                          .dact = d_act, .dgate = d_gate, .dup = d_up,
                                          .row_scale = on_output ? b.moe_row_weights : nullptr,
                                          .drow_scale = row_dweights},
      "swiglu_backward");
  // The experts' input gradient takes d_in over (its output gradient is spent).
  gemms.clear();
  wgrads.clear();
  const Elem* gq = quantised(0, d_gate, Fe);
  for (const ExpertRun& r : segments) {
    const Elem* w = experts_w + r.expert * stride;
    gemms.push_back(kernels::linear_dgrad_gemm(r.rows, C, Fe, gq + r.offset * Fe, w, d_in + r.offset * C));
  }
  run(grouped(gemms), "gemm experts gate dgrad");
  gemms.clear();
  const Elem* uq = quantised(1, d_up, Fe);
  for (const ExpertRun& r : segments) {
    const Elem* w = experts_w + r.expert * stride;
    const int64_t o = r.offset, n = r.rows;
    gemms.push_back(kernels::linear_dgrad_gemm(n, C, Fe, uq + o * Fe, w + Fe * C, d_in + o * C, Write::accumulate));
  }
  run(grouped(gemms), "gemm experts up dgrad");
  if (b.g_experts) {
    // The gate's and the up's together; under block scaling the gate's
    // first, whose output gradient's token tiles the up's then replace.
    const Elem* in_w = wgrad_operand(0, b.moe_in, C, 0, rows_in * Fe);
    for (int part = 0; part < 2; ++part) {
      const Elem* dg = wgrad_operand(part, part == 0 ? d_gate : d_up, Fe, 2, 0);
      for (const ExpertRun& r : segments) {
        const int64_t o = r.offset, n = r.rows;
        wgrads.push_back(kernels::linear_wgrad_gemm(n, C, Fe, dg + o * Fe, in_w + o * C,
                                                    b.g_experts + r.expert * stride + part * Fe * C));
      }
      if (tiles || part == 1) {
        for (const auto& wave : waves(wgrads)) run(grouped(wave), "gemm experts gate up wgrad");
        wgrads.clear();
      }
    }
  }
  if (b.lora_experts && params_.expert_gate_up) moe_lora_gate_up_backward(b, segments, d_gate, d_up, d_in);
  // An expert tp degree: the input gradient's parts from each tp rank's
  // part of the width, summed (under sp to each tp rank's own received rows).
  if (etp_sp) {
    groups_.tp->reduce_scatter_v(d_in, ep ? staged : d_rows, blocks);
    if (ep) moe_exchange(sent.data(), counts, staged, d_rows, C, true);
  } else {
    if (l_.etp > 1) groups_.tp->all_reduce(d_in, rows_in * C);
    if (ep) moe_exchange(sent.data(), counts, d_in, d_rows, C, true);
  }
  // The rows' weight gradients the same way back (each tp rank's part of
  // the width gave a part of each row's sum).
  A* back_dweights = on_output && (ep || etp_sp) ? table_->get<A>("scratch.moe_row_weights") : row_dweights;
  if (on_output) {
    A* staged_weights = reinterpret_cast<A*>(staged);
    if (etp_sp) {
      groups_.tp->reduce_scatter_v(row_dweights, ep ? staged_weights : back_dweights, tp_blocks(received, l_.tp, E, 1));
      if (ep) moe_exchange(sent.data(), counts, staged_weights, back_dweights, 1, true);
    } else {
      if (l_.etp > 1) groups_.tp->all_reduce(row_dweights, rows_in);
      if (ep) moe_exchange(sent.data(), counts, row_dweights, back_dweights, 1, true);
    }
  }
  run(kernels::MoePermuteBackwardParams<Elem>{.rows = rows, .C = C, .top_k = k, .gate = e.gate_on,
                                              .position = position, .weights = b.moe_weights, .x = x,
                                              .dout = d_rows, .dx = dx, .dweights = dweights,
                                              .write = shared ? Write::accumulate : Write::overwrite,
                                              .row_dweights = back_dweights},
      "moe_permute_backward");
  // The router: the balancing loss's gradient at each expert's score (the
  // same at every row), weighted as the micro-batch's share of the step's
  // objective (its tokens over the step's: the mean over micro-batches).
  std::vector<double> dscore;
  const double* dscore_row = nullptr;
  const double aux_scale = slot_scale_[size_t(b.slot)] * double(l_.mb * run_.seq);  // the micro-batch's tokens
  if (e.aux_loss_coef > 0 && aux_scale > 0 && e.aux_scope == AuxLossScope::global) {
    // Every layer's the same: from the micro-batch's totals over all its
    // MoE layers (moe_forward_end).
    dscore.resize(size_t(E));
    global_balance(moe_totals(b.slot), dscore.data());
    for (double& v : dscore) v *= aux_scale;
    dscore_row = dscore.data();
  } else if (e.aux_loss_coef > 0 && aux_scale > 0) {
    const int64_t chunk = chunk_of(b.index);
    moe_balance(b.slot, chunk, &dscore);
    int64_t before = 0;  // the chunk's MoE blocks ahead of this one
    for (int64_t i = chunk_begin_[size_t(chunk)]; i < b.index; ++i) before += params_.block_moe[size_t(i)];
    for (int64_t j = 0; j < E; ++j) dscore[size_t(before * E + j)] *= aux_scale;
    dscore_row = dscore.data() + before * E;
  }
  // On a device the kernel reads the balancing loss's gradient from device
  // memory: the rebuild's statistics scratch, free by now.
  if (dscore_row && on_device()) {
    auto* at = reinterpret_cast<double*>(table_->get<int64_t>("scratch.moe_stats"));
    copy(at, dscore_row, E * int64_t(sizeof(double)));
    dscore_row = at;
  }
  Elem* dlogits = table_->get<Elem>("scratch.moe_logits");
  const kernels::RouterConfig router{
      .experts = E, .top_k = k, .score = e.score, .weights = e.weights, .scale = e.route_scale};
  run(kernels::MoeRouteBackwardParams<Elem>{.rows = rows, .router = router, .scores = b.moe_scores,
                                            .experts = b.moe_experts, .dweights = dweights,
                                            .dscore_per_expert = dscore_row, .dlogits = dlogits},
      "moe_route_backward");
  // The router's input and weight gradients from this rank's rows.
  run(kernels::linear_dgrad_gemm(Msp_, C, E, dlogits, b.w_router, dx, Write::accumulate), "gemm router dgrad");
  if (b.g_router) run(kernels::linear_wgrad_gemm(Msp_, C, E, dlogits, b.ln2, b.g_router), "gemm router wgrad");
}

#define WEFT_LLAMA_MOE_BACKWARD(E, G) template void LlamaStage<E, G>::moe_backward(const Block&, const E*, E*);
WEFT_LLAMA_MOE_BACKWARD(float, float)
WEFT_LLAMA_MOE_BACKWARD(double, double)
WEFT_LLAMA_MOE_BACKWARD(kernels::bf16, float)
WEFT_LLAMA_MOE_BACKWARD(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_MOE_BACKWARD

}  // namespace weft::trainer
