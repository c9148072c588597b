// Option groups shared by subcommands. Each group registers its options once
// (parser and help come from the same declaration) and resolves them into the
// core specs, throwing InputError with the offending value.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/device_spec.h"
#include "core/model_spec.h"
#include "core/run_spec.h"
#include "tuner/space.h"

namespace weft::cli {

// What the launcher (mpirun, srun) tells a process about its world.
bool under_mpi();  // launched with more than one rank
int64_t mpi_world_size_from_env();
int64_t world_rank_from_env();
int64_t local_rank_from_env();   // among the ranks of this node
int64_t local_ranks_from_env();  // ranks on this node

struct ModelArgs {
  std::string model = "llama-13b";
  int64_t vocab = 0;  // 0: the model's own
  CLI::Option* vocab_option = nullptr;  // --vocab given is checked, 0 included
  // An MoE model's balancing loss and capacity, training settings: the
  // loss's coefficient and scope and the capacity factor (core/moe_spec.h),
  // when given.
  double aux_coef = 0;
  std::string aux_scope{};
  CLI::Option* aux_coef_option = nullptr;
  // --moe-capacity-factor: one factor, the run's; several (0,1.25), the
  // ones tuning searches (capacity_factors()), the run's model taking the
  // first until a layout picks one.
  std::vector<double> capacity_factor{};
  CLI::Option* capacity_option = nullptr;
  double imbalance = 0;  // --moe-imbalance
  CLI::Option* imbalance_option = nullptr;
  bool imbalance_stated() const { return imbalance_option && imbalance_option->count() > 0; }
  ModelSpec resolve() const;
  // The balancing-loss and capacity options on a model (InputError for a
  // dense one, or a value out of range).
  void apply_moe_options(ModelSpec& m) const;
  // The capacity factors listed (empty: none given); InputError unless each
  // is 0 or above 0 and at most kMaxCapacityFactor, and none twice.
  std::vector<double> capacity_factors() const;
};
void add_model_options(CLI::App& app, ModelArgs& a);

// A layout given by hand (`what`: "--layout ..." or "recipe ...") and the
// run's capacity factor: a layout whose text names none (cap:F) takes the
// model's; one that names a factor sets the model's, unless
// --moe-capacity-factor gives another (InputError naming both). Dense
// models are left alone (violations() refuses a cap: on them).
void layout_capacity(const ModelArgs& a, const std::string& what, Layout& l, ModelSpec& m, bool named);
inline void layout_capacity(const ModelArgs& a, const std::string& what, Layout& l, ModelSpec& m) {
  layout_capacity(a, what, l, m, what.find("cap:") != std::string::npos);
}

struct ClusterArgs {
  std::string gpu = "a100-80gb";
  int64_t gpus = kUnset;           // unset: the cluster file's, else 8
  int64_t gpus_per_node = kUnset;  // unset: the cluster file's, else the device's
  ClusterSpec resolve() const;
};
void add_cluster_options(CLI::App& app, ClusterArgs& a);

struct RunArgs {
  int64_t seq = 2048;
  int64_t global_batch = 2048;
  std::string precision = "auto";  // bf16 on GPUs, fp32 on the CPU
  RunSpec resolve(const DeviceSpec& device) const;
};
void add_run_options(CLI::App& app, RunArgs& a);

// LoRA fine-tuning: --lora RANK (0: off) with --lora-alpha (default 2 x
// rank), --lora-dropout and --lora-targets (default every linear layer).
struct LoraArgs {
  int64_t rank = 0;
  double alpha = 0;  // not given: 2 x rank
  double dropout = 0;
  std::string targets = "all";
  int64_t gate_up_rank = 0;  // the experts' fused gate_up adapters' (0: rank)
  CLI::Option* alpha_option = nullptr;
  CLI::Option* gate_up_option = nullptr;
  CLI::Option* dropout_option = nullptr;
  CLI::Option* targets_option = nullptr;
  LoraSpec resolve() const;  // InputError naming a bad value
};
void add_lora_options(CLI::App& app, LoraArgs& a);

struct SpaceArgs {
  std::vector<int64_t> tp, cp, ep, etp, pp, mb, vpp, zero, zero_group, ckpt_layers;
  std::vector<std::string> sp, ep_fold, ckpt, attention, norm, grad, cp_comm, dispatch, fp8, split;
  int64_t max_mb = 64;
  tuner::SpaceLimits resolve() const;
};
void add_space_options(CLI::App& app, SpaceArgs& a);

// One --fp8 value: off, tensorwise or delayed, with @N keeping the first and
// last N blocks in bf16 ("delayed@1"); InputError naming the value otherwise.
std::pair<Fp8Recipe, int64_t> fp8_pin_parse(const std::string& s);
// Refuses FP8 pins on a GPU without FP8 tensor cores, naming the device and
// what would be valid (the CPU emulates FP8 and is allowed).
void require_fp8_device(const tuner::SpaceLimits& limits, const DeviceSpec& device);

// For each argument of `args` that looks like an option (--name or
// --name=value) and that `sub` lacks, the nearest option names `sub` has by
// edit distance: "--step: did you mean --steps?". Empty when every option is
// known or none is near.
std::string option_suggestions(CLI::App& sub, const std::vector<std::string>& args);

// Refuses an empty value (`--layout ''`), which would otherwise read as the
// option not given.
CLI::Validator non_empty();

}  // namespace weft::cli
