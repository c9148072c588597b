// weft export: a checkpoint folder to a Hugging Face model folder.
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "trainer/checkpoint/export_hf.h"
#include "trainer/lora_export.h"

namespace weft::cli {

Command add_export_command(CLI::App& app) {
  struct Args {
    std::string checkpoint;
    std::string out;
    bool lora = false;
    bool merge = false;
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
  auto* lora = sub->add_flag("--lora", args->lora,
                             "For a LoRA checkpoint: write its adapters as a PEFT adapter folder (adapter_config.json, "
                             "adapter_model.safetensors) that peft loads onto the base model");
  sub->add_flag("--merge", args->merge,
                "For a LoRA checkpoint: write the base model with the adapters merged in (W + alpha/r B A), a Hugging "
                "Face folder")
      ->excludes(lora);
  return {sub, [args] {
            if (args->lora) {
              trainer::lora_export_adapter(args->checkpoint, args->out);
              fmt::print("exported the LoRA adapters of {} to {} (adapter_config.json, adapter_model.safetensors)\n",
                         args->checkpoint, args->out);
            } else if (args->merge) {
              trainer::lora_export_merged(args->checkpoint, args->out);
              fmt::print("exported {} merged into its base model to {} (config.json, model.safetensors)\n",
                         args->checkpoint, args->out);
            } else {
              checkpoint::export_hf(args->checkpoint, args->out);
              fmt::print("exported {} to {} (config.json, model.safetensors)\n", args->checkpoint, args->out);
            }
            return 0;
          }};
}

}  // namespace weft::cli
