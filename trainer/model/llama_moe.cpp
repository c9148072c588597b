// An MoE block's FFN on one rank (core/moe_spec.h says the model): the
// router's GEMM, the routing and the permutation into expert order
// (kernels/moe), each routed expert's SwiGLU as a GEMM per expert and
// projection over its contiguous rows (every expert's of a projection one
// grouped GEMM, kernels/gemm/gemm.h), the combine back into token order,
// and the shared expert beside them; then the backwards in reverse, with
// the balancing loss's gradient entering at the router's scores
// (llama_moe_backward.cpp). With the gate on the output (Mixtral, Qwen3)
// each row's weight scales its SwiGLU output inside the expert
// (Megatron-Core's order), so the combine is a plain sum and nothing of the
// experts' output is kept for the backward.
//
// Without expert parallelism every rank holds every expert (the router and
// the experts whole on every tp rank: an expert tp degree of 1) and routes
// its own rows: the experts' rows are exactly rows x k (dropless), or at
// most E x capacity with a capacity factor (each expert keeps its first
// capacity choices, MoeSpec::capacity), so the shape table's buffers fit
// every batch, however unevenly it routes. Its
// rows: this rank's T / cp tokens of each sequence, and under sequence
// parallelism its 1 / tp of them (Megatron's MoE under tp), whose routed
// output is whole, so it is not reduced over tp; without sp every tp rank
// routes all rows alike. The shared expert splits over tp as a dense FFN
// does (its input gathered, its output reduced). The router's statistics
// are summed over the ranks that split the micro-batch's tokens (cp, and tp
// under sp) before the balancing loss reads them, and the router's and the
// experts' gradients over them with the others' (reduce_replicated_grads
// sums the tp-whole weights' under sp). The experts' row offsets, the
// exchanged counts and the router's statistics are read on the host
// (moe_host: copied back from a device, the stream waited for, once per
// layer and pass), which sizes each expert's GEMM: on a GPU as on the CPU,
// a GEMM per local expert over its contiguous rows (on a GPU cuBLAS's
// grouped GEMM, all of a projection's in one launch); the counts
// go round the ep group on the host groups.
//
// Under expert parallelism (Layout::ep) rank r of the ep group holds
// experts [r E / ep, (r + 1) E / ep), so the rows in expert order are
// already in blocks by the rank that computes them: the per-expert counts
// go round the ep group first (all-to-all), kept with the routing for the
// backward, then the rows (all-to-all with uneven counts). The experts
// compute on what they receive, source by source, and the outputs go back
// the same way; the backward sends the output gradients out and the input
// gradients back. The all-gather dispatcher (dispatch:allgather) gathers
// every rank's counts and rows instead, each rank taking its experts' runs,
// and reduce-scatters a buffer of zeros but its experts' outputs back. Each rank still routes, drops and combines its own rows,
// so every layout computes what one rank does.
//
// An expert tp degree (Layout::etp = tp) splits each expert's width over the
// tp ranks as a dense FFN's: each computes its part of the width on the
// same rows, and the experts' outputs and input gradients are summed over
// tp. Without sp every tp rank routes, dispatches and receives all rows
// alike, and the sums are all-reduces. Under sp it is Megatron-Core's
// order: each tp rank routes and dispatches its own rows (over ep, 1 / tp
// of the group's), the tp ranks then gather the rows they received, with
// their counts, compute their part of the width on all of them, and
// reduce-scatter the partial outputs back, each its own received rows'
// sums; the backward gathers the output gradients and reduce-scatters the
// input gradients alike. The router's statistics are summed over tp, and
// its gradients, from each rank's own rows, with the other tp-whole
// weights' (reduce_replicated_grads).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/flops.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/gemm.h"
#include "kernels/moe/moe.h"
#include "kernels/swiglu/swiglu.h"
#include "trainer/model/llama_moe_rows.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using kernels::Write;
using memory::Fp8Gemm;

void require_moe_layout(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device) {
  if (!m.moe.enabled()) return;
  // LoRA on the experts: gate and up together, no dropout.
  lora_check_model(m, run.lora);
  std::vector<std::string> missing;
  if (l.fp8 != Fp8Recipe::off && device.kind == DeviceKind::gpu)
    missing.push_back(fmt::format("with FP8 GEMMs (fp8:{}) on a GPU (the CPU trainer computes them)", to_string(l.fp8)));
  if (!missing.empty())
    throw InputError(fmt::format("weft cannot train the MoE model {} under layout {} yet: not {}; it trains on "
                                 "the CPU (FP8 off, tensorwise, delayed or blockwise) and the GPU (FP8 off), under "
                                 "tp (with or without sp), cp, pp, vpp, dp, ep, every ZeRO stage and checkpointing "
                                 "mode",
                                 m.name, l.to_string(), fmt::join(missing, ", nor ")));
}

namespace {

// The tags of the ep group's exchanges: the counts, then the rows.
constexpr int64_t kMoeCountsTag = 4000;  // (the rows': llama_moe_dispatch.cpp)

}  // namespace

using namespace moe_rows;

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_forward(const Block& b, Elem* y, bool recompute) {
  const MoeSpec& e = m_.moe;
  // Fe: this rank's share of each expert's width (all of it unless an
  // expert tp degree splits it). The routed rows: this rank's own (under sp
  // its part of the sequence).
  const bool etp_sp = l_.sp && l_.etp > 1, shared = params_.shared_expert;
  const int64_t C = m_.hidden, E = e.experts, k = e.top_k, Fe = e.expert_intermediate / l_.etp;
  const int64_t rows = Msp_;
  const int64_t stride = 3 * Fe * C;  // one expert's gate, up and down (StageParams' order)
  const kernels::RouterConfig router{
      .experts = E, .top_k = k, .score = e.score, .weights = e.weights, .scale = e.route_scale};
  // All rows (gathered under sp) for the shared expert.
  Elem* all_rows = l_.sp ? table_->get<Elem>("comm.sp_gather") : nullptr;
  const Elem* x_all = shared ? gathered(b.ln2, all_rows) : nullptr;
  const Elem* x = b.ln2;
  Elem* logits = table_->get<Elem>("scratch.moe_logits");
  run(kernels::linear_forward_gemm(rows, C, E, x, b.w_router, logits), "gemm router");
  // The statistics start from zero in each forward (route adds to them); a
  // rebuild's go to scratch, the forward's stay for the balancing loss.
  int64_t* stats = recompute ? table_->get<int64_t>("scratch.moe_stats") : b.moe_stats;
  {
    const std::vector<int64_t> zeros(size_t(2 * E), 0);  // (a zero double's bytes too)
    copy(stats, zeros.data(), 2 * E * int64_t(sizeof(int64_t)));
  }
  double* score_sums = reinterpret_cast<double*>(stats + E);
  run(kernels::MoeRouteParams<Elem>{.rows = rows, .router = router, .logits = logits, .scores = b.moe_scores,
                                    .experts = b.moe_experts, .weights = b.moe_weights, .counts = stats,
                                    .score_sums = score_sums},
      "moe_route");
  if (!recompute) {  // the micro-batch's, over the ranks that split its tokens
    for (parallel::Comm* g : {l_.sp ? groups_.tp : nullptr, l_.cp > 1 ? groups_.cp : nullptr})
      if (g && g->size() > 1) {
        g->all_reduce(stats, E);
        g->all_reduce(score_sums, E);
      }
  }
  int64_t* position = b.moe_routing;
  int64_t* offsets = b.moe_routing + rows * k;
  // Under expert parallelism (or an expert tp degree under sp) the rows in
  // expert order leave from scratch and the experts compute on the rows
  // they receive (b.moe_in).
  const bool ep = l_.ep > 1;
  Elem* send = ep || etp_sp ? table_->get<Elem>("scratch.moe_send") : b.moe_in;
  // With the gate on the output the experts scale their SwiGLU outputs by
  // the rows' weights (Megatron-Core's order: none of the experts' outputs
  // is kept for the weights' gradient), so the weights travel with the rows.
  const bool on_output = e.gate_on == GateOn::output;
  A* send_weights = !on_output               ? nullptr
                    : ep || etp_sp ? table_->get<A>("scratch.moe_row_weights")
                                   : b.moe_row_weights;
  run(kernels::MoePermuteParams<Elem>{.rows = rows, .C = C, .experts = E, .top_k = k,
                                      .capacity = e.capacity(rows), .gate = e.gate_on,
                                      .expert_of = b.moe_experts, .weights = b.moe_weights, .x = x,
                                      .out = send, .offsets = offsets, .position = position,
                                      .row_weights = send_weights},
      "moe_permute", "scratch.moe_kernels");
  // The experts' offsets on the host (moe_host): rows x k, less the choices
  // the capacity dropped.
  std::vector<int64_t> off = moe_host(offsets, E + 1);
  const int64_t routed = off[E], dropped = rows * k - routed;
  WEFT_ASSERT(routed <= e.routed_rows(rows));
  // Counted once per forward (a rebuild drops the same), by the ranks that
  // route distinct rows; a training forward's at its end (moe_forward_end).
  // The block's layer in the model, for the records and messages.
  const auto model_layer = [&] {
    const int64_t chunk = chunk_of(b.index);
    return memory::global_layer(m_, l_, plan_.stage, chunk, b.index - chunk_begin_[size_t(chunk)]);
  };
  if (!recompute && dropped > 0 && (l_.sp || groups_.tp_rank() == 0)) {
    dropped_pending_.resize(size_t(m_.layers));
    dropped_pending_[size_t(model_layer())] += dropped;
  }
  std::vector<int64_t> sent = expert_counts(off.data(), E);
  if (!recompute) {  // (take_dispatch_peaks; a rebuild routes the same rows)
    dispatch_peaks_.resize(size_t(E + 1), 0.0);
    for (int64_t d = 2; d <= E; ++d) {
      if (E % d) continue;
      int64_t most = 0;
      for (int64_t b = 0; b < E; b += E / d)
        most = std::max(most, std::accumulate(sent.begin() + b, sent.begin() + b + E / d, int64_t{0}));
      dispatch_peaks_[size_t(d)] = std::max(dispatch_peaks_[size_t(d)], double(most * d) / double(rows * k));
    }
  }
  // Expert parallelism's counts, exchanged on the host (host_groups) and
  // kept with the routing for the backward: what each ep rank sent this
  // one's experts (a2a), or every rank's counts (allgather). Under an expert
  // tp degree with sp (Megatron-Core's order) each tp rank routes and
  // dispatches its own rows, and the tp ranks then gather the rows they
  // received (with their counts, kept too), so each computes its part of
  // the width on the group's rows: the ep exchange moves 1 / tp of what
  // routing the gathered rows would.
  std::vector<int64_t> counts;
  std::vector<int64_t> received;
  int64_t rows_in = routed;
  Elem* staged = ep && etp_sp ? table_->get<Elem>("scratch.moe_staged") : nullptr;
  if (ep) {
    parallel::Comm& host_ep = *groups_.host_groups().ep;
    const int64_t El = E / l_.ep, me = host_ep.rank();
    if (l_.dispatch == MoeDispatch::a2a) {
      counts.resize(size_t(E));
      host_ep.all_to_all(sent.data(), counts.data(), El, parallel::DType::i64, kMoeCountsTag);
      std::copy(sent.begin() + me * El, sent.begin() + (me + 1) * El, counts.begin() + me * El);
    } else {
      counts.resize(size_t(l_.ep * E));
      host_ep.all_gather(sent.data(), counts.data(), E);
    }
    copy(offsets + E + 1, counts.data(), int64_t(counts.size() * sizeof(int64_t)));
    received = received_counts(counts.data(), E, l_.ep, me, l_.dispatch);
    // The receive buffers hold what --moe-imbalance allows: every ep rank
    // (and tp rank) learns whether any of them would overflow. Then all of
    // them drop every choice of this layer of the micro-batch (the capacity's
    // representation: no offsets, every position -1), so nothing is sent,
    // the step completes on every stage, and the loop leaves it without its
    // update (take_moe_overflow). A rebuild routes the same and drops again.
    int64_t most = std::accumulate(received.begin(), received.end(), int64_t{0});
    host_ep.all_reduce(&most, 1, parallel::ReduceOp::max);
    if (etp_sp) groups_.host_groups().tp->all_reduce(&most, 1, parallel::ReduceOp::max);
    if (!recompute) received_peak_ = std::max(received_peak_, double(most) / double(rows * k));
    if (most > e.received_rows(rows, l_.ep)) {
      if (!moe_overflow_) moe_overflow_ = MoeOverflow{model_layer(), most};
      for (std::vector<int64_t>* v : {&off, &sent, &counts, &received}) std::fill(v->begin(), v->end(), int64_t{0});
      copy(offsets, off.data(), int64_t(off.size() * sizeof(int64_t)));
      copy(offsets + E + 1, counts.data(), int64_t(counts.size() * sizeof(int64_t)));
      const std::vector<int64_t> none(size_t(rows * k), -1);
      copy(position, none.data(), int64_t(none.size() * sizeof(int64_t)));
    }
    rows_in = moe_exchange(sent.data(), counts.data(), send, etp_sp ? staged : b.moe_in, C, false);
  }
  WEFT_ASSERT(rows_in <= e.received_rows(rows, l_.ep));
  std::vector<int64_t> blocks;  // each tp rank's received rows' elements (etp under sp)
  if (etp_sp) {
    const std::vector<int64_t> mine = ep ? received : sent;
    received.resize(size_t(l_.tp * E));
    groups_.host_groups().tp->all_gather(mine.data(), received.data(), E);
    copy(offsets + E + 1 + int64_t(counts.size()), received.data(), int64_t(received.size() * sizeof(int64_t)));
    blocks = tp_blocks(received, l_.tp, E, C);
    groups_.tp->all_gather_v(ep ? staged : send, b.moe_in, blocks);
    rows_in = std::accumulate(blocks.begin(), blocks.end(), int64_t{0}) / C;
  }
  // The rows' weights the same way, one value a row (after the rows: under
  // etp with sp they pass through the same staging).
  if (on_output && (ep || etp_sp)) {
    A* staged_weights = reinterpret_cast<A*>(staged);
    if (ep) moe_exchange(sent.data(), counts.data(), send_weights, etp_sp ? staged_weights : b.moe_row_weights, 1, false);
    if (etp_sp)
      groups_.tp->all_gather_v(ep ? staged_weights : send_weights, b.moe_row_weights, tp_blocks(received, l_.tp, E, 1));
  }
  // Each projection of every local expert over its rows: one grouped GEMM
  // (the gate's and the up's together), as the backward's below.
  const std::vector<ExpertRun> segments = expert_rows<ExpertRun>(off.data(), received, E, l_.ep);
  // FP8 (llama_moe_fp8.cpp): the weights quantised into scratch, the rows
  // with a scale per expert and micro-batch, in place (under LoRA on the FFN
  // into scratch.moe_fp8_rows, the adapters reading the compute type).
  const bool f8 = b.fp8 && memory::moe_fp8_experts(m_, l_), sf8 = shared && b.fp8 && memory::moe_fp8_shared(m_, l_);
  Elem* wq = f8 || sf8 ? table_->get<Elem>("scratch.moe_fp8_weight") : nullptr;
  if (wq) moe_fp8_weights(b, wq);
  const Elem* experts_w = f8 ? wq : b.w_experts;
  Elem* copies = moe_fp8_copies(f8 || sf8);
  const auto quantised = [&](int gemm, Elem* x, int64_t width) {
    return f8 ? moe_fp8_rows(b, gemm, x, copies ? copies : x, width, segments, etp_sp, 0) : x;
  };
  const Elem* in = quantised(0, b.moe_in, C);
  std::vector<kernels::GemmParams<Elem>> gemms;
  for (const ExpertRun& r : segments) {
    const Elem* w = experts_w + r.expert * stride;
    gemms.push_back(kernels::linear_forward_gemm(r.rows, C, Fe, in + r.offset * C, w, b.moe_gate + r.offset * Fe));
    gemms.push_back(
        kernels::linear_forward_gemm(r.rows, C, Fe, in + r.offset * C, w + Fe * C, b.moe_up + r.offset * Fe));
  }
  run(grouped(gemms), "gemm experts gate up");
  if (b.lora_experts && params_.expert_gate_up) moe_lora_gate_up(b, segments);
  run(kernels::SwigluForwardParams<Elem>{.rows = rows_in, .F = Fe, .gate = b.moe_gate, .up = b.moe_up,
                                         .act = b.moe_act, .row_scale = on_output ? b.moe_row_weights : nullptr},
      "swiglu_forward");
  const Elem* act = quantised(2, b.moe_act, Fe);
  // The experts' outputs, in this rank's expert order, for the combine only
  // (from scratch; a rebuild needs none). Under expert parallelism they are
  // computed where the rows went and come back.
  Elem* out = table_->get<Elem>("scratch.moe_d_rows");
  if (!recompute) {
    Elem* computed = ep || etp_sp ? table_->get<Elem>("scratch.moe_received") : out;
    gemms.clear();
    for (const ExpertRun& r : segments)
      gemms.push_back(kernels::linear_forward_gemm(r.rows, Fe, C, act + r.offset * Fe,
                                                   experts_w + r.expert * stride + 2 * Fe * C,
                                                   computed + r.offset * C));
    run(grouped(gemms), "gemm experts down");
    if (b.lora_experts && params_.expert_down) moe_lora_down(b, segments, computed);
    // An expert tp degree: each tp rank's part of the width gave a partial
    // output of the same rows, summed over tp (under sp each tp rank's own
    // received rows' sums come back to it).
    if (etp_sp) {
      groups_.tp->reduce_scatter_v(computed, ep ? staged : out, blocks);
      if (ep) moe_exchange(sent.data(), counts.data(), staged, out, C, true);
    } else {
      if (l_.etp > 1) groups_.tp->all_reduce(computed, rows_in * C);
      if (ep) moe_exchange(sent.data(), counts.data(), computed, out, C, true);
    }
  }
  if (shared) {
    // Column- then row-parallel over all rows, as a dense FFN.
    const int64_t Fs = e.shared_intermediate / l_.tp;
    // Under FP8 its weights follow the routed experts' in wq, its input
    // quantised as the dense FFN's.
    const Elem* ws = sf8 ? wq + (f8 ? 3 * (E / l_.ep) * Fe * C : 0) : nullptr;
    const Elem* xs = x_all;
    if (sf8) xs = moe_fp8_shared_input(b, x_all);
    run(kernels::linear_forward_gemm(M_, C, Fs, xs, sf8 ? ws : b.w_sg, b.sh_gate), "gemm shared gate");
    lora_forward(b, Linear::gate, x_all, b.sh_gate, C, Fs);
    run(kernels::linear_forward_gemm(M_, C, Fs, xs, sf8 ? ws + Fs * C : b.w_su, b.sh_up), "gemm shared up");
    lora_forward(b, Linear::up, x_all, b.sh_up, C, Fs);
    run(kernels::SwigluForwardParams<Elem>{.rows = M_, .F = Fs, .gate = b.sh_gate, .up = b.sh_up,
                                           .act = b.sh_act},
        "swiglu_forward");
    const Elem* act_s = b.sh_act;
    if (sf8) {
      Elem* q = copies ? copies : b.sh_act;
      fp8_quantize(b, Fp8Gemm::down, 0, b.sh_act, M_, Fs, false, q);
      act_s = q;
    }
    if (!recompute) {
      run(kernels::linear_forward_gemm(M_, Fs, C, act_s, sf8 ? ws + 2 * Fs * C : b.w_sd, y), "gemm shared down");
      lora_forward(b, Linear::down, b.sh_act, y, Fs, C);
      reduce_rows(y);  // this rank's rows first under sp
    }
  }
  if (recompute) return;
  // The weights applied already (on the input by the permute, on the output
  // by the experts' SwiGLU): the combine is the plain sum.
  run(kernels::MoeUnpermuteParams<Elem>{.rows = rows, .C = C, .top_k = k, .gate = GateOn::input,
                                        .position = position, .y = out, .out = y,
                                        .write = shared ? Write::accumulate : Write::overwrite},
      "moe_unpermute");
}

template <typename Elem, typename G>
std::vector<int64_t> LlamaStage<Elem, G>::moe_host(const int64_t* src, int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  copy(out.data(), src, n * int64_t(sizeof(int64_t)));
  if (on_device()) memory::synchronize(stream_);
  return out;
}

#define WEFT_LLAMA_MOE(E, G)                                                                  \
  template void LlamaStage<E, G>::moe_forward(const Block&, E*, bool);                        \
  template std::vector<int64_t> LlamaStage<E, G>::moe_host(const int64_t*, int64_t);
WEFT_LLAMA_MOE(float, float)
WEFT_LLAMA_MOE(double, double)
WEFT_LLAMA_MOE(kernels::bf16, float)
WEFT_LLAMA_MOE(kernels::bf16, kernels::bf16)

}  // namespace weft::trainer
