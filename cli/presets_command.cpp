#include <fmt/format.h>

#include "cli/commands.h"
#include "core/device_spec.h"
#include "core/model_spec.h"

namespace weft::cli {

Command add_presets_command(CLI::App& app) {
  auto* sub = app.add_subcommand("presets", "List the model and device presets");
  return {sub, [] {
    fmt::print("models:\n");
    for (const auto& name : model_preset_names())
      fmt::print("  {}\n", model_preset(name).summary());
    fmt::print("devices:\n");
    for (const auto& name : device_preset_names())
      fmt::print("  {}\n", device_preset(name).summary());
    return 0;
  }};
}

}  // namespace weft::cli
