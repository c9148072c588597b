#include "cli/options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace weft::cli {

// Launched by mpirun (or srun) with more than one rank?
bool under_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"})
    if (const char* s = std::getenv(v); s && std::atoi(s) > 1) return true;
  return false;
}

namespace {

int64_t env_int(std::initializer_list<const char*> names, int64_t fallback) {
  for (const char* v : names)
    if (const char* s = std::getenv(v); s && std::atoll(s) > 0) return std::atoll(s);
  return fallback;
}
}  // namespace

int64_t mpi_world_size_from_env() { return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}, 1); }
int64_t world_rank_from_env() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* s = std::getenv(v)) return std::atoll(s);
  return 0;
}
int64_t local_rank_from_env() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoll(s);
  return 0;
}
int64_t local_ranks_from_env() {
  return env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}, 1);
}

ModelSpec ModelArgs::resolve() const {
  ModelSpec m = model_resolve(model);
  const bool given = vocab_option ? vocab_option->count() > 0 : vocab != 0;
  if (given && (vocab < 1 || vocab > kMaxVocab))
    throw InputError(fmt::format("--vocab {} must be from 1 to {} (token ids are int32); without it the model's "
                                 "own {} is used",
                                 vocab, kMaxVocab, m.vocab));
  if (given) m.vocab = vocab;
  apply_moe_options(m);
  m.validate();
  m.require_computed("train or plan");
  return m;
}

void ModelArgs::apply_moe_options(ModelSpec& m) const {
  const bool coef = aux_coef_option && aux_coef_option->count() > 0;
  const bool capacity = capacity_option && capacity_option->count() > 0;
  const bool skew = imbalance_option && imbalance_option->count() > 0;
  if (!coef && aux_scope.empty() && !capacity && !skew) return;
  if (!m.moe.enabled())
    throw InputError(fmt::format("{} applies to MoE models; {} is dense",
                                 coef       ? "--moe-aux-coef"
                                 : capacity ? "--moe-capacity-factor"
                                 : skew     ? "--moe-imbalance"
                                            : "--moe-aux-scope",
                                 m.name));
  if (skew) {
    if (!(imbalance == 0 || (imbalance >= 1 && imbalance <= kMaxImbalance)))
      throw InputError(fmt::format("--moe-imbalance {} must be 0 (the worst case: every choice a rank can "
                                   "receive) or from 1 (balanced routing) to {:g}",
                                   imbalance, kMaxImbalance));
    m.moe.imbalance = imbalance;
  }
  if (capacity) m.moe.capacity_factor = capacity_factors().front();
  if (coef) {
    if (!(aux_coef >= 0 && aux_coef <= kMaxAuxLossCoef))
      throw InputError(fmt::format("--moe-aux-coef {} must be from 0 (no balancing loss) to {}", aux_coef,
                                   kMaxAuxLossCoef));
    m.moe.aux_loss_coef = aux_coef;
  }
  if (aux_scope == "global")
    m.moe.aux_scope = AuxLossScope::global;
  else if (aux_scope == "per_layer")
    m.moe.aux_scope = AuxLossScope::per_layer;
  else if (!aux_scope.empty())
    throw InputError(fmt::format("--moe-aux-scope {} is not a scope; use global (transformers' loss over every "
                                 "MoE layer's router pooled) or per_layer (Megatron's, summed over the layers)",
                                 aux_scope));
}

void layout_capacity(const ModelArgs& a, const std::string& what, Layout& l, ModelSpec& m, bool named) {
  if (!m.moe.enabled()) return;
  if (!named) {
    l.capacity_factor = m.moe.capacity_factor;
    return;
  }
  const auto given = a.capacity_factors();
  if (!given.empty() && (given.size() != 1 || given[0] != l.capacity_factor))
    throw InputError(fmt::format("--moe-capacity-factor {} and {} disagree (the layout says cap:{:g}); give the "
                                 "factor in one place",
                                 fmt::join(given, ","), what, l.capacity_factor));
  m.moe.capacity_factor = l.capacity_factor;
}

std::vector<double> ModelArgs::capacity_factors() const {
  for (size_t i = 0; i < capacity_factor.size(); ++i) {
    const double f = capacity_factor[i];
    if (!(f == 0 || (f > 0 && f <= kMaxCapacityFactor)))
      throw InputError(fmt::format("--moe-capacity-factor {} must be 0 (dropless: every choice computed) or above 0 "
                                   "and at most {:g} (each expert keeps ceil(f x rows x k / E) of a rank's rows; 1 "
                                   "is the balanced share)",
                                   f, kMaxCapacityFactor));
    if (std::find(capacity_factor.begin(), capacity_factor.begin() + long(i), f) != capacity_factor.begin() + long(i))
      throw InputError(fmt::format("--moe-capacity-factor lists {:g} twice", f));
  }
  return capacity_factor;
}

void add_model_options(CLI::App& app, ModelArgs& a) {
  app.add_option("--model", a.model,
                 "Model preset (see `weft presets`) or a Hugging Face config.json")
      ->capture_default_str();
  a.vocab_option = app.add_option("--vocab", a.vocab, "Override the vocabulary size (e.g. padded for tp)");
  a.aux_coef_option = app.add_option("--moe-aux-coef", a.aux_coef,
                                     "MoE models: the load-balancing loss's coefficient (0: none; default the "
                                     "model's, e.g. router_aux_loss_coef)");
  a.capacity_option = app.add_option(
      "--moe-capacity-factor", a.capacity_factor,
      "MoE models: each expert keeps at most ceil(F x rows x k / E) of the rows a rank routes per micro-batch, "
      "the later tokens' choices past it dropped (Megatron's capacity factor, position policy; 0: dropless, "
      "the default). Several (0,1.25): tuning searches them, as dropping tokens changes what the model "
      "computes only where listed")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  a.imbalance_option = app.add_option(
      "--moe-imbalance", a.imbalance,
      "MoE models under expert parallelism: the rows each rank's experts receive are held for F times "
      "balanced routing's (at most the worst case; 0: the worst case, the default); a batch routed past it "
      "stops the run with an error naming the rows. The cost model prices the busiest ep rank's experts at F "
      "times balanced (0 and 1: balanced)");
  app.add_option("--moe-aux-scope", a.aux_scope,
                 "MoE models: the load-balancing loss over every MoE layer's router pooled (global, "
                 "transformers') or per layer, summed (per_layer, Megatron's)");
}

namespace {

// Levenshtein distance: single-character insertions, deletions and
// substitutions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Every long option name of `app` and of its option groups, with "--".
void long_names(CLI::App& app, std::vector<std::string>& out) {
  for (const CLI::Option* o : app.get_options())
    for (const auto& n : o->get_lnames()) out.push_back("--" + n);
  for (CLI::App* group : app.get_subcommands({}))
    if (group->get_name().empty()) long_names(*group, out);
}

}  // namespace

std::string option_suggestions(CLI::App& sub, const std::vector<std::string>& args) {
  std::vector<std::string> names;
  long_names(sub, names);
  std::string out;
  for (const auto& arg : args) {
    if (arg.rfind("--", 0) != 0 || arg.size() < 3) continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (sub.get_option_no_throw(name)) continue;
    // Near enough to be a slip: a third of the name's letters, at least 1, at most 3.
    const size_t limit = std::clamp<size_t>((name.size() - 2) / 3, 1, 3);
    size_t best = limit + 1;
    std::vector<std::string> nearest;
    for (const auto& n : names) {
      const size_t d = edit_distance(name, n);
      if (d < best) {
        best = d;
        nearest = {n};
      } else if (d == best && std::find(nearest.begin(), nearest.end(), n) == nearest.end()) {
        nearest.push_back(n);
      }
    }
    if (nearest.empty()) continue;
    out += fmt::format("{}{}: did you mean {}?", out.empty() ? "" : "; ", name, fmt::join(nearest, " or "));
  }
  return out;
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        return v.empty() ? "an empty value is not valid; give one or leave the option out" : std::string();
      },
      "", "not empty");
}

ClusterSpec ClusterArgs::resolve() const {
  const bool file = gpu.ends_with(".json");
  return cluster_resolve(gpu, gpus == kUnset && !file ? 8 : gpus, gpus_per_node);
}

void add_cluster_options(CLI::App& app, ClusterArgs& a) {
  app.add_option("--gpu", a.gpu, "Device preset (a100-40gb, a100-80gb, h100, h100-96gb, h200, cpu) or a "
                                 "cluster JSON file")
      ->capture_default_str();
  app.add_option("--gpus", a.gpus, "Number of devices, the world size (default 8)");
  app.add_option("--gpus-per-node", a.gpus_per_node,
                 "Devices per node sharing the fast link (default: the device's, 8 for GPUs)");
}

RunSpec RunArgs::resolve(const DeviceSpec& device) const {
  RunSpec r;
  r.seq = seq;
  r.global_batch = global_batch;
  if (precision == "auto")
    r.precision = device.kind == DeviceKind::cpu ? Precision::fp32 : Precision::bf16;
  else
    r.precision = precision_parse(precision);
  r.validate();
  return r;
}

void add_run_options(CLI::App& app, RunArgs& a) {
  app.add_option("--seq", a.seq, "Sequence length T in tokens")->capture_default_str();
  app.add_option("--global-batch", a.global_batch, "Sequences per optimizer step")
      ->capture_default_str();
  app.add_option("--precision", a.precision, "auto, bf16 or fp32")->capture_default_str();
}

namespace {

template <class T, class F>
std::vector<T> parse_all(const std::vector<std::string>& in, F parse) {
  std::vector<T> out;
  for (const auto& s : in) out.push_back(parse(s));
  return out;
}

void require_positive(const char* flag, const std::vector<int64_t>& v, int64_t min = 1) {
  for (int64_t x : v)
    if (x < min)
      throw InputError(fmt::format("{} {} must be at least {}", flag, x, min));
}

}  // namespace

tuner::SpaceLimits SpaceArgs::resolve() const {
  tuner::SpaceLimits l;
  require_positive("--tp", tp);
  require_positive("--cp", cp);
  require_positive("--ep", ep);
  require_positive("--etp", etp);
  require_positive("--pp", pp);
  require_positive("--mb", mb);
  require_positive("--vpp", vpp);
  require_positive("--ckpt-layers", ckpt_layers, 0);
  for (int64_t z : zero)
    if (z < 0 || z > 3) throw InputError(fmt::format("--zero {} must be 0, 1, 2 or 3", z));
  for (int64_t g : zero_group)
    if (g < 0 || g == 1)
      throw InputError(fmt::format("--zero-group {} must be 0 (all dp x cp ranks) or a group of at least 2 ranks "
                                   "that divides dp x cp",
                                   g));
  if (!zero.empty() && std::all_of(zero.begin(), zero.end(), [](int64_t z) { return z == 0; }))
    for (int64_t g : zero_group)
      if (g > 0)
        throw InputError(fmt::format("--zero-group {} shards ZeRO-1, -2 or -3 within groups, but --zero 0 shards "
                                     "nothing; add a stage to --zero (e.g. --zero 3) or leave out --zero-group",
                                     g));
  if (max_mb < 1) throw InputError(fmt::format("--max-mb {} must be at least 1", max_mb));
  l.tp = tp;
  l.cp = cp;
  l.ep = ep;
  l.etp = etp;
  l.pp = pp;
  l.mb = mb;
  l.vpp = vpp;
  l.zero = zero;
  l.zero_group = zero_group;
  l.ckpt_layers = ckpt_layers;
  l.max_mb = max_mb;
  l.sp = parse_all<bool>(sp, [](const std::string& s) {
    if (s == "on" || s == "true" || s == "1") return true;
    if (s == "off" || s == "false" || s == "0") return false;
    throw InputError(fmt::format("--sp '{}' is not valid; use on, off or on,off", s));
  });
  l.ep_fold = parse_all<bool>(ep_fold, [](const std::string& s) {
    if (s == "on" || s == "true" || s == "1") return true;
    if (s == "off" || s == "false" || s == "0") return false;
    throw InputError(fmt::format("--ep-fold '{}' is not valid; use on, off or on,off", s));
  });
  l.ckpt = parse_all<Checkpointing>(ckpt, checkpointing_parse);
  l.attention = parse_all<AttentionKind>(attention, attention_parse);
  l.norm = parse_all<NormKind>(norm, norm_parse);
  l.grad = parse_all<GradPrecision>(grad, grad_precision_parse);
  l.cp_comm = parse_all<CpComm>(cp_comm, cp_comm_parse);
  l.dispatch = parse_all<MoeDispatch>(dispatch, moe_dispatch_parse);
  l.fp8 = parse_all<std::pair<Fp8Recipe, int64_t>>(fp8, fp8_pin_parse);
  l.split = parse_all<std::vector<int64_t>>(split, [](const std::string& s) {
    return s == "even" ? std::vector<int64_t>{} : split_parse(s);
  });
  return l;
}

std::pair<Fp8Recipe, int64_t> fp8_pin_parse(const std::string& s) {
  const auto at = s.find('@');
  Fp8Recipe r;
  try {
    r = fp8_recipe_parse(s.substr(0, at));
  } catch (const InputError& e) {
    throw InputError(fmt::format("--fp8: {}", e.what()));
  }
  int64_t n = 0;
  if (at != std::string::npos) {
    const std::string tail = s.substr(at + 1);
    char* end = nullptr;
    const long long v = std::strtoll(tail.c_str(), &end, 10);
    if (tail.empty() || *end != '\0' || v < 0)
      throw InputError(fmt::format("--fp8 '{}': N in RECIPE@N is the number of blocks kept in bf16 at each end, "
                                   "a whole number 0 or more (e.g. delayed@1)",
                                   s));
    n = v;
  }
  if (r == Fp8Recipe::off && n > 0)
    throw InputError(fmt::format("--fp8 '{}': off keeps every block in bf16; @N applies to tensorwise, delayed and blockwise", s));
  return {r, n};
}

void require_fp8_device(const tuner::SpaceLimits& limits, const DeviceSpec& device) {
  for (const auto& [recipe, n] : limits.fp8) {
    if (recipe == Fp8Recipe::off) continue;
    const std::string why = fp8_unsupported_reason(device);
    if (!why.empty())
      throw InputError(fmt::format("--fp8 {}{}: {}; use --fp8 off", to_string(recipe),
                                   n > 0 ? fmt::format("@{}", n) : "", why));
  }
}

LoraSpec LoraArgs::resolve() const {
  if (rank < 0) throw InputError(fmt::format("--lora {} must be a positive rank (0: off)", rank));
  if (rank == 0) {
    // The adapters' settings without adapters would be dropped without a word.
    for (const CLI::Option* o : {alpha_option, dropout_option, targets_option, gate_up_option})
      if (o != nullptr && o->count() > 0)
        throw InputError(fmt::format("{} {} sets LoRA's adapters, but LoRA is off; give --lora RANK too, or drop it",
                                     o->get_name(), o->as<std::string>()));
    return {};
  }
  LoraSpec l = LoraSpec::with_rank(rank);
  if (alpha_option != nullptr && alpha_option->count() > 0) {
    if (!(alpha > 0) || !std::isfinite(alpha))
      throw InputError(fmt::format("--lora-alpha {} must be a positive number (the adapters' output is scaled by "
                                   "alpha / r; leave it out for 2 x r)",
                                   alpha));
    l.alpha = alpha;
  }
  l.dropout = dropout;
  l.targets = LoraSpec::parse_targets(targets);
  l.gate_up_rank = gate_up_rank == rank ? 0 : gate_up_rank;
  RunSpec{.seq = 1, .global_batch = 1, .precision = Precision::fp32, .lora = l}.validate();
  return l;
}

void add_lora_options(CLI::App& app, LoraArgs& a) {
  auto* g = app.add_option_group("LoRA", "Fine-tune low-rank adapters with the model's weights frozen");
  g->add_option("--lora", a.rank,
                "LoRA rank r: train adapters A (r, in) and B (out, r) on the --lora-targets layers, every other "
                "weight frozen (0: off; usually with --init)")
      ->capture_default_str();
  a.alpha_option =
      g->add_option("--lora-alpha", a.alpha, "LoRA alpha: the adapters' output is scaled by alpha / r (default 2 x r)");
  a.dropout_option =
      g->add_option("--lora-dropout", a.dropout, "Dropout on the adapters' input while training")->capture_default_str();
  a.targets_option = g->add_option("--lora-targets", a.targets,
                "Layers that get adapters: all, or any of q,k,v,o,gate,up,down (Hugging Face names such as q_proj "
                "too)")
      ->capture_default_str();
  a.gate_up_option = g->add_option(
      "--lora-gate-up-rank", a.gate_up_rank,
      "MoE models: the routed experts' fused gate_up adapters' rank, alpha scaled alike (default --lora's; PEFT "
      "gives a Mixtral's or Qwen3-MoE's gate and up targets twice the rank there)");
}

void add_space_options(CLI::App& app, SpaceArgs& a) {
  auto* g = app.add_option_group("layout space", "Pin or restrict knobs (comma-separated lists)");
  g->add_option("--tp", a.tp, "Tensor-parallel degrees")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--cp", a.cp,
                "Context-parallel degrees: ranks that split each sequence (T divisible by 2*cp)")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--cp-comm", a.cp_comm,
                "Context-parallel transports tried at cp > 1: ring, allgather, a2a")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--ep", a.ep,
                "Expert-parallel degrees (MoE models): ranks of dp x cp the routed experts split over; searched: "
                "each that divides dp x cp and the experts")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--etp", a.etp,
                "Expert tp degrees (MoE models): 1, the experts whole on every tp rank, or tp, their width split "
                "over the tp ranks (under sp each dispatches its own rows, then they gather what arrives); "
                "searched: both where they apply")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--ep-fold", a.ep_fold,
                "The ep group folded over the tp ranks (MoE models, tp > 1, sp, etp 1; Megatron's expert grid): on, "
                "off; ep then counts the tp ranks too; searched: both where they apply")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--dispatch", a.dispatch, "Expert dispatchers tried at ep > 1: a2a, allgather")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--pp", a.pp, "Pipeline-parallel degrees")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--mb", a.mb, "Micro-batch sizes")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--vpp", a.vpp, "Virtual pipeline chunks per stage")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--sp", a.sp, "Sequence parallelism: on, off")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--ckpt", a.ckpt, "Checkpointing: none, selective, ffn, full")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--ckpt-layers", a.ckpt_layers,
                "Checkpoint only the first K layers of each stage (0: all)")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--attn", a.attention, "Attention: flash, materialized, cudnn (GPU)")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--norm", a.norm, "Norm: fused, unfused")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--zero", a.zero, "ZeRO stages 0-3")->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--zero-group", a.zero_group,
                "ZeRO shard-group sizes, hybrid sharding (0: all dp x cp ranks; a group applies to ZeRO 1-3); "
                "searched: 0, and for ZeRO-3 on GPUs the size that fills one NVLink domain with its tp ranks")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--grad", a.grad,
                "Gradient precision: fp32, bf16 (bf16 runs only; halves gradient memory and dp "
                "traffic, rounds each accumulation and reduction to bf16)")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--fp8", a.fp8,
                "GEMM precision of the blocks' linear layers: off (bf16), tensorwise, delayed, blockwise; RECIPE@N keeps the "
                "first and last N blocks in bf16 (searched: off,tensorwise on devices with FP8 tensor cores)")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--split", a.split,
                "Pipeline splits: even, or each virtual stage's layers (1.2x62.1: 1 layer, 62 stages of 2, 1); "
                "searched: the even split, and where the vocabulary's tables are heavy or L does not divide, "
                "the first and last virtual stage 0-2 layers lighter")
      ->delimiter(',')->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  g->add_option("--max-mb", a.max_mb, "Largest micro-batch tried when --mb is free")
      ->capture_default_str();
}

}  // namespace weft::cli
