// `weft recipe list|show|diff`: inspect saved recipes.
#include <algorithm>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"
#include "tuner/recipe.h"

namespace weft::cli {

namespace {

struct RecipeArgs {
  std::string dir;
  std::string file, other;
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
  return {sub, [a, list, show, diff] {
            namespace fs = std::filesystem;
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
