// The layout space: every combination of the parallel and kernel knobs that
// the model and world allow, restricted by the user's pins, then validated,
// memory-pruned and ranked by the cost model (the analytic half of tuning):
// every layout (evaluate), or only those that bounds cannot rule out of the
// first rows of the ranking (search, tuner/space_search.cpp).
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
  std::vector<int64_t> tp, cp, pp, mb, vpp, zero;
  // Expert-parallel degrees (MoE models; empty: each that divides dp x cp
  // and the routed experts, the ep group within one NVLink domain).
  std::vector<int64_t> ep;
  std::vector<MoeDispatch> dispatch;  // the dispatchers tried at ep > 1 (ep 1 has none)
  std::vector<int64_t> etp;  // expert tp degrees (1, or tp without sp; empty: both where they apply)
  // The ep group folded over the tp ranks (Layout::ep_fold) or not; empty:
  // both where they apply (tp > 1, sp, etp1).
  std::vector<bool> ep_fold;
  // MoE capacity factors (Layout::capacity_factor; 0: dropless), searched
  // only among those listed, since dropping tokens changes what the model
  // computes; empty: the model's own.
  std::vector<double> capacity;
  // ZeRO shard-group sizes (Layout::zero_group; 0: all dp x cp ranks) for
  // stages 1-3; empty: 0, and those hybrid sharding searches (enumerate()).
  std::vector<int64_t> zero_group;
  std::vector<CpComm> cp_comm;  // the transports tried at cp > 1 (cp 1 has none)
  std::vector<bool> sp;
  std::vector<Checkpointing> ckpt;
  std::vector<int64_t> ckpt_layers;  // 0 means every layer of a stage
  std::vector<AttentionKind> attention;
  std::vector<NormKind> norm;
  std::vector<GradPrecision> grad;
  // GEMM precisions: FP8 recipe and the blocks kept in bf16 at each end
  // (Fp8Recipe::off with 0 for bf16).
  std::vector<std::pair<Fp8Recipe, int64_t>> fp8;
  int64_t max_mb = 64;  // largest micro-batch tried when mb is free
  // Pipeline splits (Layout::split; an empty one is the even split): empty,
  // searched as pipeline_splits says.
  std::vector<std::vector<int64_t>> split;
};

// The pipeline splits searched for pp * vpp = `virtual_stages` virtual
// stages of a model. Where L divides, the even split; where the vocabulary's
// table on a tp rank weighs x >= 1 blocks (the head's GEMMs then take x
// blocks' time on the last stage: Llama 3's 128k vocabulary at 8B and 70B),
// also the splits with r = round(x) (at most 2) layers fewer on the last
// virtual stage, and those with one fewer on the first too (which holds the
// most micro-batches in flight), spread over the stages between (each then
// holds at most one more, so this pays only from x >= 1). Where L
// does not divide, L / (pp * vpp) on the first and last and the rest spread
// (the later stages between taking the remainder, as they hold fewer
// micro-batches in flight), with the same lighter ends where x >= 1. Every
// stage between keeps at least one layer; a split of two stages puts L / 2
// (rounded either way) on the first, and where x >= 1 r layers more.
std::vector<std::vector<int64_t>> pipeline_splits(const ModelSpec& m, int64_t tp, int64_t virtual_stages);
// The vpp values searched for pp stages (none where pp > L + 2: a stage
// between the first and last needs a layer, while those two may hold the
// embedding and the head alone): 1, and those where L divides by pp * vpp,
// or, where L does not divide by pp, L + 2 does (the embedding and the loss
// counted as layers).
std::vector<int64_t> pipeline_vpps(const ModelSpec& m, int64_t pp);
// The vocabulary's table on a tp rank in blocks' parameters (the head's
// GEMMs against a block's).
double vocab_table_blocks(const ModelSpec& m, int64_t tp);

// What the space needs to know of the device: whether it is a GPU (cuDNN
// attention) and whether it has FP8 tensor cores (FP8 searched when free).
// And, for hybrid sharding, the GPUs of one NVLink domain (0: a device
// alone, or the CPU, where every rank shares one memory: hybrid sharding is
// searched only when pinned).
struct SpaceDevice {
  DeviceKind kind = DeviceKind::gpu;
  bool fp8 = false;
  int64_t domain = 0;
  SpaceDevice() = default;
  SpaceDevice(DeviceKind k) : kind(k) {}  // NOLINT(google-explicit-constructor): a kind alone has no FP8
  SpaceDevice(const DeviceSpec& d) : kind(d.kind), fp8(d.has_fp8()) {}  // NOLINT(google-explicit-constructor)
  SpaceDevice(const ClusterSpec& c)  // NOLINT(google-explicit-constructor)
      : kind(c.device.kind), fp8(c.device.has_fp8()), domain(c.device.kind == DeviceKind::gpu ? c.domain() : 0) {}
};

// All layouts of the space. tp runs over divisors of the world that divide H,
// H_kv, F and V; cp over divisors of the rest that cut T into 2*cp equal
// chunks, each cp > 1 with the transports ring, allgather and a2a; pp over
// divisors of the rest of at most L + 2; dp fills the world; mb over powers of
// two dividing the per-replica batch; vpp as pipeline_vpps says (pp > 1), and
// the splits of pipeline_splits;
// sp with tp > 1; ZeRO > 0 with dp * cp > 1 (the ranks it shards over),
// ZeRO-3 also with hybrid sharding over groups of g = domain / tp ranks
// where g divides dp * cp and 1 < g < dp * cp (the group and its tp ranks
// fill one NVLink domain: its gathers and reduce-scatters stay on the fast
// link, only the replicas' all-reduce crosses the network; pinned groups
// apply to ZeRO-1 to 3); full checkpointing
// also on 1/4, 1/2 and 3/4 of a stage's layers; attention flash and
// materialized, and cudnn on a GPU device (cuDNN has no CPU kernels);
// gradients in fp32, and in bf16 too when the run computes in bf16; GEMMs
// in the compute precision, and in FP8 with tensorwise scaling too on a
// device with FP8 tensor cores (delayed scaling and bf16 end blocks only
// when pinned: they trade numerics, which no step time tells, for speed).
// Pins replace these lists (evaluate prunes a pinned cudnn on a CPU, and
// FP8 on a GPU without FP8 tensor cores, as invalid; FP8 pinned on the CPU
// is emulated). The device defaults to a GPU without FP8, as DeviceSpec does.
std::vector<Layout> enumerate(const ModelSpec& m, const RunSpec& run, int64_t world,
                              const SpaceLimits& limits, SpaceDevice device = {});

// The same space as the layouts that share a parallel shape (tp, cp and its
// transport, pp, dp, mb, vpp and the split, sp, and the GEMM precision, which changes
// every block's time): each the product of the lists of the
// other knobs, in enumerate()'s order (ckpt slowest, then attention, norm,
// ZeRO, gradient precision fastest). enumerate() is these, one after the
// other.
struct Subspace {
  Layout shape;  // the shape's knobs; the others at their defaults
  std::vector<std::pair<Checkpointing, int64_t>> ckpts;  // mode and ckpt_layers
  std::vector<AttentionKind> attentions;
  std::vector<NormKind> norms;
  std::vector<ZeroChoice> zeros;  // stage slowest, shard group fastest
  std::vector<GradPrecision> grads;
  int64_t first = 0;  // the index of its first layout in enumerate()'s list

  int64_t size() const {
    return int64_t(ckpts.size() * attentions.size() * norms.size() * zeros.size() * grads.size());
  }
  // Its i-th layout (0 <= i < size()), enumerate()'s layout first + i.
  Layout at(int64_t i) const;
};
std::vector<Subspace> enumerate_subspaces(const ModelSpec& m, const RunSpec& run, int64_t world,
                                          const SpaceLimits& limits, SpaceDevice device = {});

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
  int64_t evaluated = 0;              // layouts of the space (the full product of the knobs)
  int64_t fitting = 0;                // of those visited
  std::map<std::string, int64_t> pruned;  // count by prune_class; with fitting, they add up to evaluated
  double seconds = 0;                     // wall time of the evaluation
  // Layouts whose memory and step were predicted: all of them (evaluate), or
  // those the search's bounds left (search); the rest are in `pruned` under
  // the rule they break or the bound that ruled them out.
  int64_t visited = 0;
  bool exhaustive = true;  // evaluate(): every layout visited and listed
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

// One layout as evaluate() judges it: the first rule it breaks (a cudnn
// attention on a CPU device is one), else its memory estimate and predicted
// step, and whether it fits; sizes past what 64 bits hold are invalid
// ("size").
Candidate evaluate_one(const ModelSpec& m, const RunSpec& run, const ClusterSpec& cluster, const Layout& l,
                       const CostConstants& k, const memory::MemoryOptions& mem = {});
// The rule evaluate_one() adds to a layout's violations for a cudnn
// attention on `device`, a CPU.
std::string cudnn_on_cpu(const DeviceSpec& device);
// The rule evaluate_one() puts before a layout's violations for FP8 GEMMs on
// a GPU without FP8 tensor cores (fp8_unsupported_reason); empty otherwise.
std::string fp8_on_device(const Layout& l, const DeviceSpec& device);

// The prune class of a layout a rule rules out: "invalid: <the rule>".
std::string rule_class(const std::string& violation);

// What a space is evaluated for, and what its reports and tuning describe.
struct SpaceContext {
  ModelSpec model;
  RunSpec run;
  ClusterSpec cluster;
  CostConstants constants;
  memory::MemoryOptions memory;
  double tie = 0.01;  // evaluate()'s tie rule: within this fraction of the fastest, less memory first
};

// The first `top` rows of evaluate()'s ranking of the space (fitting layouts
// by predicted step with the tie rule, then, when fewer fit, those out of
// memory by step, then invalid ones in order), with the same numbers, found
// without predicting every layout (tuner/space_search.cpp):
// - the rules of a shape (core/layout's violations: seq into 2*cp chunks,
//   a2a's heads, L % (pp*vpp), ...) are asked of a few of its layouts, and
//   every layout is counted under the first rule it breaks without being
//   built;
// - shapes are visited in the order of their step lower bound (cost.h's
//   step_bounds); once `top` layouts fit, a shape or a layout whose bound
//   lies past the last of them and past the tie window of the fastest
//   cannot reach the rows, nor can a layout whose memory bound
//   (space_bounds.h) exceeds the usable memory;
// - a shape that comes up for its visit and whose memory lower bound is
//   above the usable memory is out of memory whatever its other knobs (the
//   shapes the step bounds rule out first are counted under them).
// `evaluated` counts the whole space, `visited` the layouts predicted;
// "bound: ..." and "oom: memory lower bound" in `pruned` count what the
// bounds ruled out. When nothing fits, the layout nearest to fitting
// follows the rows (it is out of memory: report_table names it).
SpaceReport search(const SpaceContext& ctx, const SpaceLimits& limits, int64_t top, SpaceDevice device = {});

}  // namespace weft::tuner
