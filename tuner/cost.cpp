// Step time of a layout, built up from one micro-batch of one block on one
// rank. Every term is a count of FLOPs or bytes from the model's shapes over
// a rate from the DeviceSpec scaled by a CostConstants efficiency, so that
// calibration can refit the efficiencies to measured steps.
#include "tuner/cost.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/flops.h"
#include "tuner/device_profile.h"

namespace weft::tuner {

CostConstants cost_defaults(const DeviceSpec& device) {
  if (device.kind == DeviceKind::gpu) {
    // Parsed once per device name: the dry-run asks for every layout.
    static std::mutex mutex;
    static std::map<std::string, CostConstants> cache;
    std::lock_guard lock(mutex);
    auto it = cache.find(device.name);
    if (it == cache.end()) {
      const auto p = preset_profile(device);
      it = cache.emplace(device.name, p ? p->constants : datasheet_constants(device)).first;
    }
    return it->second;
  }
  return datasheet_constants(device);
}

CostConstants datasheet_constants(const DeviceSpec& device) {
  CostConstants k;
  if (device.kind == DeviceKind::cpu) {
    // OpenBLAS sgemm reaches 60-80% of the AVX2/AVX-512 FMA peak on large
    // shapes; the CPU attention and streaming loops are far from peak.
    k.gemm_efficiency = 0.6;
    k.gemm_tile_m = k.gemm_tile_n = 16;
    k.flash_efficiency = 0.15;
    k.memory_efficiency = 0.5;
    k.intra_efficiency = k.inter_efficiency = 0.5;
    k.launch_overhead = 1e-6;
    // The CPU trainer starts its gradient reductions during the backward, but
    // MPI moves them on only inside the rank's MPI calls (no progress
    // thread): they finish in the wait after the backward, not beside it.
    k.dp_overlap = 0;
    return k;
  }
  if (device.name.rfind("a100", 0) == 0) {
    // cuBLAS bf16 GEMMs reach ~265 of 312 TFLOP/s on large shapes; the
    // FlashAttention-2 paper reports 50-70% of peak fwd+bwd at head dim 128;
    // NCCL all-reduce bus bandwidth ~230 of 300 GB/s over NVLink 3.
    k.gemm_efficiency = 0.85;
    k.flash_efficiency = 0.6;
    k.intra_efficiency = 0.75;
  } else {
    // Hopper: large bf16 GEMMs measured at ~790 TFLOP/s on an H200 (0.8 of
    // dense peak); FlashAttention-2-class kernels reach ~40% of peak; NCCL
    // bus bandwidth ~360 of 450 GB/s over NVLink 4.
    k.gemm_efficiency = 0.8;
    k.flash_efficiency = 0.4;
    k.intra_efficiency = 0.8;
    // cuBLASLt FP8 (E4M3, TN, fp32 accumulation) at 8192^3 measured at
    // ~1610 of 1979 dense TFLOP/s on H100 SXM (0.81; through PyTorch's
    // _scaled_mm ~1170): calibration/SOURCES.md, "FP8".
    k.fp8_gemm_efficiency = 0.8;
  }
  return k;
}

double gemm_efficiency(double M, double N, double K, const DeviceSpec& device,
                       const CostConstants& k) {
  const double tiles = std::ceil(M / k.gemm_tile_m) * std::ceil(N / k.gemm_tile_n);
  const double sms = double(std::max<int64_t>(1, device.sm_count));
  const double waves = std::ceil(tiles / sms);
  const double wave_eff = tiles / (waves * sms);
  const double k_eff = K / (K + k.gemm_k_half);
  return k.gemm_efficiency * wave_eff * k_eff;
}

double fp8_gemm_efficiency(double M, double N, double K, const DeviceSpec& device, const CostConstants& k) {
  const double tiles = std::ceil(M / k.gemm_tile_m) * std::ceil(N / k.gemm_tile_n);
  const double sms = double(std::max<int64_t>(1, device.sm_count));
  const double waves = std::ceil(tiles / sms);
  return k.fp8_gemm_efficiency * tiles / (waves * sms) * K / (K + k.fp8_k_half);
}

bool fp8_gemm_shape(double M, double N, double K) {
  const auto by16 = [](double d) { return std::fmod(d, 16.0) == 0; };
  return by16(M) && by16(N) && by16(K);
}

int64_t fp8_stage_blocks(const ModelSpec& m, const Layout& l, int64_t stage) {
  if (l.fp8 == Fp8Recipe::off || l.pp <= 0 || l.vpp <= 0) return 0;
  const int64_t chunk = m.layers / (l.pp * l.vpp);
  int64_t n = 0;
  for (int64_t v = 0; v < l.vpp; ++v) {
    const int64_t c = stage + v * l.pp;
    for (int64_t i = c * chunk; i < (c + 1) * chunk; ++i) n += l.fp8_layer(m, i) ? 1 : 0;
  }
  return n;
}

namespace {

// Collective times on a ring of n ranks (NCCL's algorithm for these sizes).
struct Link {
  double bandwidth;  // bytes/s of bus bandwidth
  double latency;    // seconds per hop
};

double ring_all_reduce(double bytes, int64_t n, Link link) {
  if (n <= 1) return 0;
  return 2.0 * double(n - 1) / double(n) * bytes / link.bandwidth + 2.0 * double(n - 1) * link.latency;
}
double ring_all_gather(double bytes_full, int64_t n, Link link) {
  if (n <= 1) return 0;
  return double(n - 1) / double(n) * bytes_full / link.bandwidth + double(n - 1) * link.latency;
}

// A process group as the cluster wires it: n ranks, `inner` of them in each
// NVLink domain it touches. A group within one domain runs its collectives
// over NVLink; one that spans domains runs them hierarchically, as NCCL does
// across nodes: a reduce-scatter inside each domain, the 1/inner part that
// each rank then holds reduced across the domains over the network (every
// rank of a node sends at once, so each gets its share of the node's ports),
// and an all-gather inside the domain. So a group is priced by the slowest
// link it spans, and only the part that must cross it crosses it.
struct Group {
  int64_t n = 1, inner = 1;
  Link intra, inter;
  const MeasuredRates* rates = nullptr;  // measured collectives of this machine
  int64_t outer() const { return n / inner; }
  // The measured time of `op` over this group's size, if there is one.
  std::optional<double> measured(const char* op, double bytes) const {
    return rates ? rates->comm_seconds(op, n, bytes) : std::nullopt;
  }
};

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

struct Model {
  const ModelSpec& m;
  const RunSpec& run;
  const Layout& l;
  const ClusterSpec& c;
  const CostConstants& k;
  double peak;
  double a;  // bytes per activation element

  const MeasuredRates* rates;  // the device's measured rates, or null
  // Whether the blocks being priced run their linear layers in FP8 (the
  // layout's recipe, for the blocks it puts in FP8).
  bool fp8 = false;

  double gemm(double M, double N, double K) const {
    if (rates)
      if (auto t = rates->gemm_seconds(M, N, K)) return *t;
    return 2.0 * M * N * K / (peak * gemm_efficiency(M, N, K, c.device, k)) + k.launch_overhead;
  }
  // An FP8 GEMM: at the dense FP8 peak on a device with FP8 tensor cores;
  // emulated (the CPU) it is the compute-precision GEMM.
  double gemm8(double M, double N, double K) const {
    if (!c.device.has_fp8()) return gemm(M, N, K);
    return 2.0 * M * N * K / (c.device.peak_fp8_flops * fp8_gemm_efficiency(M, N, K, c.device, k)) +
           k.launch_overhead;
  }
  // A linear layer X(M x K) W^T -> Y(M x N): forward, and the data- and weight-
  // gradient GEMMs of its backward.
  double linear_fwd(double M, double N, double K) const { return gemm(M, N, K); }
  double linear_bwd(double M, double N, double K) const { return gemm(M, K, N) + gemm(N, K, M); }
  // A linear layer of a block: in FP8 when the block is and its local dims
  // are multiples of 16, else as linear_fwd/linear_bwd. (Its operands' casts
  // are block_cost's, which knows which inputs the linears share.)
  bool in_fp8(double M, double N, double K) const { return fp8 && fp8_gemm_shape(M, N, K); }
  double block_linear_fwd(double M, double N, double K) const {
    return in_fp8(M, N, K) ? gemm8(M, N, K) : linear_fwd(M, N, K);
  }
  double block_linear_bwd(double M, double N, double K) const {
    return in_fp8(M, N, K) ? gemm8(M, K, N) + gemm8(N, K, M) : linear_bwd(M, N, K);
  }
  // Casting one operand of `elements` to FP8, a memory-bound pass: it reads
  // the compute-precision tensor and writes the FP8 codes and, on Hopper
  // (whose FP8 GEMMs take only K-major operands), their transpose for the
  // backward GEMM that reads it the other way; emulated, it writes the
  // quantised-dequantised values in the compute precision. Tensorwise
  // scaling reads the tensor once more first, for the amax its scale needs
  // (delayed scaling takes the scale from the history and records the amax
  // in the same pass as the cast).
  // Tensorwise scaling reduces each activation's and output gradient's amax
  // over the tp * cp ranks that share the tensor before casting it: a
  // one-float all-reduce, latency-bound, which NCCL runs as a tree of about
  // log2(n) hops (on the group's slowest link).
  double fp8_amax_reduce() const {
    const int64_t n = l.tp * l.cp;
    if (l.fp8 != Fp8Recipe::tensorwise || n <= 1) return 0;
    if (rates)
      if (auto t = rates->comm_seconds("all_reduce", n, 4.0)) return *t;
    const Group g = group(n, 1);
    const double hop = g.outer() > 1 ? g.inter.latency : g.intra.latency;
    return std::ceil(std::log2(double(n))) * hop;
  }
  double fp8_cast(double elements) const {
    const bool hw = c.device.has_fp8();
    double bytes = elements * (hw ? a + 2.0 : 2.0 * a);
    double launches = 1;
    if (l.fp8 == Fp8Recipe::tensorwise) {
      bytes += elements * a;
      launches += 1;
    }
    return bytes / (c.device.memory_bandwidth * k.memory_efficiency) + launches * k.launch_overhead;
  }
  // A memory-bound kernel of `family` over rows x width: its measured rate
  // where the device has one, else the bytes at the streaming bandwidth.
  double stream(const char* family, double rows, double width) const {
    const StreamWork w = stream_work(family, rows, width, a);
    if (rates)
      if (auto t = rates->stream_seconds(family, w.bytes)) return *t;
    return w.bytes / (c.device.memory_bandwidth * k.memory_efficiency) + w.launches * k.launch_overhead;
  }
  // Materialized attention's softmax over its scores (no measured family:
  // measured profiles time the whole attention call).
  double stream_bytes(double bytes) const {
    return bytes / (c.device.memory_bandwidth * k.memory_efficiency) + k.launch_overhead;
  }
  Link intra_link() const {
    return {c.device.intra_node_bandwidth * k.intra_efficiency, c.device.intra_node_latency};
  }
  Link inter_link() const {
    return {c.network_bandwidth_per_device() * k.inter_efficiency, c.device.inter_node_latency};
  }
  // Ranks are ordered tp fastest, then cp, then dp, then pp (rank grid): a
  // group of n ranks `stride` apart has min(n, domain / stride) of them in
  // each NVLink domain it touches.
  Group group(int64_t n, int64_t stride) const {
    const int64_t domain = c.domain();
    const int64_t inner = stride >= domain ? 1 : std::max<int64_t>(1, std::min(n, domain / stride));
    return {n, n % inner == 0 ? inner : 1, intra_link(), inter_link(), rates};
  }
  Group tp_group() const { return group(l.tp, 1); }
  // The cp ranks of a sequence, tp apart: tp * cp consecutive ranks.
  Group cp_group() const { return group(l.cp, l.tp); }
  // The ranks a gradient sums over and ZeRO shards over: dp x cp, tp apart
  // (the dp group at cp 1).
  Group shard_group() const { return group(l.dp * l.cp, l.tp); }
  // A stage and the next are tp * cp * dp ranks apart: the same domain only
  // when a whole stage fits in part of one.
  Link pp_link() const { return l.tp * l.cp * l.dp < c.domain() ? intra_link() : inter_link(); }
  // The ring's neighbours: NVLink while the cp group's tp * cp ranks fit in
  // one domain, else the ring crosses the network and runs at its pace.
  Link cp_link() const { return l.tp * l.cp <= c.domain() ? intra_link() : inter_link(); }
  // One ring step's message of `bytes` to the next cp rank.
  double cp_p2p(double bytes) const {
    if (rates)
      if (auto t = rates->comm_seconds("p2p", 2, bytes)) return *t;
    const Link cl = cp_link();
    return bytes / cl.bandwidth + cl.latency;
  }
  // One stage-to-stage message of `bytes`.
  double p2p(double bytes) const {
    if (rates)
      if (auto t = rates->comm_seconds("p2p", 2, bytes)) return *t;
    const Link pl = pp_link();
    return bytes / pl.bandwidth + pl.latency;
  }

  // RMSNorm over rows x C: fused reads x and writes y (backward: reads x and
  // dy, writes dx); the unfused composition upcasts, reduces, normalises and
  // scales in separate passes over fp32 intermediates.
  double norm_fwd(double rows) const {
    return stream(l.norm == NormKind::fused ? "rmsnorm_fwd" : "rmsnorm_unfused_fwd", rows, double(m.hidden));
  }
  double norm_bwd(double rows) const {
    return stream(l.norm == NormKind::fused ? "rmsnorm_bwd" : "rmsnorm_unfused_bwd", rows, double(m.hidden));
  }
};

struct Part {
  double fwd = 0, bwd = 0;  // compute
  double tp = 0;            // tensor-parallel communication (fwd + bwd)
  double cp = 0;            // exposed context-parallel communication (fwd + bwd)
  double recompute = 0;     // compute redone in the backward
  double recompute_tp = 0;  // communication redone in the backward
  double recompute_cp = 0;  // the ring's forward passes redone with the attention
  // What each checkpointing mode redoes of the forward (with_recompute).
  double attn_fwd = 0, mlp_pre = 0, tp_fwd = 0, cp_fwd = 0;
};

// Attention of one rank for B x Hl heads (Hl query heads, Kl kv heads) over
// a sequence of T tokens split over cp ranks, forward and backward.
struct AttentionTime {
  double fwd = 0, bwd = 0;
};

AttentionTime attention_time(const Model& x, double B, double Hl, double Kl, double T, double D) {
  const Layout& l = x.l;
  const double cp = double(l.cp), a = x.a;
  AttentionTime at;
  if (l.attention != AttentionKind::materialized) {
    // Flash skips fully masked key blocks: half of the 4 B Hl T^2 D FLOPs;
    // the backward does 2.5x the forward's matmul work. cuDNN's fused SDPA
    // (cudnn) is modelled as flash, at the same efficiency: it is the same
    // tiled algorithm, and which of the two is faster on a device is left to
    // the profiler, which times both, rather than guessed here. Under context
    // parallelism each rank holds chunks r and 2 cp - 1 - r of 2 cp, which
    // balances the causal work: 1/cp of it on every rank, whatever the
    // transport (ring: its chunks against each block of keys in turn;
    // all-gather: against the keys up to their end; all-to-all: the whole
    // sequence on H/cp heads).
    const double flops = 4.0 * B * Hl * T * T * D * 0.5 / cp;
    at.fwd = flops / (x.peak * x.k.flash_efficiency) + x.k.launch_overhead;
    at.bwd = 2.5 * flops / (x.peak * x.k.flash_efficiency) + x.k.launch_overhead;
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

// One block's time for one micro-batch, nothing recomputed.
Part block_cost(const Model& x) {
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
  const bool qkv8 = x.in_fp8(M, Hl * D, C), o8 = x.in_fp8(M, C, Hl * D), up8 = x.in_fp8(M, Fl, C),
             down8 = x.in_fp8(M, C, Fl);
  const double attn_cast = cast_if(qkv8, M * C), mlp_cast = cast_if(up8, M * C);
  const double casts_fwd = attn_cast + cast_if(o8, M * Hl * D) + mlp_cast + cast_if(down8, M * Fl);
  const double casts_bwd = cast_if(qkv8, M * (Hl + 2 * Kl) * D) + cast_if(o8, M * C) + cast_if(up8, 2 * M * Fl) +
                           cast_if(down8, M * C);
  const double amax = x.fp8_amax_reduce();
  const double amax_fwd = amax * (int(qkv8) + int(o8) + int(up8) + int(down8));
  const double amax_bwd = amax * (3 * int(qkv8) + int(o8) + 2 * int(up8) + int(down8));

  const double attn_pre = x.norm_fwd(Msp) + attn_cast + qkv_fwd + rope;
  const double mlp_pre = x.norm_fwd(Msp) + mlp_cast + 2 * x.block_linear_fwd(M, Fl, C) + x.stream("swiglu_fwd", M, Fl);
  p.fwd = attn_pre + attn_fwd + x.block_linear_fwd(M, C, Hl * D) + resid + mlp_pre + x.block_linear_fwd(M, C, Fl) +
          resid + (casts_fwd - attn_cast - mlp_cast);
  p.bwd = x.norm_bwd(Msp) + qkv_bwd + rope + attn_bwd + x.block_linear_bwd(M, C, Hl * D) + resid + x.norm_bwd(Msp) +
          2 * x.block_linear_bwd(M, Fl, C) + x.stream("swiglu_bwd", M, Fl) + x.block_linear_bwd(M, C, Fl) + resid +
          casts_bwd;

  // Two column/row-parallel pairs per block: forward all-reduce (or, with
  // sequence parallelism, all-gather before and reduce-scatter after) and the
  // conjugates in the backward. Sequence parallelism also re-gathers the two
  // saved norm outputs for the weight gradients.
  const double act = M * C * a;
  const Group tg = x.tp_group();
  const double pair = l.sp ? all_gather(act, tg) + reduce_scatter(act, tg) : all_reduce(act, tg);
  const double tp_fwd = 2 * pair + amax_fwd;
  p.tp = 2 * tp_fwd - amax_fwd + amax_bwd + (l.sp ? 2 * all_gather(act, tg) : 0);

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
        // and dV travel with K and V: twice the volume.
        const double block = 2 * kv_local;
        cp_fwd = (cp - 1) * exposed_beside(x.cp_p2p(block), attn_fwd / cp, x.k);
        p.cp = cp_fwd + (cp - 1) * exposed_beside(x.cp_p2p(2 * block), attn_bwd / cp, x.k);
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
  p.mlp_pre = mlp_pre;
  p.tp_fwd = tp_fwd;
  p.cp_fwd = cp_fwd;
  return p;
}

// The block's time with `mode`'s recomputation: selective redoes the
// attention core (and the ring's forward passes it needs), ffn the MLP's
// input side, full the whole forward with its communication.
Part with_recompute(Part p, Checkpointing mode) {
  switch (mode) {
    case Checkpointing::none: break;
    case Checkpointing::selective:
      p.recompute = p.attn_fwd;
      p.recompute_cp = p.cp_fwd;
      break;
    case Checkpointing::ffn: p.recompute = p.mlp_pre; break;
    case Checkpointing::full:
      p.recompute = p.fwd;
      p.recompute_tp = p.tp_fwd;
      p.recompute_cp = p.cp_fwd;
      break;
  }
  return p;
}

struct StageCost {
  double fwd = 0, bwd = 0, tp = 0, cp = 0, recompute = 0;
  double total() const { return fwd + bwd + tp + cp + recompute; }
};

// A block of the first and of the last stage: under an FP8 recipe the mean
// of the stage's FP8 blocks and the blocks it keeps in the compute precision
// (the first and last fp8_bf16_layers of the model), as the stage's time is
// their sum. A checkpointed block is priced as the stage's mean block.
struct Blocks {
  Part first, last;
};

Part mix(const Part& a, const Part& b, double wa) {
  const auto f = [&](double Part::*field) { return wa * a.*field + (1 - wa) * b.*field; };
  Part p;
  for (double Part::*field : {&Part::fwd, &Part::bwd, &Part::tp, &Part::cp, &Part::recompute, &Part::recompute_tp,
                              &Part::recompute_cp, &Part::attn_fwd, &Part::mlp_pre, &Part::tp_fwd, &Part::cp_fwd})
    p.*field = f(field);
  return p;
}

Blocks stage_blocks(const Model& x) {
  Model plain = x;
  plain.fp8 = false;
  const Part p16 = block_cost(plain);
  if (x.l.fp8 == Fp8Recipe::off) return {p16, p16};
  Model f8 = x;
  f8.fp8 = true;
  const Part p8 = block_cost(f8);
  const double layers = double(std::max<int64_t>(1, x.l.stage_layers(x.m)));
  return {mix(p8, p16, double(fp8_stage_blocks(x.m, x.l, 0)) / layers),
          mix(p8, p16, double(fp8_stage_blocks(x.m, x.l, x.l.pp - 1)) / layers)};
}

Blocks with_recompute(const Blocks& b, Checkpointing mode) {
  return {with_recompute(b.first, mode), with_recompute(b.last, mode)};
}

// The first and last stage's time per micro-batch: `layers` blocks, of
// which `n_ckpt` recompute as `ckpt` says; the first adds the vocab-parallel
// embedding (gather, then a sum over tp), the last the final norm, LM head
// and the fused vocab-parallel loss, whose max, sum-exp and target logit are
// reduced over tp. One stage (pp 1) holds both.
std::pair<StageCost, StageCost> stage_costs(const Model& x, const Blocks& keeps, const Blocks& ckpts, int64_t layers,
                                            int64_t n_ckpt) {
  const Layout& l = x.l;
  const double t = double(l.tp), M = double(l.mb * x.run.seq) / double(l.cp), C = double(x.m.hidden);
  const double Vl = double(x.m.vocab) / t, Msp = l.sp ? M / t : M;
  const double act = M * C * x.a;
  const Group tg = x.tp_group();
  const auto body = [&](const Part& keep, const Part& ckpt) {
    StageCost s;
    s.fwd = layers * keep.fwd;
    s.bwd = layers * keep.bwd;
    s.tp = layers * keep.tp + n_ckpt * ckpt.recompute_tp;
    s.cp = layers * keep.cp + n_ckpt * ckpt.recompute_cp;
    s.recompute = n_ckpt * ckpt.recompute;
    return s;
  };

  StageCost first = body(keeps.first, ckpts.first), last = body(keeps.last, ckpts.last);
  first.fwd += x.stream("embedding_fwd", M, C);
  first.bwd += x.stream("embedding_bwd", M, C);
  first.tp += l.sp ? reduce_scatter(act, tg) + all_gather(act, tg) : all_reduce(act, tg);
  last.fwd += x.norm_fwd(Msp) + x.linear_fwd(M, Vl, C) + x.stream("cross_entropy", M, Vl);
  last.bwd += x.norm_bwd(Msp) + x.linear_bwd(M, Vl, C);
  last.tp += 3 * all_reduce(4 * M, tg) +
             (l.sp ? 2 * all_gather(act, tg) + reduce_scatter(act, tg) : all_reduce(act, tg));
  if (l.pp == 1) {
    // One stage: its blocks are the first's (the same as the last's).
    const StageCost blocks = body(keeps.first, ckpts.first);
    first.fwd += last.fwd - blocks.fwd;
    first.bwd += last.bwd - blocks.bwd;
    first.tp += last.tp - blocks.tp;
    last = first;
  }
  return {first, last};
}


}  // namespace

namespace {

// What a layout's ZeRO stage and gradient type decide: the exposed
// data-parallel reduction (and ZeRO's gathers), the optimizer over this
// rank's shard, and the tied embedding's exchange between the first and last
// stage. `bwd_mb` and `t_mb` are the slowest stage's backward (with its
// recomputation) and whole time per micro-batch, which hide the reduction.
struct Sharding {
  double dp_comm = 0, optimizer = 0, tied_p2p = 0;
};

Sharding sharding_cost(const Model& x, double mbs, double bwd_mb, double t_mb) {
  const ModelSpec& m = x.m;
  const Layout& l = x.l;
  const CostConstants& k = x.k;
  const double C = double(m.hidden), Vl = double(m.vocab) / double(l.tp);
  const int64_t layers = l.stage_layers(m);
  Sharding s;
  // Tied embeddings: the first and last stages exchange the table's
  // gradient (fp32 or bf16, as the layout keeps gradients) after the
  // backward, there and back; under ZeRO-1 and -2 each first gathers its
  // copy's reduced gradient over dp x cp.
  if (l.pp > 1 && m.tied_embeddings) {
    const double table = double(l.grad_bytes()) * Vl * C;
    s.tied_p2p = 2 * x.p2p(table);
    if (l.zero >= 1 && l.shard_ways() > 1) s.tied_p2p += all_gather(table, x.shard_group());
  }

  // Data parallelism over the larger of the first and last stage's params:
  // gradients sum, and ZeRO shards, over the dp x cp ranks (each cp rank saw
  // its part of every sequence).
  const auto stage_params = [&](bool emb, bool head) {
    const double block = double(2 * m.hidden + (2 * (m.heads / l.tp) + 2 * (m.kv_heads / l.tp)) *
                                                   m.head_dim * m.hidden +
                                3 * (m.intermediate / l.tp) * m.hidden);
    double n = double(layers) * block;
    if (emb) n += Vl * C;
    if (head) n += C + (m.tied_embeddings && emb ? 0 : Vl * C);
    return n;
  };
  const double psi = std::max(stage_params(true, l.pp == 1), stage_params(l.pp == 1, true));
  const Group dg = x.shard_group();
  const double grad_bytes = double(l.grad_bytes()) * psi, param_bytes = x.a * psi;
  double reduce = 0, gather = 0, window = 0;
  // As weft's trainer reduces: ZeRO-0 all-reduces, and ZeRO-1 reduce-scatters,
  // each parameter group (a block, the head, the embedding) as soon as the
  // last micro-batch's backward finishes it, beside the backward of the
  // groups below; ZeRO-2 reduce-scatters each group of every micro-batch (m
  // times the bytes) beside the backward of the next group, so only the last
  // micro-batch's last group is exposed. ZeRO-3 also gathers each group's
  // weights before its forward and again before its backward, every
  // micro-batch, priced as FSDP overlaps them (the public runs the GPU
  // profiles are fitted to); weft's trainer gathers in order on the stage's
  // stream (on the CPU, blocking), which the profiler measures.
  double tail_share = 1;  // of the exposed tail: the last micro-batch's under ZeRO-2
  switch (l.zero) {
    case 0:
      reduce = all_reduce(grad_bytes, dg);
      window = bwd_mb;
      break;
    case 1:
      reduce = reduce_scatter(grad_bytes, dg);
      gather = all_gather(param_bytes, dg);
      window = bwd_mb;
      break;
    case 2:
      reduce = mbs * reduce_scatter(grad_bytes, dg);
      gather = all_gather(param_bytes, dg);
      window = mbs * bwd_mb;
      tail_share = 1.0 / mbs;
      break;
    default:
      reduce = mbs * (reduce_scatter(grad_bytes, dg) + 2 * all_gather(param_bytes, dg));
      window = mbs * t_mb;
      break;
  }
  if (l.shard_ways() > 1) {
    // The group reduced last is exposed: the embedding table, whose
    // gradient is final only at the very end of the first stage's backward.
    const double tail = std::min(1.0, Vl * C / stage_params(true, l.pp == 1));
    // Hidden communication is not free: NCCL kernels take SMs and memory
    // bandwidth from the compute they overlap (10-20% slowdowns are typical).
    const double exposed = std::max(reduce - k.dp_overlap * window, reduce * tail * tail_share);
    s.dp_comm = exposed + k.overlap_cost * (reduce - exposed) + gather;
  }

  const double shard = l.zero >= 1 ? psi / double(l.shard_ways()) : psi;
  s.optimizer = x.stream("adamw", shard, double(l.grad_bytes()));

  if (l.fp8 != Fp8Recipe::off) {
    // The FP8 copies of the weights: each FP8 block's weights cast once per
    // step, when the optimizer has updated them (codes and transpose, with
    // a tensorwise amax all-reduce each), on the stage with more FP8 blocks.
    // Delayed scaling reduces every amax of the step over all ranks at once:
    // one small all-reduce (3 operands of 7 linears per block), after the
    // backward, exposed.
    Model f8 = x;
    f8.fp8 = true;
    const double M = double(l.mb * x.run.seq) / double(l.cp), D = double(m.head_dim), t = double(l.tp);
    const double Hl = double(m.heads) / t, Kl = double(m.kv_heads) / t, Fl = double(m.intermediate) / t;
    const std::pair<double, double> linears[] = {{Hl * D, C}, {Kl * D, C}, {Kl * D, C}, {C, Hl * D},
                                                 {Fl, C},     {Fl, C},     {C, Fl}};
    double per_block = 0;
    for (const auto& [N, K] : linears)
      if (f8.in_fp8(M, N, K)) per_block += f8.fp8_cast(N * K) + f8.fp8_amax_reduce();
    const int64_t blocks = std::max(fp8_stage_blocks(m, l, 0), fp8_stage_blocks(m, l, l.pp - 1));
    s.optimizer += double(blocks) * per_block;
    if (l.fp8 == Fp8Recipe::delayed)
      s.dp_comm += all_reduce(4.0 * 3 * 7 * double(m.layers), x.group(l.world(), 1));
  }
  return s;
}

Model model_of(const ModelSpec& m, const RunSpec& run, const Layout& l, const ClusterSpec& cluster,
               const CostConstants& k) {
  return Model{m, run, l, cluster, k, cluster.device.peak_flops(to_string(run.precision)),
               double(run.compute_bytes()), cluster.device.measured.get()};
}

// The pipeline's stage-to-stage activations: each micro-batch's forward and
// backward on every chunk boundary, and the fill and drain.
double pp_hops(const Model& x, double mbs) {
  const Layout& l = x.l;
  if (l.pp == 1) return 0;
  const double M = double(l.mb * x.run.seq) / double(l.cp), Msp = l.sp ? M / double(l.tp) : M;
  return 2.0 * x.p2p(Msp * double(x.m.hidden) * x.a) * (mbs * double(l.vpp) + double(l.pp - 1));
}

}  // namespace

CostBreakdown predict(const ModelSpec& m, const RunSpec& run, const Layout& l,
                      const ClusterSpec& cluster, const CostConstants& k) {
  const Model x = model_of(m, run, l, cluster, k);
  const Blocks keep = stage_blocks(x);
  const Blocks ckpt = with_recompute(keep, l.ckpt);
  const int64_t layers = l.stage_layers(m);
  const int64_t n_ckpt = l.checkpointed_layers(m);

  auto [first, last] = stage_costs(x, keep, ckpt, layers, n_ckpt);
  const StageCost& slow = first.total() >= last.total() ? first : last;
  const double t_mb = slow.total();

  const double mbs = double(l.micro_batches(run));
  CostBreakdown b;
  b.compute = mbs * (slow.fwd + slow.bwd);
  b.recompute = mbs * slow.recompute;
  b.tp_comm = mbs * slow.tp * (1.0 - k.tp_overlap * (1.0 - k.overlap_cost));
  b.cp_comm = mbs * slow.cp;
  // Ranks that share cores (a measured profile says so) give a waiting
  // rank's core to the others, whose measured rates already assume every
  // rank computing: the bubble costs no wall time of its own there.
  const bool shared_cores = x.rates && x.rates->shared_cores;
  b.pp_bubble = shared_cores ? 0.0 : double(l.pp - 1) / double(l.vpp) * t_mb;
  const Sharding sh = sharding_cost(x, mbs, slow.bwd + slow.recompute, t_mb);
  b.pp_p2p = pp_hops(x, mbs) + sh.tied_p2p;
  b.dp_comm = sh.dp_comm;
  b.optimizer = sh.optimizer;

  b.step = b.compute + b.recompute + b.tp_comm + b.cp_comm + b.pp_bubble + b.pp_p2p + b.dp_comm + b.optimizer;
  b.tokens_per_second = double(run.tokens_per_step()) / b.step;
  b.peak_flops = x.peak;
  b.model_flops_per_gpu = model_flops_per_step(m, run) / b.step / double(l.world());
  b.mfu = mfu(model_flops_per_step(m, run) / b.step, l.world(), x.peak);
  if (l.fp8 != Fp8Recipe::off && cluster.device.has_fp8()) {
    b.fp8_peak_flops = cluster.device.peak_fp8_flops;
    b.fp8_peak_utilization = mfu(model_flops_per_step(m, run) / b.step, l.world(), b.fp8_peak_flops);
  }
  return b;
}

StepBounds step_bounds(const ModelSpec& m, const RunSpec& run, const Layout& shape, const ClusterSpec& cluster,
                       const CostConstants& k, const std::vector<std::pair<Checkpointing, int64_t>>& ckpts,
                       const std::vector<AttentionKind>& attentions, const std::vector<NormKind>& norms,
                       const std::vector<int64_t>& zeros, const std::vector<GradPrecision>& grads) {
  // predict()'s parts, each at its least over what the other term's knobs
  // leave open:
  // - per checkpointing, attention and norm: compute, tensor- and
  //   context-parallel time at the cheaper of the first and last stage
  //   (predict's slowest is one of them), the recomputation (the same on
  //   both), the bubble at the slower, and the stage-to-stage hops;
  // - per ZeRO stage and gradient type: the data-parallel time at the least
  //   its hiding window allows (the window is the backward, which these
  //   knobs do not set: the smaller of none and an unbounded one), the
  //   optimizer and the tied embedding's exchange.
  StepBounds b;
  b.attentions = attentions.size();
  b.norms = norms.size();
  b.grads = grads.size();
  const double mbs = double(shape.micro_batches(run));
  const double tp_share = std::max(0.0, 1.0 - k.tp_overlap * (1.0 - k.overlap_cost));
  const bool shared_cores = cluster.device.measured && cluster.device.measured->shared_cores;
  b.kernels.assign(ckpts.size() * attentions.size() * norms.size(), 0.0);
  for (size_t a = 0; a < attentions.size(); ++a)
    for (size_t n = 0; n < norms.size(); ++n) {
      Layout l = shape;
      l.attention = attentions[a];
      l.norm = norms[n];
      const Model x = model_of(m, run, l, cluster, k);
      const Blocks keep = stage_blocks(x);
      const auto [first, last] = stage_costs(x, keep, keep, l.stage_layers(m), 0);
      const double hops = pp_hops(x, mbs);
      for (size_t c = 0; c < ckpts.size(); ++c) {
        Layout lc = l;
        lc.ckpt = ckpts[c].first;
        lc.ckpt_layers = ckpts[c].second;
        const double n_ckpt = double(lc.checkpointed_layers(m));
        // The first and last stage's blocks differ under FP8 (fp8@N): the
        // lesser of each redone part bounds the slower stage's.
        const Blocks rb = with_recompute(keep, lc.ckpt);
        const auto least = [&](double Part::*f) { return std::min(rb.first.*f, rb.last.*f); };
        const double redo = n_ckpt * std::min(rb.first.recompute + rb.first.recompute_tp + rb.first.recompute_cp,
                                              rb.last.recompute + rb.last.recompute_tp + rb.last.recompute_cp);
        double t = mbs * std::min(first.fwd + first.bwd, last.fwd + last.bwd) +
                   mbs * n_ckpt * least(&Part::recompute) +
                   mbs * (std::min(first.tp, last.tp) + n_ckpt * least(&Part::recompute_tp)) * tp_share +
                   mbs * (std::min(first.cp, last.cp) + n_ckpt * least(&Part::recompute_cp)) + hops;
        if (!shared_cores) t += double(l.pp - 1) / double(l.vpp) * (std::max(first.total(), last.total()) + redo);
        b.kernels[(c * attentions.size() + a) * norms.size() + n] = t;
      }
    }
  b.sharding.assign(zeros.size() * grads.size(), 0.0);
  for (size_t z = 0; z < zeros.size(); ++z)
    for (size_t g = 0; g < grads.size(); ++g) {
      Layout l = shape;
      l.zero = zeros[z];
      l.grad = grads[g];
      const Model x = model_of(m, run, l, cluster, k);
      // A window past any backward (and finite: no ZeRO stage's window times
      // a dp_overlap of 0 may make a NaN).
      constexpr double unbounded = 1e200;
      const Sharding hidden = sharding_cost(x, mbs, unbounded, unbounded), bare = sharding_cost(x, mbs, 0, 0);
      b.sharding[z * grads.size() + g] =
          std::min(hidden.dp_comm, bare.dp_comm) + hidden.optimizer + hidden.tied_p2p;
    }
  return b;
}

double StepBounds::of(size_t c, size_t a, size_t n, size_t z, size_t g) const {
  // predict() sums its parts in another order: rounding may put its step a
  // few ulps under this sum.
  return (kernels[(c * attentions + a) * norms + n] + sharding[z * grads + g]) * (1 - 1e-9);
}

void to_json(nlohmann::json& j, const CostConstants& k) {
  j = nlohmann::json{{"gemm_efficiency", k.gemm_efficiency},
                     {"gemm_tile_m", k.gemm_tile_m},
                     {"gemm_tile_n", k.gemm_tile_n},
                     {"gemm_k_half", k.gemm_k_half},
                     {"flash_efficiency", k.flash_efficiency},
                     {"memory_efficiency", k.memory_efficiency},
                     {"intra_efficiency", k.intra_efficiency},
                     {"inter_efficiency", k.inter_efficiency},
                     {"launch_overhead", k.launch_overhead},
                     {"dp_overlap", k.dp_overlap},
                     {"tp_overlap", k.tp_overlap},
                     {"overlap_cost", k.overlap_cost},
                     {"fp8_gemm_efficiency", k.fp8_gemm_efficiency},
                     {"fp8_k_half", k.fp8_k_half}};
}

void from_json(const nlohmann::json& j, CostConstants& k) {
  auto get = [&](const char* key, double& v) {
    if (j.contains(key)) v = j[key].get<double>();
  };
  get("gemm_efficiency", k.gemm_efficiency);
  get("gemm_tile_m", k.gemm_tile_m);
  get("gemm_tile_n", k.gemm_tile_n);
  get("gemm_k_half", k.gemm_k_half);
  get("flash_efficiency", k.flash_efficiency);
  get("memory_efficiency", k.memory_efficiency);
  get("intra_efficiency", k.intra_efficiency);
  get("inter_efficiency", k.inter_efficiency);
  get("launch_overhead", k.launch_overhead);
  get("dp_overlap", k.dp_overlap);
  get("tp_overlap", k.tp_overlap);
  get("overlap_cost", k.overlap_cost);
  get("fp8_gemm_efficiency", k.fp8_gemm_efficiency);
  get("fp8_k_half", k.fp8_k_half);
}

void to_json(nlohmann::json& j, const CostBreakdown& b) {
  j = nlohmann::json{{"compute_s", b.compute},     {"recompute_s", b.recompute},
                     {"tp_comm_s", b.tp_comm},     {"cp_comm_s", b.cp_comm},
                     {"pp_bubble_s", b.pp_bubble},
                     {"pp_p2p_s", b.pp_p2p},       {"dp_comm_s", b.dp_comm},
                     {"optimizer_s", b.optimizer}, {"step_s", b.step},
                     {"tokens_per_s", b.tokens_per_second},
                     {"model_flops_per_gpu", b.model_flops_per_gpu},
                     {"mfu", b.mfu},               {"peak_flops", b.peak_flops}};
  if (b.fp8_peak_flops > 0) {
    j["fp8_peak_flops"] = b.fp8_peak_flops;
    j["fp8_peak_utilization"] = b.fp8_peak_utilization;
  }
}

}  // namespace weft::tuner
