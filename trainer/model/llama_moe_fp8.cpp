// FP8 in an MoE block's FFN (Layout::fp8, tensorwise): the routed
// experts' three GEMMs and the shared expert's, emulated on the CPU as
// llama_fp8.cpp's are (each operand quantised and dequantised with its
// scale, the fp32 GEMMs multiplying those). The router's GEMM stays in the
// compute precision, as Megatron-Core keeps it.
//
// Scales. Each weight has its own, from its amax (reduced over tp where the
// tp ranks split it: an expert tp degree, the shared expert). Each expert's
// activations and output gradients have one per micro-batch: the amax of
// that micro-batch's rows routed to the expert, wherever they were
// computed. That is what one rank computing the micro-batch takes, so every
// layout quantises as it does. Megatron-Core's grouped GEMMs (Transformer
// Engine's) take one scale per expert over all the rows an ep rank
// received, from every micro-batch of its ep group, so their numerics move
// with the layout; weft's do not.
//
// The rows of micro-batch k for expert e lie only with the ranks holding e
// (one per ep group, and under etp or sp with etp1 the tp ranks beside it),
// so an amax table (dp ranks x E) filled with this rank's runs, by the dp
// rank of the run's sender, and reduced (max) over tp and dp x cp gives
// every run its micro-batch's amax. Two small all-reduces per quantised
// tensor: the emulation's price for exact parity, not a GPU design.
//
// The experts' inputs and SwiGLU outputs are quantised in place, so the
// weight gradients multiply the values the forward did (as the FP8 inputs
// Transformer Engine keeps for them); the output gradients too (the dgrad's
// and the wgrad's operand). The shared expert runs over all the rows on
// every tp rank, as the dense FFN, and quantises as the dense FFN's GEMMs
// (fp8_quantize: its input and output gradient into scratch.fp8_input and
// scratch.fp8_grad, its SwiGLU output and its gate's and up's output
// gradients in place).
//
// Block scaling (fp8:blockwise) takes a scale per tile from the tile
// alone: 128 x 128 blocks of each weight (each inside one rank's part),
// 1 x 128 along each row, and for the weight gradients 128 x 1 down an
// expert's rows of one micro-batch in sequence order, as one rank takes
// them. Without sp and cp those rows are one run. Under sp or cp they come
// from several senders (each tp rank routes its own rows, each cp rank
// holds two pieces of every sequence): moe_token_tiles places each row
// received at its index among them (moe_rows::token_tiles), and
// fp8_token_tiles reduces each tile's column maxima over the ranks
// holding its rows (as magnitude bits, by an integer max, so a NaN
// stays above infinity) before quantising; the shared expert's tiles under
// cp likewise (shared_token_tiles).
//
// Under LoRA on the FFN the adapters read the compute-type values, as a
// dense FFN's do (its GEMMs quantise into scratch), so what is quantised in
// place otherwise goes to scratch.moe_fp8_rows (memory::moe_fp8_row_copies),
// one operand at a time, just before the base GEMMs that read it. The base
// is frozen there, so no weight gradient reads those values later.
#include <algorithm>
#include <array>
#include <utility>

#include "kernels/fp8/fp8.h"
#include "trainer/model/llama_moe_rows.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using namespace fp8_detail;

template <typename Elem, typename G>
void LlamaStage<Elem, G>::moe_fp8_weights(const Block& b, Elem* out) {
  if constexpr (!std::is_same_v<Elem, float>) {
    (void)b;
    (void)out;
    throw InternalError("FP8 MoE blocks outside the CPU trainer");
  } else {
    const MoeSpec& e = m_.moe;
    const int64_t C = m_.hidden, El = e.experts / l_.ep, Fe = e.expert_intermediate / l_.etp;
    const int64_t Fs = e.shared_intermediate / l_.tp;
    const bool routed = memory::moe_fp8_experts(m_, l_), shared = memory::moe_fp8_shared(m_, l_);
    // (pointer, elements, rows, reduced over tp, delayed scaling's slot) of
    // each weight, routed first: local expert i / 3's gate, up and down.
    struct Weight {
      const Elem* w;
      Elem* q;
      int64_t n, rows;
      bool tp;
      float* state;
    };
    std::vector<Weight> ws;
    const int64_t first = groups_.ep_rank() * El;
    if (routed)
      for (int64_t i = 0; i < 3 * El; ++i)
        ws.push_back({b.w_experts + i * Fe * C, out + i * Fe * C, Fe * C, i % 3 == 2 ? C : Fe, l_.etp > 1,
                      fp8_expert_state(b, first + i / 3, int(i % 3), 1)});
    if (shared) {
      Elem* q = out + (routed ? 3 * El * Fe * C : 0);
      using memory::Fp8Gemm;
      const std::array<std::pair<const Elem*, Fp8Gemm>, 3> parts{
          {{b.w_sg, Fp8Gemm::gate}, {b.w_su, Fp8Gemm::up}, {b.w_sd, Fp8Gemm::down}}};
      for (const auto& [w, g] : parts) {
        ws.push_back({w, q, Fs * C, g == Fp8Gemm::down ? C : Fs, true, fp8_state(b, g, 1)});
        q += Fs * C;
      }
    }
    if (l_.fp8 == Fp8Recipe::blockwise) {
      // A scale per 128 x 128 block, from the block alone: every block lies
      // inside one rank's part (moe_fp8_experts: multiples of 128).
      for (const Weight& w : ws) {
        const kernels::Fp8Health h = kernels::fp8_qdq_tiles(w.w, w.q, w.rows, w.n / w.rows, kFp8BlockTile,
                                                            kFp8BlockTile, kernels::Fp8Format::e4m3);
        fp8_counts_.values += w.n;
        fp8_counts_.overflow += h.overflow;
        fp8_counts_.underflow += h.underflow;
      }
      return;
    }
    std::vector<float> amax(ws.size()), split(ws.size(), 0.0f);
    for (size_t i = 0; i < ws.size(); ++i) {
      amax[i] = reducible(kernels::fp8_amax(ws[i].w, ws[i].n));
      if (ws[i].tp) split[i] = amax[i];
      // Delayed: the step's amax of this rank's part (fp8_step_end reduces it).
      if (ws[i].state) ws[i].state[kStepAmax] = std::max(ws[i].state[kStepAmax], amax[i]);
    }
    // Delayed scaling past its first step takes the history's scales;
    // otherwise the split weights' amaxes over tp (the whole ones' stay
    // their own).
    const bool history = fp8_scaling_ && fp8_history_len_ > 0;
    parallel::Comm& tp = *groups_.host_groups().tp;
    if (tp.size() > 1 && !history) {
      tp.all_reduce(split.data(), int64_t(split.size()), parallel::DType::f32, parallel::ReduceOp::max);
      for (size_t i = 0; i < ws.size(); ++i)
        if (ws[i].tp) amax[i] = split[i];
    }
    for (size_t i = 0; i < ws.size(); ++i) {
      const float scale = history ? ws[i].state[kScale] : kernels::fp8_scale(amax[i], kernels::Fp8Format::e4m3);
      const kernels::Fp8Health h = kernels::fp8_qdq(ws[i].w, ws[i].q, ws[i].n, scale, kernels::Fp8Format::e4m3);
      fp8_counts_.values += ws[i].n;
      fp8_counts_.overflow += h.overflow;
      fp8_counts_.underflow += h.underflow;
    }
  }
}

template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::moe_fp8_rows(const Block& b, int gemm, const Elem* x, Elem* out, int64_t width,
                                        std::span<const ExpertRun> runs, bool etp_sp, int role,
                                        const TokenTiles* over_tokens) {
  if constexpr (!std::is_same_v<Elem, float>) {
    (void)b, (void)gemm, (void)x, (void)out, (void)width, (void)runs, (void)etp_sp, (void)role, (void)over_tokens;
    throw InternalError("FP8 MoE blocks outside the CPU trainer");
  } else {
    if (l_.fp8 == Fp8Recipe::blockwise) {
      // Tiles down the tokens that lie apart (sp, cp): where moe_token_tiles says.
      if (over_tokens && over_tokens->apart) {
        fp8_token_tiles(x, out, width, *over_tokens);
        return out;
      }
      // A scale per tile, from the tile alone, within each run: 1 x 128
      // along a row, or for a weight gradient 128 x 1 down the run's rows.
      const int64_t tile_rows = over_tokens ? kFp8BlockTile : 1, tile_cols = over_tokens ? 1 : kFp8BlockTile;
      for (const ExpertRun& r : runs) {
        const int64_t o = r.offset * width;
        const kernels::Fp8Health h =
            kernels::fp8_qdq_tiles(x + o, out + o, r.rows, width, tile_rows, tile_cols, kernels::Fp8Format::e4m3);
        fp8_counts_.values += r.rows * width;
        fp8_counts_.overflow += h.overflow;
        fp8_counts_.underflow += h.underflow;
      }
      return out;
    }
    WEFT_ASSERT(!over_tokens);
    const int64_t E = m_.moe.experts, first = groups_.ep_rank() * (E / l_.ep);
    const kernels::Fp8Format f = format_of(role);
    if (fp8_scaling_) {
      // Delayed: each run's amax joins its expert's step amax, over every
      // micro-batch and rank (fp8_step_end), and past the first step the
      // rows take the history's scale, with no exchange.
      for (const ExpertRun& r : runs) {
        float* st = fp8_expert_state(b, first + r.expert, gemm, role);
        st[kStepAmax] = std::max(st[kStepAmax], reducible(kernels::fp8_amax(x + r.offset * width, r.rows * width)));
      }
      if (fp8_history_len_ > 0) {
        for (const ExpertRun& r : runs) {
          const int64_t at = r.offset * width;
          const float scale = fp8_expert_state(b, first + r.expert, gemm, role)[kScale];
          const kernels::Fp8Health h = kernels::fp8_qdq(x + at, out + at, r.rows * width, scale, f);
          fp8_counts_.values += r.rows * width;
          fp8_counts_.overflow += h.overflow;
          fp8_counts_.underflow += h.underflow;
        }
        return out;
      }
    }
    // Current scaling (tensorwise, and delayed's first step): per expert
    // and micro-batch, as one rank computing the micro-batch takes it.
    const auto& host = groups_.host_groups();
    // The senders' micro-batches: each sender's dp rank (under etp with sp
    // a tp rank's ep group is this one's beside it: the same dp ranks).
    const std::vector<moe_rows::TokenSender>& senders = moe_senders(etp_sp);
    const int64_t D = groups_.dp->size();
    std::vector<float> amax(size_t(D * E), 0.0f);
    const auto at = [&](const ExpertRun& r) -> float& {
      WEFT_ASSERT(r.source < int64_t(senders.size()));
      return amax[size_t(senders[size_t(r.source)][0] * E + first + r.expert)];
    };
    for (const ExpertRun& r : runs) at(r) = std::max(at(r), reducible(kernels::fp8_amax(x + r.offset * width, r.rows * width)));
    for (parallel::Comm* g : {host.tp, host.dpcp})
      if (g && g->size() > 1) g->all_reduce(amax.data(), D * E, parallel::DType::f32, parallel::ReduceOp::max);
    for (const ExpertRun& r : runs) {
      const int64_t o = r.offset * width;
      const kernels::Fp8Health h = kernels::fp8_qdq(x + o, out + o, r.rows * width, kernels::fp8_scale(at(r), f), f);
      fp8_counts_.values += r.rows * width;
      fp8_counts_.overflow += h.overflow;
      fp8_counts_.underflow += h.underflow;
    }
    return out;
  }
}

template <typename Elem, typename G>
moe_rows::TokenGeometry LlamaStage<Elem, G>::token_geometry() const {
  return {.seq = run_.seq, .cp = l_.cp, .mb = l_.mb, .local = M_, .sender = Msp_};
}

template <typename Elem, typename G>
const std::vector<moe_rows::TokenSender>& LlamaStage<Elem, G>::moe_senders(bool etp_sp) {
  if (moe_senders_.empty()) {
    const moe_rows::TokenSender me{groups_.dp_rank(), groups_.cp_rank(), l_.sp ? groups_.tp_rank() : 0};
    std::vector<moe_rows::TokenSender> ep(size_t(l_.ep), me);
    if (l_.ep > 1) groups_.host_groups().ep->all_gather(me.data(), ep.front().data(), 3);
    for (int64_t p = 0; p < (etp_sp ? l_.tp : 1); ++p)
      for (moe_rows::TokenSender s : ep) {
        if (etp_sp) s[2] = p;
        moe_senders_.push_back(s);
      }
  }
  return moe_senders_;
}

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::TokenTiles LlamaStage<Elem, G>::moe_token_tiles(const Block& b,
                                                                              std::span<const ExpertRun> runs,
                                                                              int64_t rows_in, bool etp_sp) {
  TokenTiles t;
  if (!l_.sp && l_.cp == 1) return t;
  t.apart = true;
  const int64_t E = m_.moe.experts, D = groups_.dp->size();
  const auto& host = groups_.host_groups();
  const moe_rows::TokenGeometry g = token_geometry();
  const moe_rows::TokenSender me{groups_.dp_rank(), groups_.cp_rank(), l_.sp ? groups_.tp_rank() : 0};
  // This rank's counts, then the other senders' from the ranks beside it (a
  // max: every unit is one sender's, or without sp the same on every tp rank).
  std::vector<int64_t> n(size_t(D * E * g.units()), 0);
  moe_rows::count_token_units(g, me, b.moe_routing, b.moe_experts, m_.moe.top_k, E, n);
  for (parallel::Comm* c : {host.tp, host.dpcp})
    if (c && c->size() > 1) c->all_reduce(n.data(), int64_t(n.size()), parallel::DType::i64, parallel::ReduceOp::max);
  t.of_row.assign(size_t(rows_in), 0);
  t.count = moe_rows::token_tiles(g, n, D, E, kFp8BlockTile, runs, moe_senders(etp_sp), groups_.ep_rank() * (E / l_.ep),
                                  t.of_row);
  // Under an expert tp degree the tp ranks hold the same rows and split
  // their width: the column maxima stay apart.
  if (l_.etp == 1 && host.tp->size() > 1) t.over.push_back(host.tp);
  if (host.dpcp && host.dpcp->size() > 1) t.over.push_back(host.dpcp);
  return t;
}

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::TokenTiles LlamaStage<Elem, G>::shared_token_tiles() const {
  TokenTiles t;
  t.apart = true;
  const moe_rows::TokenGeometry g = token_geometry();
  const int64_t c = groups_.cp_rank();
  t.of_row.resize(size_t(M_));
  for (int64_t L = 0; L < M_; ++L) t.of_row[size_t(L)] = g.position(L, c) / kFp8BlockTile;
  t.count = (l_.mb * run_.seq + kFp8BlockTile - 1) / kFp8BlockTile;
  if (groups_.host_groups().cp) t.over.push_back(groups_.host_groups().cp);
  return t;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_token_tiles(const Elem* x, Elem* out, int64_t width, const TokenTiles& t) {
  if constexpr (!std::is_same_v<Elem, float>) {
    (void)x, (void)out, (void)width, (void)t;
    throw InternalError("FP8 MoE blocks outside the CPU trainer");
  } else {
    const auto rows = int64_t(t.of_row.size());
    std::vector<int32_t> table(size_t(t.count * width), 0);
    kernels::fp8_column_amax(x, rows, width, t.of_row.data(), table.data());
    for (parallel::Comm* g : t.over)
      if (g->size() > 1)
        g->all_reduce(table.data(), int64_t(table.size()), parallel::DType::i32, parallel::ReduceOp::max);
    const kernels::Fp8Health h = kernels::fp8_qdq_column_tiles(x, out, rows, width, t.of_row.data(), table.data(),
                                                               t.count, kernels::Fp8Format::e4m3);
    fp8_counts_.values += rows * width;
    fp8_counts_.overflow += h.overflow;
    fp8_counts_.underflow += h.underflow;
  }
}

template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::moe_fp8_copies(bool fp8) const {
  return fp8 && memory::moe_fp8_row_copies(m_, run_.lora, l_) ? table_->get<Elem>("scratch.moe_fp8_rows") : nullptr;
}

template <typename Elem, typename G>
Elem* LlamaStage<Elem, G>::moe_fp8_wgrad_scratch(bool fp8) const {
  return fp8 && memory::moe_fp8_wgrad_tiles(m_, run_.lora, l_) ? table_->get<Elem>("scratch.moe_fp8_wgrad") : nullptr;
}

template <typename Elem, typename G>
const Elem* LlamaStage<Elem, G>::moe_fp8_shared_input(const Block& b, const Elem* x) {
  fp8_quantize(b, memory::Fp8Gemm::gate, 0, x, M_, m_.hidden, false, fp8_input_);
  fp8_input_of_ = nullptr;  // not a dense GEMM's input
  return fp8_input_;
}

template <typename Elem, typename G>
const Elem* LlamaStage<Elem, G>::moe_fp8_shared_grad(const Block& b, const Elem* dy) {
  fp8_quantize(b, memory::Fp8Gemm::down, 2, dy, M_, m_.hidden, false, fp8_grad_);
  fp8_grad_of_ = nullptr;
  return fp8_grad_;
}

#define WEFT_LLAMA_MOE_FP8(E, G)                                         \
  template void LlamaStage<E, G>::moe_fp8_weights(const Block&, E*); \
  template E* LlamaStage<E, G>::moe_fp8_rows(const Block&, int, const E*, E*, int64_t, std::span<const ExpertRun>, \
                                             bool, int, const TokenTiles*);                                  \
  template typename LlamaStage<E, G>::TokenTiles LlamaStage<E, G>::moe_token_tiles(                         \
      const Block&, std::span<const ExpertRun>, int64_t, bool);                                             \
  template typename LlamaStage<E, G>::TokenTiles LlamaStage<E, G>::shared_token_tiles() const; \
  template void LlamaStage<E, G>::fp8_token_tiles(const E*, E*, int64_t, const TokenTiles&); \
  template moe_rows::TokenGeometry LlamaStage<E, G>::token_geometry() const; \
  template const std::vector<moe_rows::TokenSender>& LlamaStage<E, G>::moe_senders(bool); \
  template E* LlamaStage<E, G>::moe_fp8_wgrad_scratch(bool) const;                                \
  template E* LlamaStage<E, G>::moe_fp8_copies(bool) const;                                      \
  template const E* LlamaStage<E, G>::moe_fp8_shared_input(const Block&, const E*);              \
  template const E* LlamaStage<E, G>::moe_fp8_shared_grad(const Block&, const E*);
WEFT_LLAMA_MOE_FP8(float, float)
WEFT_LLAMA_MOE_FP8(double, double)
WEFT_LLAMA_MOE_FP8(kernels::bf16, float)
WEFT_LLAMA_MOE_FP8(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_MOE_FP8

}  // namespace weft::trainer
