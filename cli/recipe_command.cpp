// `weft recipe list|show|diff`: inspect saved recipes; `weft recipe sbatch`:
// a Slurm batch script that trains one (cli/sbatch.h).
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/sbatch.h"
#include "core/error.h"
#include "core/json_io.h"
#include "core/output_guard.h"
#include "tuner/recipe.h"

namespace weft::cli {

namespace {

struct RecipeArgs {
  std::string dir;
  std::string file, other;
  // sbatch
  std::string recipe, out, script, time, partition, account, train, weft;
  int64_t nodes = 0, tasks_per_node = 0, max_restarts = 3;
  CLI::Option* nodes_option = nullptr;
  CLI::Option* tasks_option = nullptr;
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

// The words of --train, as weft train parses them (the same option table),
// none of them one the script sets itself.
std::vector<std::string> train_words(const std::string& text, bool auto_tune) {
  std::vector<std::string> words = shell_words(text, "--train");
  for (const std::string& w : words) {
    const std::string name = w.substr(0, w.find('='));
    for (const char* own : {"--out", "--resume", "--resume-from", "--recipe", "--auto", "--layout"}) {
      if (name != own) continue;
      throw InputError(fmt::format("--train gives {}, which the script sets itself (the run folder, --resume and {}); "
                                   "drop it",
                                   own, auto_tune ? "--auto or the recipe it writes" : "--recipe"));
    }
    if (w.empty()) throw InputError("--train holds an empty word (''); drop it");
  }
  CLI::App check{"weft"};
  check.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  const Command train_command = add_train_command(check);  // holds the values the options write
  std::vector<std::string> args{"train"};
  args.insert(args.end(), words.begin(), words.end());
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector last word first
  try {
    check.parse(args);
  } catch (const CLI::ParseError& e) {
    throw InputError(fmt::format("--train: weft train would refuse these words: {}", e.what()));
  }
  return words;
}

int write_sbatch(const RecipeArgs& a) {
  namespace fs = std::filesystem;
  // Everything is checked before the run folder is made or the script written.
  if (a.out.empty()) throw InputError("--out is empty; give the run folder");
  {
    std::error_code ec;
    if (fs::exists(a.out, ec) && !fs::is_directory(a.out, ec))
      throw InputError(fmt::format("--out {} exists and is not a folder; give the run folder (new, or the run's own)",
                                   a.out));
  }
  SbatchSpec s;
  s.weft = fs::absolute(a.weft.empty() ? self_exe() : a.weft).string();
  if (!fs::is_regular_file(s.weft) || ::access(s.weft.c_str(), X_OK) != 0)
    throw InputError(fmt::format("--weft {} is not an executable file here; give the path of the weft binary the "
                                 "nodes run (the same path on every node)",
                                 s.weft));
  s.run_dir = fs::absolute(a.out).lexically_normal().string();
  if (!a.time.empty() && !slurm_time_valid(a.time))
    throw InputError(fmt::format("--time '{}' is not a Slurm time limit; use minutes, minutes:seconds, "
                                 "hours:minutes:seconds, days-hours, days-hours:minutes or days-hours:minutes:seconds "
                                 "(e.g. 24:00:00, 2-00:00:00)",
                                 a.time));
  static const std::regex name_re("^[A-Za-z0-9_.,+-]+$");
  for (const auto& [opt, value] : {std::pair<const char*, const std::string*>{"--partition", &a.partition},
                                   {"--account", &a.account}})
    if (!value->empty() && !std::regex_match(*value, name_re))
      throw InputError(fmt::format("--{} '{}' is not a Slurm name; use letters, digits and _ . , + - only", opt + 2,
                                   *value));
  s.time = a.time;
  s.partition = a.partition;
  s.account = a.account;
  if (a.max_restarts < 0)
    throw InputError(fmt::format("--max-restarts {}: give 0 or more requeues", a.max_restarts));
  s.max_restarts = a.max_restarts;
  if (a.nodes_option->count() > 0 && a.nodes < 1)
    throw InputError(fmt::format("--nodes {} must be at least 1", a.nodes));
  if (a.tasks_option->count() > 0 && a.tasks_per_node < 1)
    throw InputError(fmt::format("--tasks-per-node {} must be at least 1", a.tasks_per_node));
  const bool auto_tune = a.recipe == "auto";
  std::vector<std::string> inputs{s.weft};
  if (!auto_tune) inputs.push_back(a.recipe);
  {
    // The run folder is made before the script is written: never at the
    // script's path or under it.
    const fs::path script = fs::absolute(a.script).lexically_normal(), run = s.run_dir;
    const auto end = std::mismatch(script.begin(), script.end(), run.begin(), run.end()).first;
    if (end == script.end())
      throw InputError(fmt::format("--script {} is the run folder --out {} or holds it; write the script elsewhere",
                                   a.script, a.out));
  }
  output_check(a.script, OutputKind::sbatch_script, inputs, "--script");
  std::vector<std::string> train = train_words(a.train, auto_tune);
  const std::string train_text = a.train;
  if (auto_tune) {
    if (a.nodes_option->count() == 0 || a.tasks_option->count() == 0)
      throw InputError("recipe 'auto' tunes in the allocation: give its size with --nodes and --tasks-per-node");
    s.nodes = a.nodes;
    s.tasks_per_node = a.tasks_per_node;
    s.job_name = "weft-auto";
    s.summary = fmt::format("tune, then train, on {} x {} ranks; weft train {}", a.nodes, a.tasks_per_node, train_text);
  } else {
    const tuner::Recipe r = tuner::recipe_load(a.recipe);
    s.recipe = fs::absolute(a.recipe).lexically_normal().string();
    // The recipe's own shape unless told: gpus_per_node ranks a node.
    const bool nodes_given = a.nodes_option->count() > 0, tasks_given = a.tasks_option->count() > 0;
    int64_t per_node = tasks_given ? a.tasks_per_node : 0, nodes = nodes_given ? a.nodes : 0;
    if (!tasks_given && nodes_given && r.world % nodes == 0) per_node = r.world / nodes;
    if (per_node <= 0) per_node = r.gpus_per_node > 0 ? std::min(r.gpus_per_node, r.world) : r.world;
    if (!nodes_given) {
      if (r.world % per_node != 0)
        throw InputError(fmt::format("--tasks-per-node {} does not divide recipe {}'s {} ranks: give a count that "
                                     "divides {}",
                                     per_node, a.recipe, r.world, r.world));
      nodes = r.world / per_node;
    }
    if (nodes * per_node != r.world)
      throw InputError(fmt::format("--nodes {} x --tasks-per-node {} is {} ranks, and recipe {} is for {}: give "
                                   "counts whose product is {}",
                                   nodes, per_node, nodes * per_node, a.recipe, r.world, r.world));
    s.nodes = nodes;
    s.tasks_per_node = per_node;
    s.job_name = "weft-" + r.model.name;
    // What the recipe must match (weft train --recipe checks it), then the rest.
    std::vector<std::string> fixed{"--model", r.model.name, "--seq", std::to_string(r.run.seq), "--global-batch",
                                   std::to_string(r.run.global_batch), "--precision", to_string(r.run.precision)};
    train.insert(train.begin(), fixed.begin(), fixed.end());
    s.summary = one_line(r);
  }
  s.train_words = train;
  std::error_code ec;
  fs::create_directories(s.run_dir, ec);
  if (ec) throw InputError(fmt::format("--out {}: cannot create the run folder: {}", a.out, ec.message()));
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
  sbatch->add_option("--script", a->script, "Where to write the batch script (a new file, or a script it wrote "
                                             "earlier)")->required();
  a->nodes_option = sbatch->add_option("--nodes", a->nodes, "Nodes (default: the recipe's world over its GPUs per node)");
  a->tasks_option =
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
