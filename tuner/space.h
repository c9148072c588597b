// The layout space: every combination of the parallel and kernel knobs that
// the model and world allow, restricted by the user's pins, then validated,
// memory-pruned and ranked by the cost model (the analytic half of tuning).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/device_spec.h"
#include "core/layout.h"
#include "memory/estimate.h"
#include "tuner/cost.h"

namespace weft::tuner {

// Restrictions from the CLI (`--tp 1,2,4 --ckpt none,full ...`); an empty list
// leaves that knob free.
struct SpaceLimits {
  std::vector<int64_t> tp, pp, mb, vpp, zero;
  std::vector<bool> sp;
  std::vector<Checkpointing> ckpt;
  std::vector<int64_t> ckpt_layers;  // 0 means every layer of a stage
  std::vector<AttentionKind> attention;
  std::vector<NormKind> norm;
  std::vector<GradPrecision> grad;
  int64_t max_mb = 64;  // largest micro-batch tried when mb is free
};

// All layouts of the space. tp runs over divisors of the world that divide H,
// H_kv, F and V; pp over divisors of the rest that divide L; dp fills the world;
// mb over powers of two dividing the per-replica batch; vpp over divisors of
// L / pp (pp > 1); sp with tp > 1; ZeRO > 0 with dp > 1; full checkpointing
// also on 1/4, 1/2 and 3/4 of a stage's layers; attention flash and
// materialized, and cudnn on a GPU device (cuDNN has no CPU kernels);
// gradients in fp32, and in bf16 too when the run computes in bf16. Pins
// replace these lists (evaluate prunes a pinned cudnn on a CPU as invalid).
// The device defaults to a GPU, as DeviceSpec does.
std::vector<Layout> enumerate(const ModelSpec& m, const RunSpec& run, int64_t world,
                              const SpaceLimits& limits, DeviceKind device = DeviceKind::gpu);

enum class Verdict { fits, out_of_memory, invalid };

struct Candidate {
  Layout layout;
  Verdict verdict = Verdict::invalid;
  std::string reason;  // why it was pruned; empty when it fits
  std::string prune_class;  // "invalid: <rule>" or "oom: <category>"
  memory::MemoryEstimate memory;
  CostBreakdown cost;  // also for layouts that do not fit
};

struct SpaceReport {
  std::vector<Candidate> candidates;  // fitting ones first, by predicted step time
  int64_t evaluated = 0;
  int64_t fitting = 0;
  std::map<std::string, int64_t> pruned;  // count by prune_class
  double seconds = 0;                     // wall time of the evaluation
};

// Validates (a cudnn layout on a CPU device is invalid), memory-estimates
// and costs every layout; sorts fitting layouts
// by predicted step time, then the rest. The first becomes the layout with
// the least memory among those predicted within `tie` (a fraction) of the
// fastest: the cost model cannot tell such layouts apart, and the one with
// more free memory is the safer choice.
SpaceReport evaluate(const ModelSpec& m, const RunSpec& run, const ClusterSpec& cluster,
                     const std::vector<Layout>& layouts, const CostConstants& k,
                     const memory::MemoryOptions& mem = {}, double tie = 0.01);

const char* to_string(Verdict v);

// What a space is evaluated for, and what its reports and tuning describe.
struct SpaceContext {
  ModelSpec model;
  RunSpec run;
  ClusterSpec cluster;
  CostConstants constants;
  memory::MemoryOptions memory;
  double tie = 0.01;  // evaluate()'s tie rule: within this fraction of the fastest, less memory first
};

}  // namespace weft::tuner
