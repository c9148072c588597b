// The analytic cost model: predicted step time of a layout, split into
// compute, recomputation, exposed tensor- and context-parallel communication,
// pipeline bubble and point-to-point, exposed data-parallel reduction and
// optimizer.
// It ranks layouts; the profiler decides. Its constants start from the device
// preset (cost_defaults) and are refit to measured steps by calibration.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/device_spec.h"
#include "core/layout.h"
#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft::tuner {

struct CostConstants {
  double gemm_efficiency = 0.8;       // fraction of peak a large, well-shaped GEMM reaches
  double gemm_tile_m = 128;           // output tile of the GEMM kernels (wave quantisation)
  double gemm_tile_n = 128;
  double gemm_k_half = 64;            // K at which the main loop's prologue halves efficiency
  double flash_efficiency = 0.5;      // fraction of peak of flash attention fwd+bwd
  double cudnn_efficiency = 0.5;      // the same for cuDNN's fused SDPA (attn:cudnn), a kernel of its own
  // The sequence length (per kernel call) at which a causal tiled attention
  // kernel reaches half the efficiencies above, which are its long-sequence
  // values: each query tile's fixed work (loading it, the softmax's
  // bookkeeping, writing its output and statistics) is spread over the keys
  // it runs against, so efficiency goes as T / (T + attention_t_half). 0:
  // none (profiles written before it).
  double attention_t_half = 0;
  double memory_efficiency = 0.8;     // fraction of memory bandwidth of streaming kernels
  double intra_efficiency = 0.75;     // NCCL bus bandwidth / NVLink bandwidth
  double inter_efficiency = 0.85;     // NCCL bus bandwidth / network bandwidth
  double launch_overhead = 4e-6;      // seconds per kernel launch
  double dp_overlap = 1.0;            // fraction of the backward that hides DP reduction
  double tp_overlap = 0.0;            // fraction of TP communication hidden by compute
  double overlap_cost = 0.15;         // slowdown of compute per second of communication it hides
  // FP8 GEMMs (layouts with an fp8 recipe, on a device with FP8 tensor
  // cores): the fraction of the dense FP8 peak a large one reaches, and the
  // K at which its main loop's prologue halves it (an FP8 K tile holds twice
  // the elements of a bf16 one, so short K loops cost FP8 more).
  double fp8_gemm_efficiency = 0.7;
  double fp8_k_half = 128;
  // Mixture-of-Experts blocks, as fractions of what the terms above give
  // them (1: priced as dense GEMMs and plain all-to-alls, the datasheet's
  // and a measured profile's value). expert_gemm_efficiency: the routed
  // experts' GEMMs, a grouped kernel over every local expert's rows, against
  // one GEMM of each expert's shape (its per-expert tails and scheduling);
  // fp8_expert_gemm_efficiency: the same for their FP8 GEMMs, on top (a
  // grouped FP8 kernel's per-expert scales and casts); dispatch_efficiency:
  // the expert-parallel dispatch and combine against the all-to-all's link
  // model (a dispatcher that sends a token once per node it routes to moves
  // fewer bytes over the network than top-k copies). Fitted to the public
  // MoE rows (calibration/fidelity.h).
  double expert_gemm_efficiency = 1.0;
  double fp8_expert_gemm_efficiency = 1.0;
  double dispatch_efficiency = 1.0;

  bool operator==(const CostConstants&) const = default;
};

// The constants a device starts from: its preset's fitted profile
// (calibration/profiles/, fitted to public measured runs) where it has one,
// else datasheet_constants().
CostConstants cost_defaults(const DeviceSpec& device);
// Constants from datasheets and published kernel efficiencies, with their
// sources beside them in cost.cpp (the fit's starting point).
CostConstants datasheet_constants(const DeviceSpec& device);

struct CostBreakdown {
  double compute = 0;    // GEMMs, attention, memory-bound ops: m micro-batches on the slowest stage
  double recompute = 0;  // forward work redone by activation checkpointing
  double tp_comm = 0;    // exposed tensor/sequence-parallel collectives
  double cp_comm = 0;    // exposed context-parallel K/V exchanges (ring, all-gather or all-to-all)
  double pp_bubble = 0;  // pipeline fill and drain
  double pp_p2p = 0;     // exposed stage-to-stage transfers
  double dp_comm = 0;    // exposed gradient reduction and ZeRO gathers (over dp x cp)
  double optimizer = 0;  // AdamW over this rank's shard
  double step = 0;       // the sum: predicted seconds per optimizer step

  double tokens_per_second = 0;
  double model_flops_per_gpu = 0;  // model FLOP/s per device (6N + 12LCT accounting)
  double mfu = 0;
  double peak_flops = 0;           // the per-device peak the MFU is against (dense bf16 on a GPU, FP8 or not)
  // FP8 layouts on a device with FP8 tensor cores: the dense FP8 peak and the
  // model FLOP/s as a fraction of it (a second figure, never "the" MFU); 0
  // otherwise.
  double fp8_peak_flops = 0;
  double fp8_peak_utilization = 0;
};

CostBreakdown predict(const ModelSpec& m, const RunSpec& run, const Layout& l,
                      const ClusterSpec& cluster, const CostConstants& k);

// Each pipeline stage's time for one micro-batch (its blocks' forward and
// backward with their recomputation and exposed tp and cp communication, the
// first stage's embedding, the last's head and loss), stage 0 first: what
// predict() takes the slowest of. The spread of these is a split's balance.
std::vector<double> stage_times(const ModelSpec& m, const RunSpec& run, const Layout& l, const ClusterSpec& cluster,
                                const CostConstants& k);

// Lower bounds on predict(...).step for the layouts of one parallel shape
// (`shape`'s tp, cp and its transport, pp, dp, mb, vpp and sp): a term per
// (checkpointing, attention, norm) choice and one per (ZeRO stage, gradient
// type) choice, the indices into the lists step_bounds() was given; their
// sum bounds the step of the layout with those choices. What the space's
// search (tuner/space.h) skips layouts and shapes by.
// A ZeRO stage with its shard group (Layout::zero and zero_group; group 0:
// all dp x cp ranks), one choice of the space's ZeRO knob.
struct ZeroChoice {
  int64_t stage = 0;
  int64_t group = 0;
  void apply(Layout& l) const {
    l.zero = stage;
    l.zero_group = group;
  }
  bool operator==(const ZeroChoice&) const = default;
};

struct StepBounds {
  size_t attentions = 0, norms = 0, grads = 0;
  std::vector<double> kernels;   // [(c * attentions + a) * norms + n]
  std::vector<double> sharding;  // [z * grads + g]
  double of(size_t c, size_t a, size_t n, size_t z, size_t g) const;
};
// One block's cost, which step_bounds() computes for every shape, depends
// on few of the layout's knobs (tp, cp and its transport, mb, sp, the
// attention, the norm and the FP8 recipe), so the shapes of one search
// share most of them. A cache holds them for one model, run, cluster and
// constants (step_bounds checks that they are the ones it was filled with)
// and one thread.
class BlockCostCache {
 public:
  BlockCostCache();
  ~BlockCostCache();
  BlockCostCache(BlockCostCache&&) noexcept;
  BlockCostCache& operator=(BlockCostCache&&) noexcept;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};
StepBounds step_bounds(const ModelSpec& m, const RunSpec& run, const Layout& shape, const ClusterSpec& cluster,
                       const CostConstants& k, const std::vector<std::pair<Checkpointing, int64_t>>& ckpts,
                       const std::vector<AttentionKind>& attentions, const std::vector<NormKind>& norms,
                       const std::vector<ZeroChoice>& zeros, const std::vector<GradPrecision>& grads,
                       BlockCostCache* cache = nullptr);

// Efficiency of one (M x K) * (K x N) GEMM on the device: the large-shape
// efficiency, times wave quantisation of its output tiles over the SMs, times
// the prologue cost of a short K loop.
double gemm_efficiency(double M, double N, double K, const DeviceSpec& device,
                       const CostConstants& k);
// The same for an FP8 GEMM, as a fraction of the dense FP8 peak: the FP8
// large-shape efficiency, the same wave quantisation, and the prologue of a
// short K loop at fp8_k_half.
double fp8_gemm_efficiency(double M, double N, double K, const DeviceSpec& device, const CostConstants& k);
// Whether a linear layer of local shape (M x K) * (K x N) runs in FP8 under
// an FP8 recipe: the FP8 tensor cores take only dims that are multiples of 16.
bool fp8_gemm_shape(double M, double N, double K);
// The blocks of pipeline stage `stage` whose linear layers run in FP8 (stage
// s holds virtual stages s, s + pp, ... of L / (pp * vpp) blocks).
int64_t fp8_stage_blocks(const ModelSpec& m, const Layout& l, int64_t stage);


void to_json(nlohmann::json& j, const CostConstants& k);
void from_json(const nlohmann::json& j, CostConstants& k);
void to_json(nlohmann::json& j, const CostBreakdown& b);

}  // namespace weft::tuner
