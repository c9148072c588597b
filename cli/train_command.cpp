// `weft train`: trains on this machine. With no arguments it trains the tiny
// default model on the default corpus on the CPU.
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <tuple>
#include <memory>

#include <fmt/format.h>

#include "cli/auto_tune.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/train_args.h"
#include "core/flops.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/stop.h"
#include "core/units.h"
#include "memory/device.h"
#include "memory/estimate.h"
#include "report/tensorboard.h"
#include "trainer/checkpoint/peft.h"
#include "trainer/checkpoint/pretrained.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/token_data.h"
#include "trainer/loop.h"
#include "trainer/resume_check.h"
#include "trainer/run_folder.h"
#include "tuner/recipe.h"
#include "trainer/parallel/device_comm.h"
#ifdef WEFT_HAVE_MPI
#include "trainer/parallel/comm_mpi.h"
#include "trainer/parallel/comm_watchdog.h"
#endif

namespace weft::cli {

namespace {

int run_train(TrainArgs& a) {
  StopScope stoppable;  // tuning, training, validation: signals are requests from here on
  trainer::TrainConfig c = a.cfg;
  const bool resuming = c.resume || !c.resume_from.empty();
  if (a.overwrite && resuming)
    throw InputError(fmt::format("--overwrite starts a new run and {} continues one; give one of them",
                                 c.resume ? "--resume" : "--resume-from " + c.resume_from));
  c.model = c.init.empty() ? a.model.resolve() : init_model(a, c);
  const auto presets = model_preset_names();
  const bool model_file = std::find(presets.begin(), presets.end(), a.model.model) == presets.end();
  c.model_from = model_file && c.init.empty() ? fmt::format("{} (architecture only)", a.model.model) : a.model.model;
  // The device: a GPU when there is one (each rank on a node takes the next),
  // else the CPU, whose cores the node's ranks share.
  if (a.device != "auto" && a.device != "cpu" && a.device != "gpu")
    throw InputError(fmt::format("--device {} is not valid; use auto, cpu or gpu (the default comes from "
                                 "$WEFT_DEVICE when set)", a.device));
  const bool gpu = a.device == "gpu" || (a.device == "auto" && gpu_count() > 0);
  if (gpu) {
    if (gpu_count() == 0)
      throw InputError("--device gpu: no CUDA device found (or this build has no CUDA); use --device cpu");
    const int ordinal = int(local_rank_from_env() % gpu_count());
    gpu_select(ordinal);
    c.device = *gpu_detect(ordinal);
    // Several ranks: NCCL where each has a GPU of its own, else the MPI
    // device communicator, and each rank's memory is its share of its GPU.
    if (under_mpi()) {
#ifdef WEFT_HAVE_DEVICE_COMM
      const auto choice = parallel::device_comm_choose(a.comm);
      c.comm = parallel::to_string(choice.kind);
      c.comm_why = choice.why;
      c.device.shared_by = choice.ranks_per_device;
      c.device.memory_bytes /= choice.ranks_per_device;
#else
      throw InputError("a GPU run over several ranks needs MPI and CUDA together, which this build lacks; use "
                       "--device cpu");
#endif
    } else {
      parallel::device_comm_check_request(a.comm);
    }
  } else {
    parallel::device_comm_check_request(a.comm);
    if (a.comm == "nccl")
      throw InputError("--comm nccl carries tensors between GPUs; a CPU run's ranks talk over MPI (--comm mpi or "
                       "auto)");
    c.device = cpu_rank_share(device_preset("cpu"), local_ranks_from_env(), c.threads);
  }
  // A cap on each rank's memory: the memory model holds every layout to it.
  if (!a.memory_limit.empty()) {
    const int64_t cap = parse_bytes(a.memory_limit);
    if (cap < c.device.memory_bytes) c.device.memory_bytes = cap;
  }
  c.run.seq = a.seq;
  c.run.global_batch = a.global_batch;
  c.run.precision = a.precision == "auto" ? (gpu ? Precision::bf16 : Precision::fp32) : precision_parse(a.precision);
  c.run.lora = a.lora.resolve();
  c.run.validate();
  lora_check_model(c.model, c.run.lora);
  if (!c.lora_init.empty() && !c.run.lora.enabled())
    throw InputError(fmt::format("--lora-init {} starts LoRA adapters from a PEFT folder; give --lora RANK (its r) "
                                 "too", c.lora_init));
  if (a.schedule == "cosine") c.optim.schedule = trainer::Schedule::cosine;
  else if (a.schedule == "constant") c.optim.schedule = trainer::Schedule::constant;
  else throw InputError(fmt::format("--schedule '{}' is not valid; use cosine or constant", a.schedule));
  // A config.json (or a Hugging Face folder) names an architecture; its
  // weights load only with --init, which a user may have meant.
  if (model_file && c.init.empty() && !resuming && world_rank_from_env() == 0) {
    const bool weights_beside = std::filesystem::is_directory(a.model.model) || a.model.model.ends_with("config.json");
    fmt::print("note: --model {} gives the architecture only; its weights are not loaded, and the model starts "
               "from a random initialisation (seed {}){}\n",
               a.model.model, c.seed,
               weights_beside ? fmt::format("; --init {} loads the folder's weights",
                                            std::filesystem::is_directory(a.model.model)
                                                ? a.model.model
                                                : std::filesystem::path(a.model.model).parent_path().string())
                              : "");
  }
  // A resume continues the run's settings where the command states none.
  if (resuming) {
    const std::string from =
        !c.resume_from.empty()
            ? c.resume_from
            : checkpoint::resume_checkpoint(c.ckpt_dir.empty() ? c.out_dir + "/checkpoints" : c.ckpt_dir).value_or("");
    if (!from.empty() && std::filesystem::exists(std::filesystem::path(from) / checkpoint::kManifestFile)) {
      std::vector<std::string> stated;
      for (const auto& [name, option] : a.resumable)
        if (option->count() > 0) stated.push_back(name);
      const auto adopted = trainer::resume_adopt(c, from, stated);
      if (!adopted.empty() && world_rank_from_env() == 0) {
        std::vector<std::string> said;
        for (const auto& ch : adopted) said.push_back(fmt::format("--{} {}", ch.field, ch.to.dump()));
        fmt::print("continuing with the run's settings from {}: {}\n", from, fmt::join(said, ", "));
      }
    }
  }
  c.layout.mb = a.mb;
  const auto at = a.ckpt.find('@');
  c.layout.ckpt = checkpointing_parse(a.ckpt.substr(0, at));
  if (at != std::string::npos) c.layout.ckpt_layers = Layout::parse("ckpt:" + a.ckpt).ckpt_layers;
  c.layout.attention = attention_parse(a.attention);
  c.layout.norm = norm_parse(a.norm);
  c.layout.grad = grad_precision_parse(a.grad);
  if (a.cp < 1) throw InputError(fmt::format("--cp {} must be at least 1", a.cp));
  c.layout.cp = a.cp;
  if (a.ep < 1) throw InputError(fmt::format("--ep {} must be at least 1", a.ep));
  c.layout.ep = a.ep;
  c.layout.dispatch = moe_dispatch_parse(a.dispatch);
  if (a.etp < 1) throw InputError(fmt::format("--etp {} must be at least 1", a.etp));
  c.layout.etp = a.etp;
  c.layout.ep_fold = a.ep_fold;
  c.layout.cp_comm = cp_comm_parse(a.cp_comm);
  std::tie(c.layout.fp8, c.layout.fp8_bf16_layers) = fp8_pin_parse(a.fp8);
  if (a.zero < 0 || a.zero > 3) throw InputError(fmt::format("--zero {} must be 0, 1, 2 or 3", a.zero));
  c.layout.zero = a.zero;
  const Layout from_knobs = c.layout;
  if (!a.layout.empty()) {
    c.layout = Layout::parse(a.layout);
    knobs_agree(a, from_knobs, c.layout, "--layout " + a.layout);
  }
  // Several capacity factors are for tuning to search; a run given its
  // layout drops at one (the layout's cap:F, or the model's).
  const auto capacities = a.model.capacity_factors();
  const bool knobs = std::any_of(a.knobs.begin(), a.knobs.end(), [](CLI::Option* o) { return o->count() > 0; });
  if (a.tune.enabled && (!a.layout.empty() || !a.recipe.empty()))
    throw InputError(fmt::format("--auto chooses the layout; drop {}", a.layout.empty() ? "--recipe" : "--layout"));
  // A run that trains nothing (--init with --steps 0) has no layout to tune
  // unless --auto asks.
  const bool tune = a.tune.enabled || (a.layout.empty() && a.recipe.empty() && !knobs && c.steps > 0);
  if (a.tune_top->count() > 0 && a.tune.top < 1)
    throw InputError(fmt::format("--tune-top {} must be at least 1", a.tune.top));
  if (a.tune.retune && !tune)
    throw InputError("--retune applies to --auto; a run with --layout, --recipe or "
                     "--mb/--ckpt/--attn/--norm/--grad/--cp/--cp-comm/--fp8/--zero does not tune");
  if (!a.recipe.empty()) {
    if (!a.layout.empty()) throw InputError("give either --layout or --recipe, not both");
    const auto r = tuner::recipe_load(a.recipe);
    ClusterSpec here;
    here.device = c.device;
    here.gpus = mpi_world_size_from_env();
    const auto diff = tuner::recipe_mismatches(r, c.model, here, c.run);
    if (!diff.empty() && !a.force_recipe)
      throw InputError(fmt::format("recipe '{}' does not match this run: {} (--force-recipe uses it anyway)",
                                   a.recipe, fmt::join(diff, "; ")));
    if (!diff.empty())
      std::fprintf(stderr, "weft: warning: using recipe %s despite: %s\n", a.recipe.c_str(),
                   fmt::format("{}", fmt::join(diff, "; ")).c_str());
    knobs_agree(a, from_knobs, r.layout, "recipe " + a.recipe);
    c.layout = r.layout;
    // The receive buffers its tuning sized from measured routing (and the
    // memory its layout left), unless this run states them.
    if (c.model.moe.enabled() && r.model.moe.imbalance > 0 && !a.model.imbalance_stated()) {
      c.model.moe.imbalance = r.model.moe.imbalance;
      if (world_rank_from_env() == 0)
        fmt::print("MoE receive buffers at {:g}x a rank's balanced rows, as recipe {} holds them (--moe-imbalance "
                   "states them)\n",
                   c.model.moe.imbalance, a.recipe);
    }
  }
  if (!tune && capacities.size() > 1)
    throw InputError(fmt::format("--moe-capacity-factor lists {} factors, which tuning searches (--auto); a run with "
                                 "{} trains at one",
                                 capacities.size(),
                                 !a.layout.empty()   ? "--layout"
                                 : !a.recipe.empty() ? "--recipe"
                                                     : "its layout knobs"));
  if (!tune)
    cli::layout_capacity(a.model, !a.layout.empty() ? "--layout " + a.layout : "recipe " + a.recipe, c.layout,
                         c.model, c.layout.capacity_factor > 0 || a.layout.find("cap:") != std::string::npos);
  // FP8 GEMMs need FP8 tensor cores, or the CPU, which emulates them.
  if (c.layout.fp8 != Fp8Recipe::off)
    if (const std::string why = fp8_unsupported_reason(c.device); !why.empty())
      throw InputError(fmt::format("{} asks for FP8 GEMMs ({}), but {}; use --fp8 off",
                                   !a.layout.empty() ? "--layout" : !a.recipe.empty() ? "recipe " + a.recipe : "--fp8",
                                   gemm_precision_text(c.layout), why));
  // The data is scanned once, before tuning and training: tuning trials and
  // the GPU kernels then take its ids as checked.
  const auto scanned = data::token_data_open(data::data_spec_or_corpus(c.data));
  data::token_data_validate(scanned, c.model.vocab, c.run.seq);
  c.data_checked = true;
  if (scanned.val && c.eval_samples > 0) {
    const auto v = data::validation_samples(*scanned.val, c.run.seq, c.eval_samples, "--eval-samples");
    c.eval_samples = v.samples;
    if (!v.note.empty() && world_rank_from_env() == 0) fmt::print("validation: {} samples ({})\n", v.samples, v.note);
  }
  if (!(a.comm_timeout > 0 && std::isfinite(a.comm_timeout)))
    throw InputError(fmt::format("--comm-timeout {} must be a positive number of seconds", a.comm_timeout));
  trainer::validate_config(c);
  if (!tune) {
    c.layout.validate(c.model, c.run, mpi_world_size_from_env());
    trainer::check_trainable(c.model, c.layout, c.device.kind, trainer::Trainable::here, c.run.seq);
    if (const std::string none = memory::fp8_runs_none(c.model, c.run, c.layout); !none.empty())
      throw InputError(fmt::format("{}: {}", !a.layout.empty() ? "--layout " + a.layout
                                             : !a.recipe.empty() ? "recipe " + a.recipe
                                                                 : "--fp8 " + a.fp8,
                                   none));
    memory::require_fits(c.model, c.run, c.layout, c.device,
                         a.memory_limit.empty() ? "" : "--memory-limit " + a.memory_limit);
  }
  // The files the run reads, and the folders it writes beside its own, are
  // checked before the run folder is touched: a refusal must not have moved
  // an earlier run aside (--overwrite) first.
  if (!c.lora_init.empty()) (void)checkpoint::peft_open(c.lora_init, c.model);
  std::string tensorboard_dir;
  if (a.tensorboard_opt->count() > 0) {
    namespace fs = std::filesystem;
    tensorboard_dir = a.tensorboard.empty() ? (fs::path(c.out_dir) / "tensorboard").string() : a.tensorboard;
    // A folder of its own (outside the run folder) is made now, so that one
    // that cannot be made refuses the run before anything moves.
    if (!a.tensorboard.empty() && world_rank_from_env() == 0) {
      std::error_code ec;
      fs::create_directories(tensorboard_dir, ec);
      if (ec || !fs::is_directory(tensorboard_dir))
        throw InputError(fmt::format("--tensorboard {}: cannot create the folder: {}", tensorboard_dir,
                                     ec ? ec.message() : "something else is there"));
    }
  }
  // The run folder, once every cheap check has passed and before tuning or
  // training write anything: a run refused up to here changed nothing.
  const auto folder_mode = resuming      ? trainer::RunFolderMode::resume
                           : a.overwrite ? trainer::RunFolderMode::overwrite
                                         : trainer::RunFolderMode::fresh;
  const std::string moved =
      trainer::run_folder_prepare(c.out_dir, c.ckpt_dir, folder_mode, world_rank_from_env() == 0);
  if (!moved.empty()) std::fputs(moved.c_str(), stdout);
  if (a.tensorboard_opt->count() > 0 && world_rank_from_env() == 0) {
    namespace fs = std::filesystem;
    const std::string& dir = tensorboard_dir;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw InputError(fmt::format("--tensorboard {}: cannot create the folder: {}", dir, ec.message()));
    c.metrics_sink = std::make_shared<report::TensorBoardSink>(dir);
    a.tune.tensorboard = (fs::path(dir) / "tune").string();
  }
  if (tune) {
    const int64_t world = mpi_world_size_from_env();
    tuner::SpaceLimits limits;
    for (CLI::Option* o : a.knobs) {
      if (o->count() == 0) continue;
      if (o->get_name() == "--mb") limits.mb = {c.layout.mb};
      if (o->get_name() == "--ckpt") {
        limits.ckpt = {c.layout.ckpt};
        limits.ckpt_layers = {c.layout.ckpt_layers};
      }
      if (o->get_name() == "--attn") limits.attention = {c.layout.attention};
      if (o->get_name() == "--norm") limits.norm = {c.layout.norm};
      if (o->get_name() == "--grad") limits.grad = {c.layout.grad};
      if (o->get_name() == "--cp") limits.cp = {c.layout.cp};
      if (o->get_name() == "--ep") limits.ep = {c.layout.ep};
      if (o->get_name() == "--dispatch") limits.dispatch = {c.layout.dispatch};
      if (o->get_name() == "--etp") limits.etp = {c.layout.etp};
      if (o->get_name() == "--ep-fold") limits.ep_fold = {c.layout.ep_fold};
      if (o->get_name() == "--cp-comm") limits.cp_comm = {c.layout.cp_comm};
      if (o->get_name() == "--fp8") limits.fp8 = {{c.layout.fp8, c.layout.fp8_bf16_layers}};
      if (o->get_name() == "--zero") limits.zero = {c.layout.zero};
    }
    if (capacities.size() > 1) limits.capacity = capacities;
    c.optim.total_steps = c.steps;
    if (!a.tune.budget.empty() && a.tune_top->count() == 0) a.tune.top = int64_t{1} << 40;
    a.tune.size_moe_buffers = c.model.moe.enabled() && !a.model.imbalance_stated();
    const auto tuned = auto_layout(c, limits, a.tune, world, world > 1 || under_mpi(), stdout);
    if (!tuned) return stop_exit_code();
    c.layout = tuned->layout;
    c.model = model_for(c.model, c.layout);  // (dropping at the factor the tuning chose)
    if (tuned->moe_imbalance > 0) c.model.moe.imbalance = tuned->moe_imbalance;
  }
  // The watchdog outlives the groups it watches: a rank whose peer died
  // leaves with a clear message instead of waiting forever.
  std::unique_ptr<parallel::CommWatchdog> watchdog;
  // On GPUs: NCCL groups for the tensors, with the MPI groups beside them for
  // the host's scalars.
  std::unique_ptr<parallel::ProcessGroups> groups;
  std::unique_ptr<parallel::CommWatchdog::Scope> armed;
  if (c.layout.world() > 1 || under_mpi()) {
#ifdef WEFT_HAVE_MPI
    watchdog = std::make_unique<parallel::CommWatchdog>(a.comm_timeout);
    if (gpu) {
#ifdef WEFT_HAVE_DEVICE_COMM
      const auto kind = c.comm == "mpi" ? parallel::DeviceCommKind::mpi : parallel::DeviceCommKind::nccl;
      groups = std::make_unique<parallel::ProcessGroups>(parallel::device_process_groups(kind, c.layout, nullptr));
      // The host groups' calls; NCCL operations are enqueued without
      // waiting, and the run names its waits for the GPU (where a dead
      // peer's NCCL operation would hang) to the watchdog itself. The MPI
      // device communicator waits on the host, inside its calls: watched too.
      if (kind == parallel::DeviceCommKind::mpi) watchdog->watch(*groups);
      watchdog->watch(*groups->host);
#endif
    } else {
      groups = std::make_unique<parallel::ProcessGroups>(parallel::mpi_process_groups(c.layout));
      watchdog->watch(*groups);
    }
    armed = std::make_unique<parallel::CommWatchdog::Scope>(*watchdog, "training");
    if (world_rank_from_env() == 0) std::fputs(mpirun_stop_note().c_str(), stdout);
    c.groups = groups.get();
    c.watchdog = watchdog.get();
#else
    throw InputError(fmt::format("layout {} needs {} ranks, but this build has no MPI",
                                 c.layout.to_string(), c.layout.world()));
#endif
  }
  c.optim.total_steps = c.steps;
  c.stop = &stop_flag();
  CountProgress bar(stdout, "training");
  c.on_step = [&bar](int64_t step, int64_t steps) { bar.update(step, steps); };
  const auto report = trainer::train(c, bar.log());
  bar.finish();
  const bool rank0 = world_rank_from_env() == 0;
  // The report also after a stop: it shows how far the run got.
  if (rank0 && !report.nothing_to_do) write_run_report(c.out_dir, stdout);
  if (rank0 && !report.nothing_to_do) print_summary(c, report);
  if (!report.error.empty()) {
    // Exit 2 with the error on rank 0 (every rank stops: they agreed on it).
    if (!rank0) return 2;
    throw InputError(fmt::format(
        "{}; {}", report.error,
        !c.checkpoints               ? std::string("--no-checkpoint: none was written")
        : report.checkpoint.empty() ? std::string("no step of this launch completed, so it wrote no checkpoint")
                                    : fmt::format("checkpoint {} holds step {}, the last completed{}", report.checkpoint,
                                                  report.last_step,
                                                  report.last_step < c.steps
                                                      ? ": continue from it with --resume and the new "
                                                        "--moe-imbalance, adding --change moe-imbalance"
                                                      : "")));
  }
  return report.interrupted ? stop_exit_code() : 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* sub = app.add_subcommand("train", "Train a model (no arguments: the tiny default model on "
                                          "the default corpus, on the CPU)");
  add_model_options(*sub, a->model);
  a->model_option = sub->get_option("--model");
  auto& c = a->cfg;
  sub->add_option("--data", c.data,
                  "Token data: a folder, a .tok, llm.c .bin or .npy file, or a Megatron prefix; several are read "
                  "back to back; a blend alternates weights and paths: 0.7 A 0.3 B (default: the prepared "
                  "fortunes corpus)");
  sub->add_option("--seq", a->seq, "Sequence length T")->capture_default_str();
  sub->add_option("--global-batch", a->global_batch, "Sequences per optimizer step")->capture_default_str();
  a->knobs = {
      sub->add_option("--mb", a->mb, "Micro-batch size (gradient accumulation over the rest)")->capture_default_str(),
      sub->add_option("--ckpt", a->ckpt, "Activation checkpointing: none, selective, ffn, full, full@K")
          ->capture_default_str(),
      sub->add_option("--attn", a->attention, "Attention: flash, materialized or cudnn (GPU builds with the cuDNN frontend)")->capture_default_str(),
      sub->add_option("--norm", a->norm, "RMSNorm: fused or unfused")->capture_default_str(),
      sub->add_option("--grad", a->grad,
                      "Gradient precision: fp32, or bf16 (GPU bf16 runs: half the gradient memory and dp traffic, "
                      "each accumulation and reduction rounded to bf16)")
          ->capture_default_str(),
      sub->add_option("--cp", a->cp,
                      "Context-parallel degree: ranks that split each sequence (T divisible by 2*cp)")
          ->capture_default_str(),
      sub->add_option("--ep", a->ep,
                      "Expert-parallel degree (MoE models): ranks of dp x cp the routed experts split over")
          ->capture_default_str(),
      sub->add_option("--etp", a->etp,
                      "Expert tp degree (MoE models): 1, every tp rank holding its experts whole, or the tp degree, "
                      "their width split over the tp ranks (under sp each dispatches its own rows, then they "
                      "gather what arrives)")
          ->capture_default_str(),
      sub->add_flag("--ep-fold", a->ep_fold,
                    "Fold the ep group over the tp ranks (MoE models, tp > 1, sp, etp 1; Megatron's expert grid): "
                    "each tp rank holds other experts, and --ep counts the tp ranks too"),
      sub->add_option("--dispatch", a->dispatch,
                      "How expert parallelism moves the routed rows: a2a (all-to-all with per-expert counts) or "
                      "allgather (every rank's rows gathered, the outputs reduce-scattered back)")
          ->capture_default_str(),
      sub->add_option("--cp-comm", a->cp_comm,
                      "How context-parallel ranks share keys and values: ring, allgather or a2a (cp > 1)")
          ->capture_default_str(),
      sub->add_option("--fp8", a->fp8,
                      "GEMM precision of the blocks' linear layers: off, tensorwise or delayed; RECIPE@N keeps the "
                      "first and last N blocks in bf16 (GPUs with FP8 tensor cores; emulated on the CPU)")
          ->capture_default_str(),
      sub->add_option("--zero", a->zero,
                      "ZeRO stage 0-3: 1 shards the optimizer state, 2 also the gradients, 3 also the weights, "
                      "over the dp x cp ranks")
          ->capture_default_str()};
  auto& t = a->tune;
  sub->add_flag("--auto", t.enabled,
                "Choose the layout by tuning with real steps on every rank, or reuse a cached recipe that matches "
                "(the default without --layout, --recipe or a layout knob; with knobs, they restrict the space)");
  sub->add_flag("--retune", t.retune, "Tune even when a cached recipe matches");
  sub->add_flag("--tune-all", t.all,
                "Profile every candidate (brute force: no --tune-top limit and no stop by the refit cost model)");
  a->tune_top = sub->add_option("--tune-top", t.top, "Profile at most this many candidates (default: 2% of them, at "
                                                      "least 16 and at most 96; with --tune-budget alone, every "
                                                      "candidate within the budget)");
  sub->add_option("--tune-budget", t.budget, "Start no trial after this long, e.g. 10m, 90s (default: none)");
  sub->add_option("--trial-warmup", t.trial_warmup, "Warm-up steps per trial")->capture_default_str();
  sub->add_option("--trial-steps", t.trial_steps, "Timed steps per trial, at least")->capture_default_str();
  sub->add_option("--trial-min-time", t.trial_min_time,
                  "Seconds the timed steps of a trial take at least (more steps when they are short)")
      ->capture_default_str();
  sub->add_option("--profile", t.profile,
                  "Device profile (weft calibrate, measured under this mpirun and --threads) the tuner ranks with");
  sub->add_option("--trial-timeout", t.trial_timeout,
                  "Seconds without communication progress before a trial is abandoned")
      ->capture_default_str();
  sub->add_option("--layout", a->layout,
                  "Parallel layout for mpirun, e.g. tp2-pp2-dp1-mb1 (overrides "
                  "--mb/--ckpt/--attn/--norm/--grad/--cp/--cp-comm/--fp8/--zero)")
      ->check(non_empty());
  sub->add_option("--comm", a->comm,
                  "What carries a multi-rank GPU run's tensors: nccl (a GPU per rank), mpi (through pinned host "
                  "memory; ranks may share a GPU, for checking rather than speed) or auto (nccl unless ranks share a "
                  "GPU)")
      ->capture_default_str();
  sub->add_option("--comm-timeout", a->comm_timeout,
                  "Seconds without progress in a collective before a rank gives up (multi-rank)")
      ->capture_default_str();
  sub->add_option("--recipe", a->recipe, "Train with a saved recipe's layout after checking it matches")
      ->check(non_empty());
  sub->add_flag("--force-recipe", a->force_recipe, "Use the recipe even where it does not match (warns)");
  sub->add_option("--device", a->device, "Device to train on: auto (a GPU when there is one), cpu or gpu; "
                  "the default is $WEFT_DEVICE when set")
      ->capture_default_str();
  sub->add_option("--memory-limit", a->memory_limit,
                  "Memory each rank may use, e.g. 2GiB (default: its share of the device): a layout the memory "
                  "model says cannot fit in it is refused before anything is allocated, and tuning prunes those");
  sub->add_option("--precision", a->precision, "auto (bf16 on a GPU, fp32 on the CPU), bf16 or fp32")
      ->capture_default_str();
  sub->add_option("--steps", c.steps, "Optimizer steps")->capture_default_str();
  sub->add_option("--lr", c.optim.lr, "Peak learning rate")->capture_default_str();
  sub->add_option("--min-lr-ratio", c.optim.min_lr_ratio, "Cosine floor as a fraction of --lr")
      ->capture_default_str();
  sub->add_option("--warmup", c.optim.warmup_steps, "Linear warm-up steps")->capture_default_str();
  sub->add_option("--schedule", a->schedule, "cosine or constant after warm-up")->capture_default_str();
  sub->add_option("--weight-decay", c.optim.weight_decay, "AdamW weight decay (2-D weights)")
      ->capture_default_str();
  sub->add_option("--beta1", c.optim.beta1, "AdamW beta1")->capture_default_str();
  sub->add_option("--beta2", c.optim.beta2, "AdamW beta2")->capture_default_str();
  sub->add_option("--adam-eps", c.optim.eps, "AdamW epsilon")->capture_default_str();
  sub->add_option("--clip", c.optim.clip, "Max global gradient norm (0: off)")->capture_default_str();
  sub->add_option("--max-nonfinite", c.optim.max_nonfinite,
                  "Stop after this many non-finite steps in a row")->capture_default_str();
  sub->add_option("--seed", c.seed, "Seed of the initialisation and data order")->capture_default_str();
  sub->add_option("--threads", c.threads, "CPU threads (0: every core)")->capture_default_str();
  sub->add_option("--log-every", c.log_every, "Steps between progress lines")->capture_default_str();
  sub->add_option("--eval-every", c.eval_every, "Steps between validation losses (0: end only)")
      ->capture_default_str();
  sub->add_option("--eval-samples", c.eval_samples, "Validation sequences per evaluation")
      ->capture_default_str();
  sub->add_option("--out", c.out_dir, "Run folder: metrics.jsonl and checkpoints/")->capture_default_str();
  sub->add_option("--ckpt-dir", c.ckpt_dir, "Checkpoint folder (default: <out>/checkpoints)");
  sub->add_option("--ckpt-every", c.ckpt_every, "Steps between checkpoints (0: at the end only)")
      ->capture_default_str();
  sub->add_flag("--sync-checkpoints", [&c](int64_t) { c.async_checkpoints = false; },
                "Write each periodic checkpoint before training goes on (by default a thread writes it while the "
                "next steps run; the final checkpoint is always complete before weft exits)");
  sub->add_flag("--no-checkpoint", [&c](int64_t) { c.checkpoints = false; },
                "Write no checkpoint at all, not even at the end (benchmarks, throwaway runs)");
  sub->add_flag("--resume", c.resume,
                "Continue the run in --out from its newest checkpoint (or start it there when it has none)");
  sub->add_flag("--overwrite", a->overwrite,
                "Start a new run in an --out that holds one, moving the earlier run aside to "
                "<out>.prev-<time> (nothing is deleted)");
  sub->add_option("--resume-from", c.resume_from, "Continue from this checkpoint folder");
  a->tensorboard_opt =
      sub->add_option("--tensorboard", a->tensorboard,
                      "Also write the metrics as TensorBoard event files into this folder (default with no "
                      "folder: <out>/tensorboard; a tuning's trials go to its tune/ folder)")
          ->expected(0, 1);
  sub->add_option("--change", c.changes,
                  "With --resume: optimizer settings, the seed or the data this command may change from the run's, "
                  "e.g. lr,warmup (any of lr, min-lr-ratio, warmup, schedule, beta1, beta2, adam-eps, weight-decay, "
                  "clip, seed, data); others that differ are refused")
      ->delimiter(',');
  sub->add_option("--init", c.init,
                  "Start from pretrained weights: a Hugging Face model folder (config.json and safetensors in "
                  "fp32, bf16 or fp16, one file or sharded) or a weft checkpoint folder. Training starts at step "
                  "0 with a fresh optimizer and data position (unlike --resume); the model is the folder's "
                  "unless --model names one, and --vocab may pad its vocabulary. --steps 0 writes the loaded "
                  "model as a checkpoint");
  add_lora_options(*sub, a->lora);
  sub->add_option("--lora-init", c.lora_init,
                  "Start the LoRA adapters from a PEFT adapter folder (adapter_config.json and "
                  "adapter_model.safetensors, as peft's save_pretrained and weft export --lora write) instead of "
                  "A at random and B zero; its r, alpha and targets must be --lora's");
  for (const auto& name : trainer::resumable_settings()) {
    CLI::Option* option = sub->get_option_no_throw("--" + name);
    WEFT_ASSERT(option != nullptr);
    a->resumable.emplace_back(name, option);
  }
  return {sub, [a] { return run_train(*a); }};
}

}  // namespace weft::cli
