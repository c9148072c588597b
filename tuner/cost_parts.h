// The pieces of the cost model (tuner/cost.h) that price one block and one
// pipeline stage: the collectives on a cluster's links, the model of a
// layout on a cluster (Model), and a block's compute and communication
// (Part), with and without recomputation. Internal to tuner/: cost.cpp
// builds a step from them, cost_block.cpp defines them.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "core/flops.h"
#include "memory/shapes.h"
#include "tuner/cost.h"
#include "tuner/device_profile.h"

namespace weft::tuner::cost_parts {

// Collective times on a ring of n ranks (NCCL's algorithm for these sizes).
struct Link {
  double bandwidth;  // bytes/s of bus bandwidth
  double latency;    // seconds per hop
};

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

double ring_all_reduce(double bytes, int64_t n, Link link);
double ring_all_gather(double bytes_full, int64_t n, Link link);
double all_reduce(double bytes, const Group& g);
double hierarchical_gather(double bytes_full, const Group& g);
double all_gather(double bytes_full, const Group& g);
double reduce_scatter(double bytes_full, const Group& g);
// Each rank sends (n - 1) / n of its `bytes_local` to the others (all_to_all).
double all_to_all(double bytes_local, const Group& g);

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
  // layout's recipe, for the blocks it puts in FP8), and whether their FFN
  // is the model's MoE one.
  bool fp8 = false;
  bool moe = false;

  double gemm(double M, double N, double K) const {
    if (rates)
      if (auto t = rates->gemm_seconds(M, N, K)) return *t;
    return 2.0 * M * N * K / (peak * gemm_efficiency(M, N, K, c.device, k)) + k.launch_overhead;
  }
  // An FP8 GEMM: at the dense FP8 peak on a device with FP8 tensor cores;
  // emulated (the CPU) it is the compute-precision GEMM. A block-scaled one
  // (fp8:blockwise) applies a scale per 128 of K inside its main loop:
  // kFp8BlockGemmRate of the tensorwise rate, an assumption until measured
  // (no public block-scaled GEMM rate is among calibration/'s rows).
  static constexpr double kFp8BlockGemmRate = 0.9;
  double gemm8(double M, double N, double K) const {
    if (!c.device.has_fp8()) return gemm(M, N, K);
    const double rate = l.fp8 == Fp8Recipe::blockwise ? kFp8BlockGemmRate : 1.0;
    return 2.0 * M * N * K / (c.device.peak_fp8_flops * fp8_gemm_efficiency(M, N, K, c.device, k) * rate) +
           k.launch_overhead;
  }
  // A linear layer X(M x K) W^T -> Y(M x N): forward, and the data- and weight-
  // gradient GEMMs of its backward.
  double linear_fwd(double M, double N, double K) const { return gemm(M, N, K); }
  double linear_bwd(double M, double N, double K) const { return gemm(M, K, N) + gemm(N, K, M); }
  // A linear layer of a block: in FP8 when the block is and its local dims
  // are multiples of 16, else as linear_fwd/linear_bwd. (Its operands' casts
  // are block_cost's, which knows which inputs the linears share.)
  bool in_fp8(double M, double N, double K) const {
    if (!fp8) return false;
    if (l.fp8 == Fp8Recipe::blockwise)
      return N == std::floor(N) && K == std::floor(K) &&
             memory::fp8_block_dims(memory::fp8_token_run(run, l), int64_t(K), int64_t(N));
    return fp8_gemm_shape(M, N, K);
  }
  double block_linear_fwd(double M, double N, double K) const {
    return in_fp8(M, N, K) ? gemm8(M, N, K) : linear_fwd(M, N, K);
  }
  // Under LoRA the base weights are frozen: the backward computes the input
  // gradient alone.
  double block_linear_bwd(double M, double N, double K) const {
    return block_linear_dgrad(M, N, K) + block_linear_wgrad(M, N, K);
  }
  // Its two halves: the input gradient, and the weight gradient (none for a
  // frozen weight).
  double block_linear_dgrad(double M, double N, double K) const {
    return in_fp8(M, N, K) ? gemm8(M, K, N) : gemm(M, K, N);
  }
  double block_linear_wgrad(double M, double N, double K) const {
    if (run.lora.enabled()) return 0;
    return in_fp8(M, N, K) ? gemm8(N, K, M) : gemm(N, K, M);
  }
  // LoRA's adapters on a linear layer (M x K -> N) of rank r: forward x A^T
  // and s h B^T; backward s dY B, g A, g^T x, the rebuilt x A^T and dY^T h;
  // with dropout, drop(x) written forward and twice backward (the input and
  // the input gradient).
  // (`rank`: the adapter's where it is not --lora's, an MoE model's experts' gate_up.)
  double lora_fwd(double M, double N, double K, int64_t rank = 0) const {
    const double r = double(rank > 0 ? rank : run.lora.rank);
    return gemm(M, r, K) + gemm(M, N, r) + (run.lora.dropout > 0 ? stream("residual", M, K) : 0);
  }
  double lora_bwd(double M, double N, double K, int64_t rank = 0) const {
    const double r = double(rank > 0 ? rank : run.lora.rank);
    return gemm(M, r, N) + gemm(M, K, r) + gemm(r, K, M) + gemm(M, r, K) + gemm(N, r, M) +
           (run.lora.dropout > 0 ? 2 * stream("residual", M, K) : 0);
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
  // Block scaling takes no amax pass (each tile's amax is found in the
  // cast's own pass) and writes a float scale per 128 codes of each of the
  // two layouts.
  double fp8_cast(double elements) const {
    const bool hw = c.device.has_fp8();
    double bytes = elements * (hw ? a + 2.0 : 2.0 * a);
    if (hw && l.fp8 == Fp8Recipe::blockwise) bytes += elements * 2.0 * 4.0 / double(kFp8BlockTile);
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
  // ZeRO's shard group: all of the above, or under hybrid sharding its
  // zero_group consecutive ranks; and the replicas that all-reduce each
  // shard, zero_group * tp ranks apart.
  // Under expert parallelism ZeRO's group is the expert data-parallel one,
  // tp * ep ranks apart, and the replicas are the ep group, ep consecutive
  // ranks of dp x cp (tp apart). Folded over tp (epfold) the ep group is ep
  // consecutive ranks, the replicas its ep / tp ranks of dp x cp (tp apart)
  // and the expert data-parallel group ep ranks apart.
  Group zero_group() const { return group(l.zero_shards(), l.ep > 1 ? l.tp * l.ep_dpcp() : l.tp); }
  Group replica_group() const {
    return l.ep > 1 ? group(l.ep_dpcp(), l.tp) : group(l.zero_replicas(), l.tp * l.zero_shards());
  }
  Group ep_group() const { return l.ep_fold ? group(l.ep, 1) : group(l.ep, l.tp); }
  Group expert_dp_group() const { return group(l.expert_dp(), l.tp * l.ep_dpcp()); }
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

AttentionTime attention_time(const Model& x, double B, double Hl, double Kl, double T, double D);
// Communication that compute hides still costs: the kernels that move it
// take SMs and memory bandwidth from the compute they overlap.
double exposed_beside(double transfer, double compute, const CostConstants& k);
// One block's time for one micro-batch, nothing recomputed (an MoE model's:
// the mean of its MoE and dense blocks).
Part block_cost(const Model& x);
// The block's time with `mode`'s recomputation.
Part with_recompute(Part p, Checkpointing mode);

struct StageCost {
  double fwd = 0, bwd = 0, tp = 0, cp = 0, recompute = 0;
  double total() const { return fwd + bwd + tp + cp + recompute; }
};

// A block of the first and of the last stage: under an FP8 recipe the mean
// of the stage's FP8 blocks and the blocks it keeps in the compute precision
// (the first and last fp8_bf16_layers of the model), as the stage's time is
// their sum. A checkpointed block is priced as the stage's mean block.
// `mid` is a block of middle_stage()'s (the first's where there is none).
struct Blocks {
  Part first, last, mid;
};

// A stage's blocks: how many, and how many of them recompute.
struct StageLayers {
  int64_t layers = 0, n_ckpt = 0;
};
StageLayers stage_layers_of(const ModelSpec& m, const Layout& l, int64_t stage);
// The stage between the first and the last that may be the slowest: none (0)
// for an even split, whose middle stages hold the first's blocks and neither
// embedding nor head; else the middle stage with the most blocks.
int64_t middle_stage(const ModelSpec& m, const Layout& l);

Part mix(const Part& a, const Part& b, double wa);
Blocks stage_blocks(const Model& x);
// The same, its block costs taken from `cache` where a shape priced them
// before (null: computed).
Blocks stage_blocks(const Model& x, BlockCostCache* cache);
Blocks with_recompute(const Blocks& b, Checkpointing mode);
// What a block redoes under `mode`: the three recompute fields with_recompute
// gives its Part, without the copy.
struct Redone {
  double compute = 0, tp = 0, cp = 0;
};
inline Redone redone(const Part& p, Checkpointing mode) {
  Redone r{p.recompute, p.recompute_tp, p.recompute_cp};
  switch (mode) {
    case Checkpointing::none: break;
    case Checkpointing::selective:
      r.compute = p.attn_fwd;
      r.cp = p.cp_fwd;
      break;
    case Checkpointing::ffn: r.compute = p.mlp_pre; break;
    case Checkpointing::full:
      r.compute = p.fwd;
      r.tp = p.tp_fwd;
      r.cp = p.cp_fwd;
      break;
  }
  return r;
}
// What the first stage adds to its blocks per micro-batch (the embedding)
// and the last (the final norm, the LM head and the loss). Of the knobs of a
// shape's layouts they read only the norm: step_bounds takes them once per
// norm, not once per attention kind too.
struct EdgeCosts {
  double embedding_fwd = 0, embedding_bwd = 0, embedding_tp = 0;
  double head_fwd = 0, head_bwd = 0, head_tp = 0;
};
EdgeCosts edge_costs(const Model& x);
// The same, taken from `cache` where a shape priced them before (null:
// computed).
EdgeCosts edge_costs(const Model& x, BlockCostCache* cache);
// The first and last stage's time per micro-batch (cost_block.cpp says how).
std::pair<StageCost, StageCost> stage_costs(const Model& x, const Blocks& keeps, const Blocks& ckpts,
                                            StageLayers first, StageLayers last);
// The same with the edges given (edge_costs(x): the same sums, bit for bit).
std::pair<StageCost, StageCost> stage_costs(const Model& x, const EdgeCosts& edges, const Blocks& keeps,
                                            const Blocks& ckpts, StageLayers first, StageLayers last);
// A middle stage's: its blocks alone.
StageCost middle_cost(const Part& keep, const Part& ckpt, StageLayers n);

}  // namespace weft::tuner::cost_parts
