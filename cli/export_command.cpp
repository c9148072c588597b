// weft export: a checkpoint folder to a Hugging Face model folder.
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "trainer/checkpoint/export_hf.h"

namespace weft::cli {

Command add_export_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string out;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "export",
      "Write a checkpoint as a Hugging Face model folder (config.json + model.safetensors)");
  sub->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint folder to export (e.g. checkpoints/step_001000)")
      ->required();
  sub->add_option("--out", args->out, "Folder to write; must be new, empty or an earlier export")
      ->required();
  return {sub, [args] {
            checkpoint::export_hf(args->checkpoint, args->out);
            fmt::print("exported {} to {} (config.json, model.safetensors)\n", args->checkpoint,
                       args->out);
            return 0;
          }};
}

}  // namespace weft::cli
