// Recipes: the layout chosen for a (model, cluster, run), with what was
// predicted and, once profiled, measured. A JSON file that `weft train
// --recipe` reuses after checking it matches: model hash, device, world size,
// seq, global batch and weft version, each differing field named.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device_spec.h"
#include "core/layout.h"
#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft::tuner {

constexpr int64_t kRecipeFormatVersion = 1;

struct Recipe {
  int64_t format_version = kRecipeFormatVersion;
  std::string weft_version;
  ModelSpec model;
  std::string device;          // device name
  int64_t device_memory = 0;   // bytes
  int64_t world = 0;
  int64_t gpus_per_node = 0;
  // Ranks that shared each GPU while it was tuned (1: a GPU each): timings
  // over a shared GPU are not a cluster's, so the count must match to reuse.
  int64_t ranks_per_device = 1;
  RunSpec run;
  Layout layout;
  std::string source;          // "dry-run" (predicted only) or "profiled"
  std::string machine;         // what the measurements ran on, e.g. the CPU model and cores
  nlohmann::json predicted = nlohmann::json::object();  // step_s, tokens_per_s, mfu, peak bytes
  nlohmann::json measured = nlohmann::json::object();   // the same, from real steps
  nlohmann::json tuning = nlohmann::json::object();     // summary: evaluated, fitting, pruned
};

// A recipe of this weft version for a layout of (model, cluster, run), with
// nothing predicted or measured yet.
Recipe recipe_for(const ModelSpec& m, const ClusterSpec& c, const RunSpec& run, const Layout& layout,
                  std::string source);

nlohmann::json recipe_to_json(const Recipe& r);
// FileFormatError naming `origin` and the field for a malformed recipe.
Recipe recipe_from_json(const nlohmann::json& j, const std::string& origin);

// Writes atomically (a good recipe is never replaced by a half-written one).
void recipe_save(const std::string& path, const Recipe& r);
Recipe recipe_load(const std::string& path);

// Every field where the recipe differs from this run, as
// "world size: recipe 64, this run 32"; empty when it matches.
std::vector<std::string> recipe_mismatches(const Recipe& r, const ModelSpec& m, const ClusterSpec& c,
                                           const RunSpec& run);

// Field-by-field differences between two recipes, for `weft recipe diff`.
std::vector<std::string> recipe_diff(const Recipe& a, const Recipe& b);

// $XDG_CACHE_HOME/weft/recipes, else ~/.cache/weft/recipes.
std::string recipe_cache_dir();

}  // namespace weft::tuner
