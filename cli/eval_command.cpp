// `weft eval`: the loss of a checkpoint on validation samples.
#include <memory>

#include "cli/commands.h"
#include "trainer/eval.h"

namespace weft::cli {

Command add_eval_command(CLI::App& app) {
  auto c = std::make_shared<trainer::EvalConfig>();
  auto* sub = app.add_subcommand("eval", "Evaluate a checkpoint's loss on validation samples");
  sub->add_option("--checkpoint", c->checkpoint, "Checkpoint folder")->required();
  sub->add_option("--data", c->data, "Token file or folder (default: the prepared fortunes corpus)");
  sub->add_option("--samples", c->samples, "Validation sequences")->capture_default_str();
  sub->add_option("--seq", c->seq, "Sequence length (default: the checkpoint's)");
  sub->add_option("--dump", c->dump_dir, "Write tokens.npy and logits.npy of the first sample here");
  return {sub, [c] {
            trainer::evaluate(*c, stdout);
            return 0;
          }};
}

}  // namespace weft::cli
