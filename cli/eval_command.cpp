// `weft eval`: the loss and perplexity of a checkpoint on validation samples
// of one dataset or of each of several.
#include <memory>

#include "cli/commands.h"
#include "core/stop.h"
#include "trainer/eval.h"

namespace weft::cli {

Command add_eval_command(CLI::App& app) {
  auto c = std::make_shared<trainer::EvalConfig>();
  auto* sub = app.add_subcommand("eval", "Evaluate a checkpoint's loss and perplexity on validation samples");
  sub->add_option("--checkpoint", c->checkpoint, "Checkpoint folder")->required();
  sub->add_option("--data", c->data,
                  "Token data: a folder, a .tok, llm.c .bin or .npy file, or a Megatron prefix; with several, the "
                  "loss of each and overall; a blend alternates weights and paths: 0.7 A 0.3 B (default: the "
                  "prepared fortunes corpus)");
  sub->add_option("--samples", c->samples, "Validation sequences per dataset")->capture_default_str();
  sub->add_option("--seq", c->seq, "Sequence length (default: the checkpoint's)");
  sub->add_option("--dump", c->dump_dir, "Write tokens.npy and logits.npy of the first dataset's first sample here");
  return {sub, [c] {
            StopScope stoppable;
            trainer::evaluate(*c, stdout);
            return 0;
          }};
}

}  // namespace weft::cli
