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

#include "core/error.h"
#include "core/flops.h"
#include "memory/dense_split.h"
#include "memory/shapes.h"
#include "tuner/cost_parts.h"
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

namespace {
// Causal attention's efficiency against sequence length, measured on an
// H200 (benchmarks/RESULTS.md, causal GQA 32/8 D 128, forward + backward,
// 16,384 tokens as B 8 T 2048 and B 2 T 8192): cuDNN's fused SDPA ran 1.26x
// and PyTorch's flash backend 1.29x the TFLOP/s at T 8192 than at 2048,
// which T / (T + h) gives for h = 761 and 877. Between the two.
constexpr double kAttentionTHalf = 800;
}  // namespace

CostConstants datasheet_constants(const DeviceSpec& device) {
  CostConstants k;
  if (device.kind == DeviceKind::cpu) {
    // OpenBLAS sgemm reaches 60-80% of the AVX2/AVX-512 FMA peak on large
    // shapes; the CPU attention and streaming loops are far from peak.
    k.gemm_efficiency = 0.6;
    k.gemm_tile_m = k.gemm_tile_n = 16;
    k.flash_efficiency = k.cudnn_efficiency = 0.15;  // no cuDNN on a CPU
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
    k.attention_t_half = kAttentionTHalf;
    // No measurement of cuDNN's fused attention on Ampere, where Transformer
    // Engine prefers FlashAttention-2: priced as flash (also after a fit).
    k.cudnn_efficiency = k.flash_efficiency;
    k.intra_efficiency = 0.75;
  } else {
    // Hopper: large bf16 GEMMs measured at ~790 TFLOP/s on an H200 (0.8 of
    // dense peak); FlashAttention-2-class kernels reach ~40% of peak; NCCL
    // bus bandwidth ~360 of 450 GB/s over NVLink 4.
    k.gemm_efficiency = 0.8;
    k.flash_efficiency = 0.4;
    k.attention_t_half = kAttentionTHalf;
    // cuDNN's fused SDPA (causal, GQA 32/8, D 128, forward + backward)
    // measured on an H200 at 416 TFLOP/s at B 8 T 2048 and 522 at B 2
    // T 8192 (0.42 and 0.53 of the dense bf16 peak; benchmarks/RESULTS.md);
    // with attention_t_half 800 both are 0.58 at long sequences (0.417 and
    // 0.528 at those lengths). Transformer Engine prefers it to
    // FlashAttention-2 on Hopper.
    k.cudnn_efficiency = 0.58;
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

// Both rules are the memory model's, which the trainer follows too.
bool fp8_gemm_shape(double M, double N, double K) {
  const auto whole = [](double d) { return d == std::floor(d) && d < 9.0e18; };
  return whole(M) && whole(N) && whole(K) && memory::fp8_gemm_dims(int64_t(M), int64_t(K), int64_t(N));
}

int64_t fp8_stage_blocks(const ModelSpec& m, const Layout& l, int64_t stage) {
  if (l.fp8 == Fp8Recipe::off || l.pp <= 0 || l.vpp <= 0) return 0;
  memory::StagePlan plan;
  plan.stage = stage;
  return memory::fp8_stage_blocks(m, l, plan);
}

namespace {

using namespace cost_parts;

// What a layout's ZeRO stage and gradient type decide: the exposed
// data-parallel reduction (and ZeRO's gathers), the optimizer over this
// rank's shard, and the tied embedding's exchange between the first and last
// stage. `bwd_mb` and `t_mb` are the slowest stage's backward (with its
// recomputation) and whole time per micro-batch, which hide the reduction.
struct Sharding {
  double dp_comm = 0, optimizer = 0, tied_p2p = 0;
};

// sharding_cost's terms before the backward's window hides part of the
// reduction: the window is window_bwd * bwd_mb + window_t * t_mb.
struct ShardingTerms {
  Sharding fixed;  // optimizer and tied_p2p; dp_comm is set by with_window
  bool sharded = false;
  double reduce = 0, gather = 0, floor = 0, window_bwd = 0, window_t = 0;
};

// The parameters sharding_terms reduces and shards, which no ZeRO stage or
// gradient type changes (step_bounds takes them once per shape): the most
// any stage compared holds, its routed experts' part, and the first stage's.
struct StageParams {
  double psi = 0, experts = 0, first = 0;
};

StageParams stage_params_of(const Model& x) {
  const ModelSpec& m = x.m;
  const Layout& l = x.l;
  const double C = double(m.hidden), Vl = double(m.padded_vocab(l.tp)) / double(l.tp);
  const bool lora = x.run.lora.enabled();
  // Data parallelism over the larger of the first and last stage's params:
  // gradients sum, and ZeRO shards, over the dp x cp ranks (each cp rank saw
  // its part of every sequence).
  // Under LoRA only the adapters have gradients and optimizer state, and
  // only they are reduced and sharded.
  // An MoE model's share of MoE layers (counted once: every candidate
  // comes here).
  const double moe_share = m.moe.enabled() ? double(m.moe_layers()) / double(m.layers) : 0.0;
  const double dense_block = lora ? double(memory::lora_block_elements(m, l, x.run.lora, false))
                                  : double(memory::dense_block_param_elements(m, l));
  const double moe_block = !m.moe.enabled() ? 0.0
                           : lora           ? double(memory::lora_block_elements(m, l, x.run.lora, true))
                                            : double(memory::moe_block_param_elements(m, l));
  const double expert_block = m.moe.enabled() ? double(memory::moe_block_expert_elements(m, l, x.run.lora)) : 0.0;
  const auto stage_params = [&](int64_t stage, double layers) {
    const bool emb = stage == 0, head = stage == l.pp - 1;
    // An MoE model's blocks: its MoE layers' share of the stage's at the
    // MoE block's size (the router, this ep rank's experts, the shared
    // expert's tp part; under LoRA their adapters), the rest dense.
    const double moe = layers * moe_share;
    double n = (layers - moe) * dense_block + moe * moe_block;
    if (lora) return n;
    if (emb) n += Vl * C;
    if (head) n += C + (m.tied_embeddings && emb ? 0 : Vl * C);
    return n;
  };
  // The routed experts' part of them (this ep rank's; under LoRA their
  // adapters), which under expert parallelism sums over the expert
  // data-parallel group alone.
  const auto stage_experts = [&](double layers) { return layers * moe_share * expert_block; };
  // (An uneven split's middle stage may hold more.)
  const int64_t mid = middle_stage(m, l);
  const double first = double(l.stage_layers(m, 0)), last = double(l.stage_layers(m, l.pp - 1));
  const double middle = mid > 0 ? double(l.stage_layers(m, mid)) : 0.0;
  StageParams p;
  p.first = stage_params(0, first);
  p.psi = std::max({p.first, stage_params(l.pp - 1, last), mid > 0 ? stage_params(mid, middle) : 0.0});
  p.experts = std::max({stage_experts(first), stage_experts(last), mid > 0 ? stage_experts(middle) : 0.0});
  return p;
}

ShardingTerms sharding_terms(const Model& x, double mbs, const StageParams& params) {
  const ModelSpec& m = x.m;
  const Layout& l = x.l;
  const double C = double(m.hidden), Vl = double(m.padded_vocab(l.tp)) / double(l.tp);
  ShardingTerms terms;
  Sharding& s = terms.fixed;
  // Tied embeddings: the first and last stages exchange the table's
  // gradient (fp32 or bf16, as the layout keeps gradients) after the
  // backward, there and back; under ZeRO-1 and -2 each first gathers its
  // copy's reduced gradient over dp x cp.
  const bool lora = x.run.lora.enabled();
  if (l.pp > 1 && m.tied_embeddings && !lora) {
    const double table = double(l.grad_bytes()) * Vl * C;
    s.tied_p2p = 2 * x.p2p(table);
    if (l.zero >= 1 && l.shard_ways() > 1) s.tied_p2p += all_gather(table, x.zero_group());
  }
  const double psi = params.psi, experts = params.experts;
  const Group dg = x.shard_group(), zg = x.zero_group();
  const double grad_bytes = double(l.grad_bytes()) * psi, param_bytes = x.a * psi;
  double reduce = 0, gather = 0, window_bwd = 0, window_t = 0;
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
      if (l.ep > 1) {
        // Expert parallelism: after the backward (nothing beside it), over
        // the expert data-parallel group, then all but the experts over ep.
        reduce = all_reduce(grad_bytes, x.expert_dp_group()) +
                 all_reduce(double(l.grad_bytes()) * (psi - experts), x.replica_group());
        break;
      }
      reduce = all_reduce(grad_bytes, dg);
      window_bwd = 1;
      break;
    case 1:
      reduce = reduce_scatter(grad_bytes, zg);
      gather = all_gather(param_bytes, zg);
      window_bwd = 1;
      break;
    case 2:
      reduce = mbs * reduce_scatter(grad_bytes, zg);
      gather = all_gather(param_bytes, zg);
      window_bwd = mbs;
      tail_share = 1.0 / mbs;
      break;
    default:
      reduce = mbs * (reduce_scatter(grad_bytes, zg) + 2 * all_gather(param_bytes, zg));
      window_t = mbs;
      break;
  }
  // Hybrid sharding's second level: each group's final shard piece
  // all-reduced over the shard groups that hold it, once a step, one group
  // behind the reduce-scatters and hidden beside the backward as they are.
  if (l.zero >= 1 && l.hybrid_sharding())
    reduce += all_reduce(grad_bytes / double(l.zero_shards()), x.replica_group());
  // Expert parallelism's: the shards less the experts' ranges, over ep (an
  // all-reduce, or under the dense split a reduce-scatter of the gradients
  // and an all-gather of the updated weights: the same volume).
  if (l.zero >= 1 && l.ep > 1)
    reduce += all_reduce(double(l.grad_bytes()) * (psi - experts) / double(l.zero_shards()), x.replica_group());
  if (l.shard_ways() > 1) {
    // The group reduced last is exposed: the embedding table, whose
    // gradient is final only at the very end of the first stage's backward.
    // (Under LoRA a block's adapters.)
    const double tail = lora ? 1.0 / double(std::max<int64_t>(1, l.stage_layers(m, 0)))
                             : std::min(1.0, Vl * C / params.first);
    terms.sharded = true;
    terms.reduce = reduce;
    terms.gather = gather;
    terms.floor = reduce * tail * tail_share;
    terms.window_bwd = window_bwd;
    terms.window_t = window_t;
  }

  // The elements this rank updates: its shard, of which under the dense
  // split (memory/dense_split.h) only its part of the dense elements.
  const double shard = l.zero == 0           ? psi
                       : memory::dense_split(l) ? (experts + (psi - experts) / double(l.zero_replicas())) /
                                                      double(l.zero_shards())
                                              : psi / double(l.zero_shards());
  s.optimizer = x.stream("adamw", shard, double(l.grad_bytes()));

  return terms;
}

// The terms with the backward's window: one micro-batch's backward bwd_mb
// (its recomputation included) and its whole time t_mb.
Sharding with_window(const ShardingTerms& terms, const CostConstants& k, double bwd_mb, double t_mb) {
  Sharding s = terms.fixed;
  if (!terms.sharded) return s;
  const double window = terms.window_bwd * bwd_mb + terms.window_t * t_mb;
  // Hidden communication is not free: NCCL kernels take SMs and memory
  // bandwidth from the compute they overlap (10-20% slowdowns are typical).
  const double exposed = std::max(terms.reduce - k.dp_overlap * window, terms.floor);
  s.dp_comm = exposed + k.overlap_cost * (terms.reduce - exposed) + terms.gather;
  return s;
}

Sharding sharding_cost(const Model& x, double mbs, double bwd_mb, double t_mb) {
  return with_window(sharding_terms(x, mbs, stage_params_of(x)), x.k, bwd_mb, t_mb);
}

// The FP8 copies of the weights, which no ZeRO stage or gradient type
// changes: each FP8 block's weights cast once per step, when the optimizer
// has updated them (codes and transpose, with a tensorwise amax all-reduce
// each), on the stage with more FP8 blocks (added to the optimizer's time);
// delayed scaling reduces every amax of the step over all ranks at once:
// one small all-reduce (3 operands of 7 linears per block), after the
// backward, exposed (added to the data-parallel time).
Sharding fp8_weight_casts(const Model& x) {
  const ModelSpec& m = x.m;
  const Layout& l = x.l;
  Sharding s;
  if (l.fp8 == Fp8Recipe::off) return s;
  const double C = double(m.hidden);
  const int64_t mid = middle_stage(m, l);
  Model f8 = x;
  f8.fp8 = true;
  const double M = double(l.mb * x.run.seq) / double(l.cp), D = double(m.head_dim), t = double(l.tp);
  const double Hl = double(m.heads) / t, Kl = double(m.kv_heads) / t, Fl = double(m.intermediate) / t;
  const std::pair<double, double> linears[] = {{Hl * D, C}, {Kl * D, C}, {Kl * D, C}, {C, Hl * D},
                                               {Fl, C},     {Fl, C},     {C, Fl}};
  // An MoE model's blocks: the dense FFN's three in its dense share of the
  // layers, and in the MoE share its routed experts' (this rank's E / ep,
  // three each) and shared expert's when in FP8 (memory::moe_fp8_experts,
  // moe_fp8_shared; a scale per weight, each reduced where tp splits it).
  const double moe_share = m.moe.enabled() ? double(m.moe_layers()) / double(m.layers) : 0.0;
  double per_block = 0;
  for (int i = 0; i < kLinears; ++i) {
    const auto [N, K] = linears[i];
    const double share = i >= int(Linear::gate) ? 1.0 - moe_share : 1.0;
    if (f8.in_fp8(M, N, K)) per_block += share * (f8.fp8_cast(N * K) + f8.fp8_amax_reduce());
  }
  if (moe_share > 0 && x.c.device.has_fp8()) {
    const double El = double(m.moe.experts / l.ep), Fe = double(m.moe.expert_intermediate / l.etp);
    const double Fs = double(m.moe.shared_intermediate) / t;
    if (memory::moe_fp8_experts(m, l)) per_block += moe_share * 3 * El * (f8.fp8_cast(Fe * C) + f8.fp8_amax_reduce());
    if (memory::moe_fp8_shared(m, l)) per_block += moe_share * 3 * (f8.fp8_cast(Fs * C) + f8.fp8_amax_reduce());
  }
  const int64_t blocks = std::max({fp8_stage_blocks(m, l, 0), fp8_stage_blocks(m, l, l.pp - 1),
                                   mid > 0 ? fp8_stage_blocks(m, l, mid) : 0});
  s.optimizer += double(blocks) * per_block;
  if (l.fp8 == Fp8Recipe::delayed)
    s.dp_comm += all_reduce(4.0 * 3 * 7 * double(m.layers), x.group(l.world(), 1));
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

  const auto [first, last] =
      stage_costs(x, keep, ckpt, stage_layers_of(m, l, 0), stage_layers_of(m, l, l.pp - 1));
  // The slowest stage sets the pace (and the bubble): the first or the last,
  // or under an uneven split a middle one with more blocks.
  StageCost slow = first.total() >= last.total() ? first : last;
  if (const int64_t mid = middle_stage(m, l); mid > 0) {
    const StageCost between = middle_cost(keep.mid, ckpt.mid, stage_layers_of(m, l, mid));
    if (between.total() > slow.total()) slow = between;
  }
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
  Sharding sh = sharding_cost(x, mbs, slow.bwd + slow.recompute, t_mb);
  const Sharding casts = fp8_weight_casts(x);
  sh.optimizer += casts.optimizer;
  sh.dp_comm += casts.dp_comm;
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

std::vector<double> stage_times(const ModelSpec& m, const RunSpec& run, const Layout& l, const ClusterSpec& cluster,
                                const CostConstants& k) {
  const Model x = model_of(m, run, l, cluster, k);
  Model f8 = x, plain = x;
  f8.fp8 = true;
  plain.fp8 = false;
  const Part p16 = block_cost(plain), p8 = l.fp8 == Fp8Recipe::off ? p16 : block_cost(f8);
  const Blocks keep = stage_blocks(x), ckpt = with_recompute(keep, l.ckpt);
  const auto [first, last] =
      stage_costs(x, keep, ckpt, stage_layers_of(m, l, 0), stage_layers_of(m, l, l.pp - 1));
  std::vector<double> t(size_t(l.pp));
  t.front() = first.total();
  t.back() = last.total();
  for (int64_t s = 1; s + 1 < l.pp; ++s) {
    const StageLayers n = stage_layers_of(m, l, s);
    const Part blk = mix(p8, p16, double(fp8_stage_blocks(m, l, s)) / double(std::max<int64_t>(1, n.layers)));
    t[size_t(s)] = middle_cost(blk, with_recompute(blk, l.ckpt), n).total();
  }
  return t;
}

StepBounds step_bounds(const ModelSpec& m, const RunSpec& run, const Layout& shape, const ClusterSpec& cluster,
                       const CostConstants& k, const std::vector<std::pair<Checkpointing, int64_t>>& ckpts,
                       const std::vector<AttentionKind>& attentions, const std::vector<NormKind>& norms,
                       const std::vector<ZeroChoice>& zeros, const std::vector<GradPrecision>& grads,
                       BlockCostCache* cache) {
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
  // The layers each checkpointing choice redoes on the stage that redoes
  // fewest of those compared (the split's, not the kernels').
  const int64_t mid = middle_stage(m, shape);
  Layout l = shape;  // (one copy, its knobs set in turn: a Layout's split allocates)
  std::vector<double> redone_layers(ckpts.size());
  for (size_t c = 0; c < ckpts.size(); ++c) {
    l.ckpt = ckpts[c].first;
    l.ckpt_layers = ckpts[c].second;
    const int64_t first = l.checkpointed_layers(m, 0);
    redone_layers[c] = double(std::min({first, shape.pp > 1 ? l.checkpointed_layers(m, shape.pp - 1) : first,
                                        mid > 0 ? l.checkpointed_layers(m, mid) : first}));
  }
  l = shape;
  // The embedding's and the head's, which only the norm of these knobs sets.
  std::vector<EdgeCosts> edges(norms.size());
  for (size_t n = 0; n < norms.size(); ++n) {
    l.norm = norms[n];
    edges[n] = edge_costs(model_of(m, run, l, cluster, k), cache);
  }
  // The stages' blocks, which neither knob of the loop below sets.
  StageLayers first_n = stage_layers_of(m, l, 0), last_n = stage_layers_of(m, l, l.pp - 1);
  first_n.n_ckpt = last_n.n_ckpt = 0;
  StageLayers mid_n = mid > 0 ? stage_layers_of(m, l, mid) : first_n;
  mid_n.n_ckpt = 0;
  const double hops = pp_hops(model_of(m, run, l, cluster, k), mbs);  // (no knob of the loop sets them)
  for (size_t a = 0; a < attentions.size(); ++a)
    for (size_t n = 0; n < norms.size(); ++n) {
      l.attention = attentions[a];
      l.norm = norms[n];
      const Model x = model_of(m, run, l, cluster, k);
      const Blocks keep = stage_blocks(x, cache);
      const auto [first, last] = stage_costs(x, edges[n], keep, keep, first_n, last_n);
      // Under an uneven split the slowest stage may be a middle one: each
      // least below takes it in too.
      const StageCost between = mid > 0 ? middle_cost(keep.mid, keep.mid, mid_n) : first;
      // The stages' parts the checkpointing choice does not set.
      const double compute = std::min({first.fwd + first.bwd, last.fwd + last.bwd, between.fwd + between.bwd});
      const double tp = std::min({first.tp, last.tp, between.tp}), cp = std::min({first.cp, last.cp, between.cp});
      // predict()'s slowest stage holds at least the total of every stage
      // compared (each without its recomputation), of which the exposed
      // share of tp is at least tp_share: the slower of the stages bounds
      // too, and is tighter where they differ (an uneven split's middle).
      const double slowest = mbs * std::min(1.0, tp_share) * std::max({first.total(), last.total(), between.total()});
      const double bubble_stage = std::max(first.total(), last.total());
      for (size_t c = 0; c < ckpts.size(); ++c) {
        const double n_ckpt = redone_layers[c];
        // The first and last stage's blocks differ under FP8 (fp8@N): the
        // lesser of each redone part bounds the slower stage's.
        const Checkpointing mode = ckpts[c].first;
        const Redone rf = redone(keep.first, mode), rl = redone(keep.last, mode), rm = redone(keep.mid, mode);
        const auto least = [&](double Redone::*f) { return std::min({rf.*f, rl.*f, rm.*f}); };
        const auto all = [](const Redone& r) { return r.compute + r.tp + r.cp; };
        const double redo = n_ckpt * std::min(all(rf), all(rl));
        double t = mbs * compute + mbs * n_ckpt * least(&Redone::compute) +
                   mbs * (tp + n_ckpt * least(&Redone::tp)) * tp_share + mbs * (cp + n_ckpt * least(&Redone::cp));
        t = std::max(t, slowest);
        t += hops;
        if (!shared_cores) t += double(l.pp - 1) / double(l.vpp) * (bubble_stage + redo);
        b.kernels[(c * attentions.size() + a) * norms.size() + n] = t;
      }
    }
  b.sharding.assign(zeros.size() * grads.size(), 0.0);
  const Model whole = model_of(m, run, shape, cluster, k);
  const Sharding casts = fp8_weight_casts(whole);          // the same for each choice
  const StageParams params = stage_params_of(whole);  // and these
  l = shape;
  for (size_t z = 0; z < zeros.size(); ++z)
    for (size_t g = 0; g < grads.size(); ++g) {
      zeros[z].apply(l);
      l.grad = grads[g];
      const Model x = model_of(m, run, l, cluster, k);
      // A window past any backward (and finite: no ZeRO stage's window times
      // a dp_overlap of 0 may make a NaN).
      constexpr double unbounded = 1e200;
      const ShardingTerms terms = sharding_terms(x, mbs, params);
      const Sharding hidden = with_window(terms, k, unbounded, unbounded), bare = with_window(terms, k, 0, 0);
      b.sharding[z * grads.size() + g] = std::min(hidden.dp_comm, bare.dp_comm) + casts.dp_comm +
                                         hidden.optimizer + casts.optimizer + hidden.tied_p2p;
    }
  return b;
}

double StepBounds::of(size_t c, size_t a, size_t n, size_t z, size_t g) const {
  // predict() sums its parts in another order: rounding may put its step a
  // few ulps under this sum.
  return (kernels[(c * attentions + a) * norms + n] + sharding[z * grads + g]) * (1 - 1e-9);
}

}  // namespace weft::tuner
