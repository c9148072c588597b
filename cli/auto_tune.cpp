#include "cli/auto_tune.h"
#include "cli/options.h"
#include "cli/progress.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "tuner/device_profile.h"
#include "report/tensorboard.h"
#include "report/tune_report.h"
#include "tuner/recipe.h"
#ifdef WEFT_HAVE_MPI
#include "trainer/parallel/comm_mpi.h"
#endif
#include "trainer/parallel/device_comm.h"

namespace weft::cli {

namespace {

namespace fs = std::filesystem;

std::string cache_name(const tuner::SpaceContext& ctx) {
  return fmt::format("{}-{}x{}-seq{}-gb{}{}-{}.json", ctx.model.name, ctx.cluster.gpus, ctx.cluster.device.name,
                     ctx.run.seq, ctx.run.global_batch,
                     ctx.run.lora.enabled() ? fmt::format("-lora{}", ctx.run.lora.rank) : "",
                     ctx.model.hash().substr(0, 12));
}

// A profiled recipe in the cache that matches this run and whose layout the
// space allows; empty when there is none. Unreadable files are skipped with a
// warning: the cache must never stop a run.
std::string find_cached(const tuner::SpaceContext& ctx, const std::vector<Layout>& space, std::FILE* log) {
  const fs::path dir = tuner::recipe_cache_dir();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  const fs::path preferred = dir / cache_name(ctx);
  std::stable_partition(files.begin(), files.end(), [&](const fs::path& p) { return p == preferred; });
  for (const auto& f : files) {
    try {
      const auto r = tuner::recipe_load(f.string());
      if (r.source != "profiled" || !tuner::recipe_mismatches(r, ctx.model, ctx.cluster, ctx.run).empty()) continue;
      if (std::find(space.begin(), space.end(), r.layout) == space.end()) continue;
      return f.string();
    } catch (const Error& e) {
      fmt::print(log, "warning: skipping cached recipe {}: {}\n", f.string(), e.what());
    }
  }
  return {};
}

}  // namespace

std::string machine_description() {
  std::ifstream info("/proc/cpuinfo");
  std::string model = "unknown CPU";
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return fmt::format("{}, {} cores", model, std::thread::hardware_concurrency());
}

std::optional<AutoChoice> auto_layout(const trainer::TrainConfig& base, const tuner::SpaceLimits& limits,
                                      const AutoArgs& a, int64_t world, bool multi_rank, std::FILE* log) {
  tuner::TuneOptions o;
  o.top = a.all ? std::numeric_limits<int64_t>::max() : a.top;
  o.model_stop = !a.all;
  if (a.all) o.cut_factor = 0;  // brute force measures every layout in full
  if (!a.budget.empty()) o.budget_s = tuner::duration_parse(a.budget);
  o.warmup_steps = a.trial_warmup;
  o.timed_steps = a.trial_steps;
  o.min_timed_s = a.trial_min_time;
  o.silence_s = a.trial_timeout;
  if (const char* f = std::getenv("WEFT_TUNE_FAULT")) o.faults = f;
  o.size_buffers = a.size_moe_buffers;

  tuner::SpaceContext ctx;
  ctx.model = base.model;
  ctx.run = base.run;
  ctx.cluster.device = base.device;
  ctx.cluster.gpus = world;
  // Ranks per node as the launcher placed them (mpirun's local size, or
  // Slurm's tasks per node): under Slurm the allocation's shape, so layouts
  // whose tp or cp group would span nodes are priced over the network.
  const int64_t local = local_ranks_from_env();
  // The CPU probe needs a core a rank: ranks sharing cores make it time the
  // scheduler (trainer::ProfileConfig::probe).
  o.probe = local * std::max<int64_t>(1, base.threads) <= std::max<int64_t>(1, device_preset("cpu").sm_count);
  ctx.cluster.gpus_per_node = local > 0 && local <= world && world % local == 0 ? local : world;
  ctx.constants = tuner::cost_defaults(base.device);
  if (base.device.shared_by > 1 && log && world_rank_from_env() == 0)
    fmt::print(log, "note: {} ranks share each GPU, so the trials' tensors travel over MPI through host memory "
                    "(--comm {}): their timings are not those of separate GPUs, and the recipe is kept for runs "
                    "that share GPUs alike\n",
               base.device.shared_by, base.comm);
  if (!a.profile.empty()) {
    const auto p = tuner::profile_load(a.profile);
    tuner::profile_use(p, a.profile, tuner::machine_fingerprint(base.device, local_ranks_from_env(), base.threads),
                       ctx.cluster, ctx.constants);
  }

  std::unique_ptr<parallel::Comm> control;
  trainer::GroupFactory make_groups;
#ifdef WEFT_HAVE_MPI
  if (multi_rank) {
    control = parallel::mpi_world_dup("control");
    if (base.device.kind == DeviceKind::gpu) {
#ifdef WEFT_HAVE_DEVICE_COMM
      const auto kind = base.comm == "mpi" ? parallel::DeviceCommKind::mpi : parallel::DeviceCommKind::nccl;
      make_groups = [kind](const Layout& l, const std::atomic<bool>* cancel) {
        return parallel::device_process_groups(kind, l, cancel);
      };
#else
      throw InputError("tuning on several GPUs needs MPI and CUDA together, which this build lacks; use --device cpu");
#endif
    } else {
      make_groups = [](const Layout& l, const std::atomic<bool>* cancel) {
        return parallel::mpi_process_groups(l, {}, cancel);
      };
    }
  }
#else
  if (multi_rank) throw InputError("tuning on several ranks needs MPI, which this build lacks");
#endif
  if (!control) control = parallel::single_rank_comm();
  const bool rank0 = control->rank() == 0;
  std::FILE* out = rank0 ? log : nullptr;

  trainer::set_threads(base.threads);
  const auto space = tuner::enumerate(ctx.model, ctx.run, world, limits, ctx.cluster);
  if (!a.retune) {
    std::string cached = rank0 ? find_cached(ctx, space, log) : std::string();
    cached = tuner::share_text(*control, cached);
    if (!cached.empty()) {
      // The layout, and the receive buffers the recipe's tuning sized, or
      // more where the layout's memory leaves room (a recipe of an older
      // weft kept its trials' factor); as text, so that every rank takes
      // the same bits.
      std::string choice;
      double sized = 0;
      if (rank0) {
        const auto rc = tuner::recipe_load(cached);
        sized = a.size_moe_buffers ? rc.model.moe.imbalance : 0.0;
        choice = fmt::format("{} {:.17g}", rc.layout.to_string(), tuner::run_buffer_factor(ctx, rc.layout, sized));
      }
      choice = tuner::share_text(*control, choice);
      const size_t space_at = choice.rfind(' ');
      AutoChoice c{Layout::parse(choice.substr(0, space_at)), std::stod(choice.substr(space_at + 1))};
      if (out)
        fmt::print(out, "using cached recipe {} (layout {}{}); --retune tunes again\n", cached, c.layout.to_string(),
                   c.moe_imbalance > sized ? fmt::format(", MoE receive buffers at {:g}x: it sized them at {:g}x, and "
                                                         "the layout's memory holds more",
                                                         c.moe_imbalance, sized)
                   : c.moe_imbalance > 0 ? fmt::format(", MoE receive buffers at {:g}x as it sized them", c.moe_imbalance)
                                         : "");
      return c;
    }
  }

  const fs::path dir = base.out_dir;
  o.journal = (dir / "tuning" / "journal.jsonl").string();
  if (rank0) {
    fs::create_directories(dir / "tuning");
    // A fresh tuning keeps the previous journal beside the new one.
    if (a.retune && fs::exists(o.journal)) fs::rename(o.journal, o.journal + ".prev");
  }
  CountProgress bar(log, "tuning trials");
  if (rank0) o.progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
  const tuner::TuneResult r = tuner::tune(ctx, limits, base, o, *control, make_groups, out ? bar.log() : nullptr);
  bar.finish();
  if (r.stopped) {
    // A part of a tuning: its report says how far it got, and nothing a
    // later run would trust (recipe.json, the cache) is written.
    if (rank0) {
      file_write_atomic((dir / "tuning.md").string(), report::tune_report_md(r, ctx));
      file_write_atomic((dir / "tuning.json").string(), report::tune_report_json(r, ctx).dump(1) + "\n");
      if (!a.tensorboard.empty()) report::tensorboard_trials(a.tensorboard, r);
      fmt::print(log, "\ntuning {} after {} trials: no recipe saved and nothing trained; the same command "
                      "continues the tuning from {} (report {})\n",
                 r.stop_reason, r.trials.size(), o.journal, (dir / "tuning.md").string());
      std::fflush(log);
    }
    return std::nullopt;
  }
  if (!r.winner) {
    // The report of the trials that failed, and the first one's reason.
    if (rank0) {
      file_write_atomic((dir / "tuning.md").string(), report::tune_report_md(r, ctx));
      file_write_atomic((dir / "tuning.json").string(), report::tune_report_json(r, ctx).dump(1) + "\n");
    }
    const auto first = std::find_if(r.trials.begin(), r.trials.end(), [](const tuner::TrialRecord& t) {
      return !t.reason.empty();
    });
    throw InputError(fmt::format("tuning found no layout that runs: every trial failed ({} of them{}); see {}",
                                 r.trials.size(),
                                 first == r.trials.end()
                                     ? std::string()
                                     : fmt::format("; the first, {}: {} ({})", first->layout.to_string(),
                                                   first->status, first->reason),
                                 (dir / "tuning.md").string()));
  }
  const AutoChoice chosen{r.trials[*r.winner].layout, r.moe_imbalance};
  if (rank0) {
    const std::string md = report::tune_report_md(r, ctx);
    file_write_atomic((dir / "tuning.md").string(), md);
    file_write_atomic((dir / "tuning.json").string(), report::tune_report_json(r, ctx).dump(1) + "\n");
    if (!a.tensorboard.empty()) report::tensorboard_trials(a.tensorboard, r);
    const auto recipe = tuner::tune_recipe(r, ctx, machine_description());
    tuner::recipe_save((dir / "recipe.json").string(), recipe);
    std::string cached = (fs::path(tuner::recipe_cache_dir()) / cache_name(ctx)).string();
    try {
      tuner::recipe_save(cached, recipe);
    } catch (const std::exception& e) {
      cached = fmt::format("not cached ({})", e.what());
    }
    fmt::print(log, "\n{}\nrecipe {} (cache: {}); report {}\n\n", md, (dir / "recipe.json").string(), cached,
               (dir / "tuning.md").string());
    std::fflush(log);
  }
  return chosen;
}

}  // namespace weft::cli
