#include <fmt/format.h>

#include "cli/commands.h"
#include "core/device_spec.h"
#include "core/model_spec.h"

namespace weft::cli {

Command add_presets_command(CLI::App& app) {
  auto* sub = app.add_subcommand("presets", "List the model, device and cluster presets");
  return {sub, [] {
    fmt::print("models:\n");
    for (const auto& name : model_preset_names())
      fmt::print("  {}\n", model_preset(name).summary());
    fmt::print("devices:\n");
    for (const auto& name : device_preset_names())
      fmt::print("  {}\n", device_preset(name).summary());
    fmt::print("clusters (--gpu NAME --gpus N, shown for N = 16; or a cluster JSON file):\n");
    for (const auto& name : cluster_preset_names())
      fmt::print("  {:<14} {}\n", name, cluster_resolve(name, 16, kUnset).summary());
    if (const auto gpu = gpu_detect()) fmt::print("this machine's GPU:\n  {} ({} SMs)\n", gpu->summary(), gpu->sm_count);
    else fmt::print("this machine: no GPU (or a build without CUDA)\n");
    return 0;
  }};
}

}  // namespace weft::cli
