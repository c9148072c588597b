// `weft recipe list|show|diff`: inspect saved recipes; `weft recipe sbatch`:
// a Slurm batch script that trains one (cli/sbatch.h).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/sbatch.h"
#include "core/error.h"
#include "core/json_io.h"
#include "tuner/recipe.h"

namespace weft::cli {

namespace {

struct RecipeArgs {
  std::string dir;
  std::string file, other;
  // sbatch
  std::string recipe, out, script, time, partition, account, train, weft;
  int64_t nodes = 0, tasks_per_node = 0, max_restarts = 3;
};

std::string one_line(const tuner::Recipe& r) {
  const double mfu = r.measured.value("mfu", r.predicted.value("mfu", 0.0));
  // An FP8 recipe's MFU is against the same dense bf16 peak: said, so that
  // it is not read against the FP8 one.
  return fmt::format("{} on {} x {} (seq {}, global batch {}): {} [{}; MFU {:.1f}%{}{}]", r.model.name, r.world,
                     r.device, r.run.seq, r.run.global_batch, r.layout.to_string(), r.source, 100 * mfu,
                     r.layout.fp8 != Fp8Recipe::off ? " vs the dense bf16 peak" : "",
                     r.machine.empty() ? "" : "; measured on " + r.machine);
}

std::string self_exe() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("weft") : p.string();
}

int write_sbatch(const RecipeArgs& a) {
  namespace fs = std::filesystem;
  SbatchSpec s;
  s.weft = fs::absolute(a.weft.empty() ? self_exe() : a.weft).string();
  s.run_dir = fs::absolute(a.out).lexically_normal().string();
  s.time = a.time;
  s.partition = a.partition;
  s.account = a.account;
  if (a.max_restarts < 0)
    throw InputError(fmt::format("--max-restarts {}: give 0 or more requeues", a.max_restarts));
  s.max_restarts = a.max_restarts;
  std::string train = a.train;
  if (a.recipe == "auto") {
    if (a.nodes <= 0 || a.tasks_per_node <= 0)
      throw InputError("recipe 'auto' tunes in the allocation: give its size with --nodes and --tasks-per-node");
    s.nodes = a.nodes;
    s.tasks_per_node = a.tasks_per_node;
    s.job_name = "weft-auto";
    s.summary = fmt::format("tune, then train, on {} x {} ranks; weft train {}", a.nodes, a.tasks_per_node, train);
  } else {
    const tuner::Recipe r = tuner::recipe_load(a.recipe);
    s.recipe = fs::absolute(a.recipe).lexically_normal().string();
    // The recipe's own shape unless told: gpus_per_node ranks a node.
    int64_t per_node = a.tasks_per_node, nodes = a.nodes;
    if (per_node <= 0 && nodes > 0 && r.world % nodes == 0) per_node = r.world / nodes;
    if (per_node <= 0) per_node = r.gpus_per_node > 0 ? std::min(r.gpus_per_node, r.world) : r.world;
    if (nodes <= 0) nodes = per_node > 0 ? r.world / per_node : 0;
    if (nodes * per_node != r.world)
      throw InputError(fmt::format("--nodes {} x --tasks-per-node {} is {} ranks, and recipe {} is for {}: give "
                                   "counts whose product is {}",
                                   nodes, per_node, nodes * per_node, a.recipe, r.world, r.world));
    s.nodes = nodes;
    s.tasks_per_node = per_node;
    s.job_name = "weft-" + r.model.name;
    // What the recipe must match (weft train --recipe checks it), then the rest.
    train = fmt::format("--model {} --seq {} --global-batch {} --precision {}{}{}", r.model.name, r.run.seq,
                        r.run.global_batch, to_string(r.run.precision), train.empty() ? "" : " ", train);
    s.summary = one_line(r);
  }
  s.train_args = train;
  fs::create_directories(s.run_dir);
  file_write_atomic(a.script, sbatch_script(s));
  fs::permissions(a.script, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                  fs::perm_options::add);
  fmt::print("wrote {}: {} node(s) x {} rank(s), run folder {}; submit with: sbatch {}\n", a.script, s.nodes,
             s.tasks_per_node, s.run_dir, a.script);
  return 0;
}


}  // namespace

Command add_recipe_command(CLI::App& app) {
  auto a = std::make_shared<RecipeArgs>();
  auto* sub = app.add_subcommand("recipe", "List, show and compare saved recipes");
  sub->require_subcommand(1);
  auto* list = sub->add_subcommand("list", "Recipes in a folder (default: the recipe cache)");
  list->add_option("dir", a->dir, "Folder of recipe .json files");
  auto* show = sub->add_subcommand("show", "Print a recipe");
  show->add_option("file", a->file, "Recipe file")->required();
  auto* diff = sub->add_subcommand("diff", "Fields that differ between two recipes (exit 1 when they differ, as diff does)");
  diff->add_option("a", a->file, "First recipe")->required();
  diff->add_option("b", a->other, "Second recipe")->required();
  auto* sbatch = sub->add_subcommand("sbatch", "Write a Slurm batch script that trains a recipe (or tunes first), "
                                               "resumes from the last checkpoint and requeues itself after failures");
  sbatch->add_option("recipe", a->recipe, "Recipe file, or auto: tune in the allocation, then train")->required();
  sbatch->add_option("--out", a->out, "The run folder (created; the job's output goes there too)")->required();
  sbatch->add_option("--script", a->script, "Where to write the batch script")->required();
  sbatch->add_option("--nodes", a->nodes, "Nodes (default: the recipe's world over its GPUs per node)");
  sbatch->add_option("--tasks-per-node", a->tasks_per_node, "Ranks per node (default: the recipe's GPUs per node)");
  sbatch->add_option("--time", a->time, "Time limit, as sbatch takes it (e.g. 24:00:00)");
  sbatch->add_option("--partition", a->partition, "Slurm partition");
  sbatch->add_option("--account", a->account, "Slurm account");
  sbatch->add_option("--max-restarts", a->max_restarts, "Requeues after failed launches, at most")
      ->capture_default_str();
  sbatch->add_option("--weft", a->weft, "The weft binary the nodes run (default: this one)");
  sbatch->add_option("--train", a->train,
                     "More arguments of weft train, as shell words (e.g. \"--data /data/tokens --steps 10000\")");
  return {sub, [a, list, show, diff, sbatch] {
            namespace fs = std::filesystem;
            if (sbatch->parsed()) return write_sbatch(*a);
            if (list->parsed()) {
              const std::string dir = a->dir.empty() ? tuner::recipe_cache_dir() : a->dir;
              if (!fs::is_directory(dir)) {
                fmt::print("no recipes: {} does not exist\n", dir);
                return 0;
              }
              std::vector<std::string> files;
              for (const auto& e : fs::directory_iterator(dir))
                if (e.path().extension() == ".json") files.push_back(e.path().string());
              std::sort(files.begin(), files.end());
              for (const auto& f : files) {
                try {
                  fmt::print("{}: {}\n", f, one_line(tuner::recipe_load(f)));
                } catch (const InputError& e) {
                  fmt::print("{}: unreadable ({})\n", f, e.what());
                }
              }
              return 0;
            }
            if (show->parsed()) {
              const auto r = tuner::recipe_load(a->file);
              fmt::print("{}\n{}\n", one_line(r), tuner::recipe_to_json(r).dump(2));
              return 0;
            }
            const auto d = tuner::recipe_diff(tuner::recipe_load(a->file), tuner::recipe_load(a->other));
            if (d.empty()) fmt::print("the recipes are the same\n");
            for (const auto& line : d) fmt::print("{}\n", line);
            (void)diff;
            return d.empty() ? 0 : 1;  // as diff(1): 1 when they differ
          }};
}

}  // namespace weft::cli
