// The block pieces of the cost model (tuner/cost_parts.h): the collectives
// on a cluster's links, a block's compute and communication for one
// micro-batch, and its recomputation (the stages: cost_stage.cpp).
#include "tuner/cost_parts.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/flops.h"

namespace weft::tuner::cost_parts {

double ring_all_reduce(double bytes, int64_t n, Link link) {
  if (n <= 1) return 0;
  return 2.0 * double(n - 1) / double(n) * bytes / link.bandwidth + 2.0 * double(n - 1) * link.latency;
}
double ring_all_gather(double bytes_full, int64_t n, Link link) {
  if (n <= 1) return 0;
  return double(n - 1) / double(n) * bytes_full / link.bandwidth + double(n - 1) * link.latency;
}

double all_reduce(double bytes, const Group& g) {
  if (auto t = g.measured("all_reduce", bytes)) return *t;
  if (g.outer() <= 1) return ring_all_reduce(bytes, g.n, g.intra);
  return 2 * ring_all_gather(bytes, g.inner, g.intra) +
         ring_all_reduce(bytes / double(g.inner), g.outer(), g.inter);
}
double hierarchical_gather(double bytes_full, const Group& g) {
  if (g.outer() <= 1) return ring_all_gather(bytes_full, g.n, g.intra);
  return ring_all_gather(bytes_full, g.inner, g.intra) +
         ring_all_gather(bytes_full / double(g.inner), g.outer(), g.inter);
}
double all_gather(double bytes_full, const Group& g) {
  if (auto t = g.measured("all_gather", bytes_full)) return *t;
  return hierarchical_gather(bytes_full, g);
}
double reduce_scatter(double bytes_full, const Group& g) {
  if (auto t = g.measured("reduce_scatter", bytes_full)) return *t;
  return hierarchical_gather(bytes_full, g);
}
// Each rank sends (n - 1) / n of its `bytes_local` to the others, a slice to
// each; within one NVLink domain over NVLink, across domains the slices for
// ranks in this domain over NVLink and the rest over the network at the same
// time, so the slower of the two.
double all_to_all(double bytes_local, const Group& g) {
  if (g.n <= 1) return 0;
  if (auto t = g.measured("all_to_all", bytes_local)) return *t;
  const double n = double(g.n);
  if (g.outer() <= 1) return (n - 1) / n * bytes_local / g.intra.bandwidth + (n - 1) * g.intra.latency;
  const double near = double(g.inner - 1) / n * bytes_local / g.intra.bandwidth;
  const double far = (n - double(g.inner)) / n * bytes_local / g.inter.bandwidth;
  return std::max(near, far) + (n - 1) * g.inter.latency;
}

AttentionTime attention_time(const Model& x, double B, double Hl, double Kl, double T, double D) {
  const Layout& l = x.l;
  const double cp = double(l.cp), a = x.a;
  AttentionTime at;
  if (l.attention != AttentionKind::materialized) {
    // Flash skips fully masked key blocks: half of the 4 B Hl T^2 D FLOPs;
    // the backward does 2.5x the forward's matmul work. cuDNN's fused SDPA
    // (cudnn) is the same tiled algorithm with an efficiency of its own: on
    // Hopper it runs 1.8x PyTorch's flash backend and 2.5x weft's sm_80 flash
    // kernel (measured on an H200, benchmarks/RESULTS.md). Under context
    // parallelism each rank holds chunks r and 2 cp - 1 - r of 2 cp, which
    // balances the causal work: 1/cp of it on every rank, whatever the
    // transport (ring: its chunks against each block of keys in turn;
    // all-gather: against the keys up to their end; all-to-all: the whole
    // sequence on H/cp heads).
    // Chunked layers (Llama 4's RoPE layers past the chunk) visit only the
    // pairs within chunks, as the CPU kernels do (the GPU's do not attend
    // within chunks yet, and the trainer refuses such a run there): their
    // fraction of the causal pairs, averaged over the layers (core/flops.h).
    // The cp ranks' shares of them are then no longer equal (a late chunk
    // sees no more keys than an early one); that imbalance is not priced.
    const double flops = 4.0 * B * Hl * T * T * D * 0.5 / cp * attention_pair_fraction(x.m, x.run.seq);
    // Efficiency grows with the keys each query tile runs over in one call
    // (CostConstants::attention_t_half, whose T is a causal call's: T / 2
    // keys on average): the ring's calls are blocks of T / 2cp queries
    // against as many keys (a causal call of T / cp); all-gather runs its
    // chunks against their key prefixes and all-to-all the whole sequence
    // (T).
    const double run = l.cp > 1 && l.cp_comm == CpComm::ring ? T / cp : T;
    const double eff = (l.attention == AttentionKind::cudnn ? x.k.cudnn_efficiency : x.k.flash_efficiency) * run /
                       (run + x.k.attention_t_half);
    at.fwd = flops / (x.peak * eff) + x.k.launch_overhead;
    at.bwd = 2.5 * flops / (x.peak * eff) + x.k.launch_overhead;
    // cuDNN writes its gradients, and the ring's and the all-gather's blocks
    // accumulate theirs (kernels/attention/attention.cu): an add (read both,
    // write one) over each block's dK and dV, and the ring's dQ, follows each
    // backward call; 2 cp + 1 blocks of c = T / 2cp rows a rank, whose keys
    // (the all-gather's prefixes) sum to (2 cp + 1) c too.
    if (l.attention == AttentionKind::cudnn && l.cp > 1 && l.cp_comm != CpComm::a2a) {
      const bool ring = l.cp_comm == CpComm::ring;
      const double c = T / (2 * cp), blocks = 2 * cp + 1;
      at.bwd += x.stream_bytes(3 * a * blocks * B * c * ((ring ? Hl : 0.0) + 2 * Kl) * D) +
                ((ring ? 3 : 2) * blocks - 1) * x.k.launch_overhead;
    }
  } else {
    // Batched QK^T and PV over the rows against their keys, and a fused
    // scale-mask-softmax that reads the scores and writes the probabilities.
    // Without context parallelism the full T x T; with all-to-all the same on
    // H/cp heads; with all-gather each of the two chunks of c = T / 2cp rows
    // against its key prefix, (2 cp + 1) c keys between them (the ring
    // refuses materialized).
    auto bgemm = [&](double bh, double Mi, double Ni, double Ki) {
      return bh * 2.0 * Mi * Ni * Ki / (x.peak * gemm_efficiency(Mi, Ni, Ki, x.c.device, x.k)) +
             x.k.launch_overhead;
    };
    if (l.cp == 1 || l.cp_comm == CpComm::a2a) {
      const double bh = B * Hl / cp, scores = bh * T * T;
      at.fwd = bgemm(bh, T, T, D) + bgemm(bh, T, D, T) + x.stream_bytes(2 * a * scores);
      at.bwd = bgemm(bh, T, T, D) + 3 * bgemm(bh, T, D, T) + x.stream_bytes(3 * a * scores);
    } else {
      const double bh = B * Hl, c = T / (2 * cp), keys = (cp + 0.5) * c, scores = bh * 2 * c * keys;
      at.fwd = 2 * (bgemm(bh, c, keys, D) + bgemm(bh, c, D, keys)) + x.stream_bytes(2 * a * scores);
      at.bwd = 2 * (bgemm(bh, c, keys, D) + 3 * bgemm(bh, c, D, keys)) + x.stream_bytes(3 * a * scores);
    }
  }
  if (x.rates) {
    // Measured calls: all-to-all's is one call of the whole sequence on
    // H/cp heads; the others' are 1/cp of the whole sequence's.
    const char* kind = to_string(l.attention);
    const bool heads = l.cp > 1 && l.cp_comm == CpComm::a2a;
    const double h = heads ? Hl / cp : Hl, kv = heads ? Kl / cp : Kl, share = heads ? 1 : 1 / cp;
    if (auto f = x.rates->attention_seconds(kind, false, B, h, kv, T, D)) at.fwd = *f * share;
    if (auto b = x.rates->attention_seconds(kind, true, B, h, kv, T, D)) at.bwd = *b * share;
  }
  return at;
}

// Communication that compute hides still costs: the kernels that move it
// take SMs and memory bandwidth from the compute they overlap.
double exposed_beside(double transfer, double compute, const CostConstants& k) {
  return std::max(0.0, transfer - compute) + k.overlap_cost * std::min(transfer, compute);
}

namespace {

// One block's time for one micro-batch, nothing recomputed: a dense block,
// or with x.moe an MoE one.
Part one_block_cost(const Model& x);

}  // namespace

// An MoE model's block is the mean of its MoE and dense blocks, weighted by
// how many of the model's layers each is (interleaved layers spread them
// over the stages alike).
Part block_cost(const Model& x) {
  const ModelSpec& m = x.m;
  if (!m.moe.enabled()) return one_block_cost(x);
  Model moe = x;
  moe.moe = true;
  const Part pm = one_block_cost(moe);
  const int64_t n = m.moe_layers();
  if (n == m.layers) return pm;
  Model dense = x;
  dense.moe = false;
  return mix(pm, one_block_cost(dense), double(n) / double(m.layers));
}

namespace {

Part one_block_cost(const Model& x) {
  const ModelSpec& m = x.m;
  const Layout& l = x.l;
  const double t = double(l.tp), B = double(l.mb), T = double(x.run.seq), cp = double(l.cp);
  const double C = double(m.hidden), D = double(m.head_dim);
  const double Hl = double(m.heads) / t, Kl = double(m.kv_heads) / t, Fl = double(m.intermediate) / t;
  // Every GEMM and streaming kernel sees this rank's T / cp tokens.
  const double Tl = T / cp;
  const double M = B * Tl, Msp = l.sp ? M / t : M, a = x.a;

  const AttentionTime at = attention_time(x, B, Hl, Kl, T, D);
  const double attn_fwd = at.fwd, attn_bwd = at.bwd;

  const double rope = x.stream("rope", M, (Hl + Kl) * D);
  const double resid = x.stream("residual", Msp, C);
  Part p;
  // The trainer runs q, k and v, and gate and up, as separate GEMMs (their
  // weights are separate Hugging Face tensors), so they are priced apart:
  // three narrow GEMMs reach a lower efficiency than one wide one.
  const double qkv_fwd = x.block_linear_fwd(M, Hl * D, C) + 2 * x.block_linear_fwd(M, Kl * D, C);
  const double qkv_bwd = x.block_linear_bwd(M, Hl * D, C) + 2 * x.block_linear_bwd(M, Kl * D, C);

  // FP8 blocks cast each linear's input once per micro-batch (q, k and v
  // share the attention norm's output, gate and up the MLP norm's) and each
  // output gradient in the backward, as fp8_cast prices them; under
  // tensorwise scaling each cast waits for its amax all-reduce over tp * cp
  // (counted with the tensor-parallel time, in the forward where it is redone
  // with it). The weights' casts are once per step (sharding_cost).
  const auto cast_if = [&](bool on, double elements) { return on ? x.fp8_cast(elements) : 0.0; };
  // (An MoE block has no dense FFN: its experts' casts are its own, below.)
  const bool qkv8 = x.in_fp8(M, Hl * D, C), o8 = x.in_fp8(M, C, Hl * D), up8 = !x.moe && x.in_fp8(M, Fl, C),
             down8 = !x.moe && x.in_fp8(M, C, Fl);
  const double attn_cast = cast_if(qkv8, M * C), mlp_cast = cast_if(up8, M * C);
  const double casts_fwd = attn_cast + cast_if(o8, M * Hl * D) + mlp_cast + cast_if(down8, M * Fl);
  double casts_bwd = cast_if(qkv8, M * (Hl + 2 * Kl) * D) + cast_if(o8, M * C) + cast_if(up8, 2 * M * Fl) +
                     cast_if(down8, M * C);
  // Emulated block scaling quantises every input and output gradient once
  // more for the weight gradients, with tiles down the tokens (on FP8
  // hardware one pass writes both layouts, which fp8_cast counts).
  if (x.l.fp8 == Fp8Recipe::blockwise && !x.c.device.has_fp8()) casts_bwd += casts_fwd + casts_bwd;
  const double amax = x.fp8_amax_reduce();
  double amax_fwd = amax * (int(qkv8) + int(o8) + int(up8) + int(down8));
  double amax_bwd = amax * (3 * int(qkv8) + int(o8) + 2 * int(up8) + int(down8));

  double mlp_pre_lora = 0;
  const double attn_pre = x.norm_fwd(Msp) + attn_cast + qkv_fwd + rope;
  // The tp-split part of the FFN's width (an MoE block's shared expert's;
  // 0: none).
  double split_width = Fl, mlp_pre = 0;
  // An MoE block's local experts and each one's rows (LoRA's below).
  double local_experts = 0, expert_rows = 0;
  if (!x.moe) {
    mlp_pre = x.norm_fwd(Msp) + mlp_cast + 2 * x.block_linear_fwd(M, Fl, C) + x.stream("swiglu_fwd", M, Fl);
    p.fwd = attn_pre + attn_fwd + x.block_linear_fwd(M, C, Hl * D) + resid + mlp_pre + x.block_linear_fwd(M, C, Fl) +
            resid + (casts_fwd - attn_cast - mlp_cast);
    p.bwd = x.norm_bwd(Msp) + qkv_bwd + rope + attn_bwd + x.block_linear_bwd(M, C, Hl * D) + resid + x.norm_bwd(Msp) +
            2 * x.block_linear_bwd(M, Fl, C) + x.stream("swiglu_bwd", M, Fl) + x.block_linear_bwd(M, C, Fl) + resid +
            casts_bwd;
  } else {
    // An MoE block (trainer/model/llama_moe.cpp): the router and routing
    // over the norm region's rows, the permutation, each expert's three
    // GEMMs over its share of the rows x k choices (the mean expert, or
    // under ep the stated imbalance's; fewer rows each lower the GEMMs'
    // efficiency), the combine,
    // and the shared expert split over tp like a dense FFN. Its input side
    // (to SwiGLU, and the shared expert's) is what ffn checkpointing redoes.
    // A capacity below the balanced share (factor < 1) caps each expert's
    // rows; balanced routing drops nothing at 1 or more.
    //
    // Under expert parallelism (ep ranks) each rank's E / ep experts take
    // the rows every ep rank routed to them: balanced, as many rows as the
    // rank routed, ep times as many per expert. The rows go out and their
    // outputs come back over the ep group, and again for the gradients in
    // the backward: by all-to-all, or all-gathered (every rank's rows) and
    // reduce-scattered back; the trainer waits for each (exposed). The
    // dispatch is part of what ffn checkpointing redoes.
    const MoeSpec& e = m.moe;
    // (Fe: this rank's share of each expert's width under an expert tp
    // degree, whose partial outputs and input gradients sum over tp.)
    const double E = double(e.experts), k = double(e.top_k), Fe = double(e.expert_intermediate) / double(l.etp);
    // Each rank routes its own rows (under sp its part of the sequence).
    // Under sp with an expert tp degree the tp ranks then gather the rows
    // they received (gtp of them: each expert computes on every tp rank's),
    // and reduce-scatter the partial outputs back, and in the backward the
    // output gradients and the input gradients alike; without sp every tp
    // rank routes all rows and the partial sums are all-reduced.
    const double Mr = Msp, all_choices = Mr * k;
    const bool etp_sp = l.sp && l.etp > 1;
    const double gtp = etp_sp ? t : 1.0;
    const double cap = e.capacity_factor > 0 ? std::ceil(e.capacity_factor * all_choices / E) : all_choices;
    const double per = std::min(all_choices / E, cap), choices = per < all_choices / E ? per * E : all_choices;
    // The slowest ep rank sets the step: the run's stated imbalance
    // (--moe-imbalance; 0, the worst-case buffers, prices balanced routing,
    // as does 1) has its experts take f
    // times the balanced rows, at most the capacity from each source rank,
    // and receive and send back f times the balanced bytes. Without expert
    // parallelism each rank computes every choice of its own rows, however
    // they route.
    const double f = l.ep > 1 && e.imbalance > 1 ? std::min(e.imbalance, cap / per) : 1.0;
    // FP8 (memory::moe_fp8_experts, moe_fp8_shared): the experts' and the
    // shared expert's GEMMs, whatever their rows; the router's never.
    const bool e8 = x.fp8 && memory::moe_fp8_experts(m, l), s8 = x.fp8 && memory::moe_fp8_shared(m, l);
    const auto lin_fwd = [&](bool on, double Mi, double N, double K) {
      return on ? x.gemm8(Mi, N, K) : x.linear_fwd(Mi, N, K);
    };
    const auto lin_bwd = [&](bool on, double Mi, double N, double K) {
      const double wgrad = x.run.lora.enabled() ? 0.0 : on ? x.gemm8(N, K, Mi) : x.gemm(N, K, Mi);
      return (on ? x.gemm8(Mi, K, N) : x.gemm(Mi, K, N)) + wgrad;
    };
    // The routed experts' grouped GEMMs at their fitted efficiency against
    // dense GEMMs of their shapes (CostConstants), FP8's on FP8 hardware.
    const double grouped = x.k.expert_gemm_efficiency *
                           (e8 && x.c.device.has_fp8() ? x.k.fp8_expert_gemm_efficiency : 1.0);
    const double ep = double(l.ep), El = E / ep, per_local = per * f * ep * gtp;
    // (The all-gather dispatcher moves every rank's rows whatever they route.)
    const double rows_bytes = choices * C * a, received = choices * f * gtp;
    const bool gathered = l.dispatch == MoeDispatch::allgather;
    // (An all-to-all trip, either way, at the fitted dispatch efficiency:
    // CostConstants.)
    const double a2a_trip =
        l.ep <= 1 || gathered ? 0.0 : all_to_all(rows_bytes * f, x.ep_group()) / x.k.dispatch_efficiency;
    const double out_trip = l.ep <= 1 ? 0.0 : gathered ? all_gather(ep * rows_bytes, x.ep_group()) : a2a_trip;
    const double back_trip = l.ep <= 1 ? 0.0 : gathered ? reduce_scatter(ep * rows_bytes, x.ep_group()) : a2a_trip;
    split_width = double(e.shared_intermediate) / t;
    local_experts = El;
    expert_rows = per_local;
    // Its casts: the experts' inputs and SwiGLU outputs in the forward
    // (their scales per expert and micro-batch, an amax reduction each),
    // the output gradients of down, gate and up in the backward; the shared
    // expert's as a dense FFN's, its input again for its weight gradients.
    // Emulated, the weights are quantised at each use (forward and
    // backward); on FP8 hardware once per step (fp8_weight_casts).
    const double Fs0 = double(e.shared_intermediate) / t;
    const double w8 = (e8 ? 3 * El * Fe * C : 0.0) + (s8 ? 3 * Fs0 * C : 0.0);
    const double in_cast = (e8 ? x.fp8_cast(received * C) : 0.0) + (s8 ? x.fp8_cast(M * C) : 0.0) +
                           (w8 > 0 && !x.c.device.has_fp8() ? x.fp8_cast(w8) : 0.0);
    const double act_cast = (e8 ? x.fp8_cast(received * Fe) : 0.0) + (s8 ? x.fp8_cast(M * Fs0) : 0.0);
    const double grad_casts = (e8 ? x.fp8_cast(received * C) + x.fp8_cast(2 * received * Fe) : 0.0) +
                              (s8 ? 2 * x.fp8_cast(M * C) + x.fp8_cast(2 * M * Fs0) : 0.0) +
                              (w8 > 0 && !x.c.device.has_fp8() ? x.fp8_cast(w8) : 0.0);
    // Block scaling on the CPU quantises the weight gradients' operands
    // again, down the tokens (memory::moe_fp8_wgrad_tiles; a GPU's block
    // cast writes both tilings in one pass).
    const double wgrad_casts =
        x.l.fp8 == Fp8Recipe::blockwise && !x.c.device.has_fp8() && !x.run.lora.enabled()
            ? (e8 ? x.fp8_cast(received * (2 * C + 3 * Fe)) : 0.0) + (s8 ? x.fp8_cast(M * (2 * C + 3 * Fs0)) : 0.0)
            : 0.0;
    amax_fwd += amax * (2 * int(s8));
    amax_bwd += amax * (4 * int(s8));
    if (x.c.device.has_fp8()) {
      amax_fwd += amax * 2 * int(e8);
      amax_bwd += amax * 3 * int(e8);
    } else if (e8 || s8) {
      // The CPU's emulation (trainer/model/llama_moe_fp8.cpp) takes the
      // routed rows' scales as one rank computing the micro-batch would,
      // from tables reduced over tp and dp x cp (integer or float maxima,
      // 4 bytes an entry). Current scaling: a (micro-batch, expert) table of
      // amax before each of the five routed casts. Block scaling with a
      // micro-batch's rows apart (sp, cp): the rows each sender routed per
      // (micro-batch, expert, unit of tokens consecutive in both orders),
      // 8 bytes each, once a backward; then each of the five weight
      // gradient operands' column maxima per tile, about D (B T k / 128 + E)
      // tiles of the operand's width; the shared expert's under cp over cp,
      // B T / 128 tiles.
      const double dps = double(l.dp), tables = dps * E;
      // (Under an expert tp degree the tp ranks split the tiles' width: their
      // column maxima stay apart.)
      const auto over_tp_dpcp = [&](double bytes, bool tp) {
        return (tp ? all_reduce(bytes, x.tp_group()) : 0.0) + all_reduce(bytes, x.shard_group());
      };
      if (e8 && x.l.fp8 == Fp8Recipe::tensorwise) {
        amax_fwd += 2 * over_tp_dpcp(4 * tables, true);
        amax_bwd += 3 * over_tp_dpcp(4 * tables, true);
      }
      const bool tiles_apart = x.l.fp8 == Fp8Recipe::blockwise && !x.run.lora.enabled() && (l.sp || l.cp > 1);
      if (e8 && tiles_apart) {
        const double local = B * Tl, sender = l.sp ? local / t : local;
        const double piece = l.cp > 1 ? T / (2 * cp) : local;
        const double unit = double(std::gcd(int64_t(piece), int64_t(sender)));
        const double units = B * T / std::max(1.0, unit);
        const double tile_count = dps * (std::ceil(B * T * k / double(kFp8BlockTile)) + E);
        amax_bwd += over_tp_dpcp(8 * tables * units, true) + over_tp_dpcp(4 * tile_count * (2 * C + 3 * Fe), l.etp == 1);
      }
      if (s8 && x.l.fp8 == Fp8Recipe::blockwise && !x.run.lora.enabled() && l.cp > 1)
        amax_bwd += all_reduce(4 * std::ceil(B * T / double(kFp8BlockTile)) * (2 * C + 3 * Fs0), x.cp_group());
    }
    double pre = x.linear_fwd(Mr, E, C) + x.stream("moe_route", Mr, E) + x.stream("moe_permute", choices, C) +
                 out_trip + in_cast + El * 2 * lin_fwd(e8, per_local, Fe, C) / grouped +
                 x.stream("swiglu_fwd", received, Fe) +
                 act_cast;
    const double etp_sum = !(l.etp > 1) ? 0.0
                           : etp_sp ? all_gather(received * C * a, x.tp_group()) + reduce_scatter(received * C * a, x.tp_group())
                                    : all_reduce(received * C * a, x.tp_group());
    double post = El * lin_fwd(e8, per_local, C, Fe) / grouped + etp_sum + back_trip +
                  x.stream("moe_unpermute", choices, C);
    double bwd = lin_bwd(false, Mr, E, C) + x.stream("moe_route_bwd", Mr, E) + x.stream("moe_permute", choices, C) +
                 out_trip + back_trip + etp_sum + grad_casts + wgrad_casts +
                 El * (2 * lin_bwd(e8, per_local, Fe, C) + lin_bwd(e8, per_local, C, Fe)) / grouped +
                 x.stream("swiglu_bwd", received, Fe) + x.stream("moe_unpermute", choices, C);
    if (split_width > 0) {
      const double Fs = split_width;
      pre += 2 * lin_fwd(s8, M, Fs, C) + x.stream("swiglu_fwd", M, Fs);
      post += lin_fwd(s8, M, C, Fs);
      bwd += 2 * lin_bwd(s8, M, Fs, C) + x.stream("swiglu_bwd", M, Fs) + lin_bwd(s8, M, C, Fs);
    }
    mlp_pre = x.norm_fwd(Msp) + pre;
    p.fwd = attn_pre + attn_fwd + x.block_linear_fwd(M, C, Hl * D) + resid + mlp_pre + post + resid +
            (casts_fwd - attn_cast);
    p.bwd = x.norm_bwd(Msp) + qkv_bwd + rope + attn_bwd + x.block_linear_bwd(M, C, Hl * D) + resid + x.norm_bwd(Msp) +
            bwd + resid + casts_bwd;
  }
  // LoRA: each targeted layer's adapters, in the forward (redone with it
  // under recomputation: the MLP's gate and up adapters with mlp_pre).
  if (x.run.lora.enabled()) {
    const std::pair<double, double> nk[kLinears] = {{Hl * D, C}, {Kl * D, C}, {Kl * D, C}, {C, Hl * D},
                                                    {Fl, C},     {Fl, C},     {C, Fl}};
    for (int g = 0; g < kLinears; ++g) {
      if (!x.run.lora.targets_linear(Linear(g))) continue;
      auto [N, K] = nk[g];
      // An MoE block's gate, up and down adapters are its shared expert's
      // (its tp part of the width; none without one).
      if (x.moe && g >= int(Linear::gate)) {
        if (split_width <= 0) continue;
        (g == int(Linear::down) ? K : N) = split_width;
      }
      const double f = x.lora_fwd(M, N, K);
      p.fwd += f;
      p.bwd += x.lora_bwd(M, N, K);
      if (Linear(g) == Linear::gate || Linear(g) == Linear::up) mlp_pre_lora += f;
    }
    // Its routed experts' (llama_moe_lora.cpp): each local expert's fused
    // gate_up (one A, one B of 2 F_e rows) and down over its rows.
    if (x.moe) {
      const double Fe = double(m.moe.expert_intermediate);
      if (x.run.lora.targets_linear(Linear::gate)) {
        const int64_t r = x.run.lora.experts_gate_up_rank();
        const double f = local_experts * x.lora_fwd(expert_rows, 2 * Fe, C, r);
        p.fwd += f;
        p.bwd += local_experts * x.lora_bwd(expert_rows, 2 * Fe, C, r);
        mlp_pre_lora += f;
      }
      if (x.run.lora.targets_linear(Linear::down)) {
        p.fwd += local_experts * x.lora_fwd(expert_rows, C, Fe);
        p.bwd += local_experts * x.lora_bwd(expert_rows, C, Fe);
      }
    }
  }

  // Two column/row-parallel pairs per block: forward all-reduce (or, with
  // sequence parallelism, all-gather before and reduce-scatter after) and the
  // conjugates in the backward. Sequence parallelism also re-gathers the two
  // saved norm outputs for the weight gradients: their FP8 codes, one byte an
  // element, where the block keeps them (memory::fp8_saved_inputs; priced so
  // in every FP8 block, though a stage holding compute-precision edge blocks
  // keeps none).
  //
  // The forward's collectives, and the backward's gathers of the output
  // gradient, sit between GEMMs that wait for them: exposed. The trainer runs
  // the rest of the backward's beside its GEMMs (block_backward): each
  // re-gather beside what precedes the weight gradients that read it (the
  // attention's backward and q, k and v's input gradients; SwiGLU's backward
  // and gate and up's), each input gradient's reduction beside the weight
  // gradients; exposed_beside prices what shows.
  //
  // FP8 blocks under sp gather the norms' outputs as codes, one byte an
  // element, in the forward (cast first: LlamaStage::fp8_gathers_codes) and
  // in the backward's re-gather where they are kept.
  const double act = M * C * a;
  const Group tg = x.tp_group();
  const double gather = l.sp ? all_gather(act, tg) : 0.0;
  const double reduce = l.sp ? reduce_scatter(act, tg) : all_reduce(act, tg);
  const bool keeps8 = (l.fp8 == Fp8Recipe::tensorwise || l.fp8 == Fp8Recipe::delayed) && !x.run.lora.enabled();
  const bool qkv_all8 = qkv8 && x.in_fp8(M, Kl * D, C);
  const double gather_qkv = l.sp ? all_gather(keeps8 && qkv_all8 ? M * C : act, tg) : 0.0;
  // (An MoE block's routed experts gather and reduce nothing here: only
  // its shared expert does, where it has one. Split over tp under sp they
  // gather the rows they received, forward and backward, and those
  // collectives are etp_sum's.)
  const bool ffn_split = split_width > 0;
  const bool ffn_gathers = ffn_split;
  const double gather_up = l.sp && ffn_gathers ? all_gather(keeps8 && up8 ? M * C : act, tg) : 0.0;
  const double tp_fwd = gather_qkv + gather_up + (ffn_split ? 2 : 1) * reduce + amax_fwd;
  // (An MoE model keeps its FP8 blocks' inputs in the compute type:
  // memory::fp8_saved_inputs.)
  const double regather_qkv = m.moe.enabled() && l.sp ? all_gather(act, tg) : gather_qkv, regather_up = gather_up;
  const double qkv_dgrad = x.block_linear_dgrad(M, Hl * D, C) + 2 * x.block_linear_dgrad(M, Kl * D, C);
  const double qkv_wgrad = x.block_linear_wgrad(M, Hl * D, C) + 2 * x.block_linear_wgrad(M, Kl * D, C);
  const double Fu = ffn_split ? split_width : Fl;
  const double up_dgrad = 2 * x.block_linear_dgrad(M, Fu, C), up_wgrad = 2 * x.block_linear_wgrad(M, Fu, C);
  const double tp_bwd =
      (ffn_gathers ? 2 : 1) * gather + exposed_beside(regather_qkv, attn_bwd + rope + qkv_dgrad, x.k) +
      (ffn_gathers ? exposed_beside(regather_up, x.stream("swiglu_bwd", M, Fu) + up_dgrad, x.k) : 0.0) +
      exposed_beside(reduce, qkv_wgrad, x.k) + (ffn_split ? exposed_beside(reduce, up_wgrad, x.k) : 0.0);
  p.tp = tp_fwd - amax_fwd + amax_bwd + tp_bwd;

  // Context parallelism's exchanges, per block and micro-batch.
  double cp_fwd = 0;
  if (l.cp > 1) {
    const Group cg = x.cp_group();
    const double kv_local = B * Tl * Kl * D * a, q_local = B * Tl * Hl * D * a;
    switch (l.cp_comm) {
      case CpComm::ring: {
        // cp - 1 K/V blocks arrive, each while attention computes on the
        // block before it (1/cp of the rank's attention); only what a
        // transfer takes past that compute is exposed. In the backward dK
        // and dV travel one step behind K and V, beside the same compute
        // (twice the volume), and their last hop home has nothing beside it.
        const double block = 2 * kv_local;
        cp_fwd = (cp - 1) * exposed_beside(x.cp_p2p(block), attn_fwd / cp, x.k);
        p.cp = cp_fwd + (cp - 1) * exposed_beside(x.cp_p2p(2 * block), attn_bwd / cp, x.k) + x.cp_p2p(block);
        break;
      }
      case CpComm::allgather: {
        // K and V of the whole sequence gathered before the attention, again
        // in the backward (the gathered copy is not kept), and dK and dV
        // reduce-scattered back: nothing computes beside them.
        const double full = 2 * kv_local * cp;
        p.cp = 2 * all_gather(full, cg) + reduce_scatter(full, cg);
        break;
      }
      case CpComm::a2a:
        // Ulysses: q, k, v to head-split and out back before and after the
        // attention; the backward redoes the four (the sequence-split tensors
        // are what is kept) and exchanges dout, dq, dk and dv.
        p.cp = 3 * (2 * all_to_all(q_local, cg) + 2 * all_to_all(kv_local, cg));
        break;
    }
  }

  p.attn_fwd = attn_fwd;
  p.mlp_pre = mlp_pre + mlp_pre_lora;
  p.tp_fwd = tp_fwd;
  p.cp_fwd = cp_fwd;
  return p;
}

}  // namespace

// The block's time with `mode`'s recomputation: selective redoes the
// attention core (and the ring's forward passes it needs), ffn the MLP's
// input side, full the whole forward with its communication.
Part with_recompute(Part p, Checkpointing mode) {
  const Redone r = redone(p, mode);
  p.recompute = r.compute;
  p.recompute_tp = r.tp;
  p.recompute_cp = r.cp;
  return p;
}

Part mix(const Part& a, const Part& b, double wa) {
  const auto f = [&](double Part::*field) { return wa * a.*field + (1 - wa) * b.*field; };
  Part p;
  for (double Part::*field : {&Part::fwd, &Part::bwd, &Part::tp, &Part::cp, &Part::recompute, &Part::recompute_tp,
                              &Part::recompute_cp, &Part::attn_fwd, &Part::mlp_pre, &Part::tp_fwd, &Part::cp_fwd})
    p.*field = f(field);
  return p;
}

}  // namespace weft::tuner::cost_parts
