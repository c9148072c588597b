// `weft train --auto`: choose the layout before training, by reusing a cached
// recipe that matches this run or by tuning with real steps on every rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/layout.h"
#include "trainer/loop.h"
#include "tuner/space.h"
#include "tuner/tune.h"

namespace weft::parallel {
class Comm;
}

namespace weft::cli {

struct AutoArgs {
  bool enabled = false;  // --auto given
  bool retune = false;
  int64_t top = 0;  // 0: the tuner's default
  std::string budget;     // "10m"; empty: none
  bool all = false;       // profile every candidate (brute force)
  int64_t trial_warmup = 1;
  int64_t trial_steps = 3;
  double trial_min_time = 0.5;  // seconds of timed steps at least
  double trial_timeout = 60;  // seconds without communication progress in a trial
  std::string profile;        // a measured device profile (weft calibrate); empty: the device's defaults
  std::string tensorboard;    // where rank 0 writes the trials' event file; empty: none
  // MoE models without a stated --moe-imbalance: size the expert-parallel
  // receive buffers from the trials' routing (tuner::TuneOptions::size_buffers).
  bool size_moe_buffers = false;
};

// What --auto chose: the layout, and for an MoE model the receive buffers'
// imbalance factor the tuning measured or the cached recipe kept (0: the
// run's own).
struct AutoChoice {
  Layout layout;
  double moe_imbalance = 0;
};

// Every rank calls this together; all return the same choice. `base` holds the
// model, run, device, optimizer, seed, data and threads of the run; rank 0
// prints progress to `log` and writes the recipe, the report (markdown and
// JSON) and the journal under base.out_dir, and the recipe into the cache.
// nullopt when a stop signal ended the tuning: then only its report and
// journal are written, and a re-run of the command continues it.
std::optional<AutoChoice> auto_layout(const trainer::TrainConfig& base, const tuner::SpaceLimits& limits,
                                      const AutoArgs& a, int64_t world, bool multi_rank, std::FILE* log);

// The machine the measurements run on: CPU model and cores.
std::string machine_description();

}  // namespace weft::cli
