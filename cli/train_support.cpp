// The helpers `weft train` runs beside the trainer (train_args.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "cli/train_args.h"
#include "core/error.h"
#include "core/flops.h"
#include "core/stop.h"
#include "core/units.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/pretrained.h"

namespace weft::cli {

// On Ctrl-C, Open MPI's mpirun sends the ranks SIGTERM after
// odls_base_sigkill_timeout seconds (1 by default) and SIGKILL as long again
// later: too little time, on most models, to finish the step and save the
// checkpoint a stop saves. A note with the ways to keep it; empty when the
// setting gives them 10 s or more, or outside Open MPI.
std::string mpirun_stop_note() {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return "";
  const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  const long grace = v ? std::strtol(v, nullptr, 10) : 1;
  if (grace >= 10) return "";
  return fmt::format(
      "note: on Ctrl-C mpirun gives the ranks {} s before it kills them, likely too little to save the stop's "
      "checkpoint; to keep it, send SIGTERM to the weft processes instead, or run mpirun --mca "
      "odls_base_sigkill_timeout 20\n",
      grace);
}

// The model of a run with --init: the folder's own unless --model names one
// (--vocab pads either), checked against the folder's config or manifest and
// tensors here, before the data scan and any tuning, so that a bad folder
// costs nothing. A relaunched --resume run that has a checkpoint takes the
// model from it and no longer needs the folder.
ModelSpec init_model(const TrainArgs& a, const trainer::TrainConfig& c) {
  ModelSpec m = a.model.resolve();
  const bool given = a.model_option->count() > 0;
  const auto with_vocab = [&](ModelSpec from) {
    if (a.model.vocab > 0) from.vocab = a.model.vocab;
    a.model.apply_moe_options(from);
    from.validate();
    return from;
  };
  if (c.resume)
    if (const auto latest =
            checkpoint::resume_checkpoint(c.ckpt_dir.empty() ? c.out_dir + "/checkpoints" : c.ckpt_dir))
      return given ? m : with_vocab(checkpoint::pretrained_model(*latest));
  const auto pretrained = checkpoint::pretrained_open(c.init, checkpoint::Verify::structure);
  if (!given) m = with_vocab(pretrained.model);
  try {
    checkpoint::pretrained_check(pretrained.model, m, c.init);
  } catch (const InputError& e) {
    if (!given) throw;
    throw InputError(fmt::format("{}; without --model the run takes the folder's own model", e.what()));
  }
  return m;
}

// The end-of-run summary: what ran, how fast, how well, and where the files are.
void print_summary(const trainer::TrainConfig& c, const trainer::TrainReport& r) {
  const int64_t ran = std::max<int64_t>(0, r.last_step - r.first_step + 1);
  std::string s = fmt::format("\n{} after {} step{} ({}..{} of {}) in {}: {} tokens, {:.0f} tok/s\n",
                              r.interrupted       ? fmt::format("stopped by {}", stop_signal_name())
                              : !r.error.empty() ? std::string("stopped on an error")
                                                 : std::string("finished"),
                              ran,
                              ran == 1 ? "" : "s", r.first_step, r.last_step, c.steps, format_seconds(r.seconds),
                              ran * c.run.tokens_per_step(), r.tokens_per_second);
  if (!r.losses.empty())
    s += fmt::format("  loss {:.4f} -> {:.4f}", r.losses.front(), r.losses.back());
  if (!std::isnan(r.val_loss)) s += fmt::format(" | validation {:.4f} (unigram baseline {:.4f})", r.val_loss, r.baseline);
  if (!r.losses.empty() || !std::isnan(r.val_loss)) s += "\n";
  if (c.run.lora.enabled())
    s += fmt::format("  parameters  {} trainable (LoRA adapters) of {}, the base frozen\n",
                     lora_params(c.model, c.run.lora), c.model.param_count());
  if (!r.checkpoint.empty()) s += fmt::format("  checkpoint  {}\n", r.checkpoint);
  s += fmt::format("  metrics     {}/metrics.jsonl\n", c.out_dir);
  s += fmt::format("  memory      {}/memory/\n", c.out_dir);
  if (r.interrupted) s += "  continue with the same command and --resume\n";
  std::fputs(s.c_str(), stdout);
}

// A knob given beside --layout or --recipe must say what the layout says:
// one of the two would otherwise be dropped without a word. InputError
// naming both.
void knobs_agree(const TrainArgs& a, const Layout& knobs, const Layout& layout, const std::string& what) {
  for (CLI::Option* o : a.knobs) {
    if (o->count() == 0) continue;
    const std::string name = o->get_name();
    bool same = true;
    std::string says;
    if (name == "--mb") same = knobs.mb == layout.mb, says = fmt::format("mb{}", layout.mb);
    if (name == "--ckpt") {
      same = knobs.ckpt == layout.ckpt && knobs.ckpt_layers == layout.ckpt_layers;
      says = fmt::format("ckpt:{}{}", to_string(layout.ckpt),
                         layout.ckpt_layers > 0 ? fmt::format("@{}", layout.ckpt_layers) : "");
    }
    if (name == "--attn") same = knobs.attention == layout.attention, says = fmt::format("attn:{}", to_string(layout.attention));
    if (name == "--norm") same = knobs.norm == layout.norm, says = fmt::format("norm:{}", to_string(layout.norm));
    if (name == "--grad") same = knobs.grad == layout.grad, says = fmt::format("grad:{}", to_string(layout.grad));
    if (name == "--cp") same = knobs.cp == layout.cp, says = fmt::format("cp{}", layout.cp);
    if (name == "--ep") same = knobs.ep == layout.ep, says = fmt::format("ep{}", layout.ep);
    if (name == "--etp") same = knobs.etp == layout.etp, says = fmt::format("etp{}", layout.etp);
    if (name == "--ep-fold")
      same = knobs.ep_fold == layout.ep_fold, says = layout.ep_fold ? "epfold" : "no epfold";
    if (name == "--dispatch")
      same = knobs.dispatch == layout.dispatch, says = fmt::format("dispatch:{}", to_string(layout.dispatch));
    if (name == "--cp-comm") same = knobs.cp_comm == layout.cp_comm, says = fmt::format("cp:{}", to_string(layout.cp_comm));
    if (name == "--zero") same = knobs.zero == layout.zero, says = fmt::format("zero{}", layout.zero);
    if (name == "--fp8") {
      same = knobs.fp8 == layout.fp8 && knobs.fp8_bf16_layers == layout.fp8_bf16_layers;
      says = layout.fp8 == Fp8Recipe::off ? std::string("no FP8") : gemm_precision_text(layout);
    }
    if (!same)
      throw InputError(fmt::format("{} {} and {} disagree (the layout says {}); give the knob in one place", name,
                                   o->as<std::string>(), what, says));
  }
}

}  // namespace weft::cli
