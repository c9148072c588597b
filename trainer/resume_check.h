// What a resumed run keeps from its checkpoint, and what it may change.
//
// A resume continues one run, so every setting that shapes the training
// comes from the checkpoint: the model, seq and global batch must match; the
// optimizer (lr and its schedule, betas, eps, weight decay, clipping) and
// the seed (the data order) and an MoE model's balancing loss (coefficient
// and scope) and capacity factor are the run's when the command does not
// state them, and a stated value that differs is refused unless --change names it;
// the steps (where the schedule ends; the run's when not stated), the layout
// (weights reshard on load) and the precision (a GPU run resumed on the CPU)
// may change. Every change is said on the terminal and recorded in the run
// header of metrics.jsonl.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/checkpoint/manifest.h"
#include "trainer/loop.h"

namespace weft::trainer {

struct RunChange {
  std::string field;  // the flag's name without dashes: "lr", "warmup", "steps", "layout", ...
  nlohmann::json from, to;
  bool needs_consent = false;  // only with --change naming it
};

// The settings --change may name.
const std::vector<std::string>& changeable_settings();

// The settings a resume takes from its checkpoint when the command does not
// state them: changeable_settings() and "steps".
const std::vector<std::string>& resumable_settings();

// Sets each of resumable_settings() that `stated` does not list (the flags
// the command gave, without dashes) to the value the run in checkpoint `dir`
// was trained with, before the run is built. Returns those that differed
// from `c`'s (the command's defaults), as changes from the default to the
// run's value, for the terminal. FileFormatError as resume_changes.
std::vector<RunChange> resume_adopt(TrainConfig& c, const std::string& dir, const std::vector<std::string>& stated);

// Each setting of `c` that differs from what the checkpoint was trained with
// (its manifest's run.optim, or for checkpoints without it the optimizer
// record), in a fixed order. FileFormatError naming `dir` and the field for
// a manifest whose optimizer settings are of the wrong type or out of range;
// InputError for seq or global batch that differ (they never may). `data`:
// the training data this run reads (TokenData::path), set against the one the
// checkpoint recorded; another needs consent (--change data). Empty: not
// compared.
std::vector<RunChange> resume_changes(const checkpoint::Manifest& m, const TrainConfig& c, const std::string& dir,
                                      const std::string& data = {});

// InputError naming every change that needs consent and --change (`allowed`)
// does not list, with both values and the --change that would allow them.
void resume_changes_check(const std::vector<RunChange>& changes, const std::vector<std::string>& allowed,
                          const std::string& dir);

// "--lr 0.001 -> 0.00075; --steps 4 -> 6" for the terminal.
std::string resume_changes_text(const std::vector<RunChange>& changes);
// [{"field": "lr", "from": 0.001, "to": 0.00075}, ...] for the run header.
nlohmann::json resume_changes_json(const std::vector<RunChange>& changes);

}  // namespace weft::trainer
