// `weft train`'s arguments, and the helpers its command runs beside the
// trainer: the --init model, the end-of-run summary, the agreement of the
// knobs with a given layout, and mpirun's stop note (train_support.cpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/auto_tune.h"
#include "cli/options.h"
#include "trainer/loop.h"

namespace weft::cli {

struct TrainArgs {
  ModelArgs model{.model = "tiny"};
  int64_t seq = 256;
  int64_t global_batch = 16;
  int64_t mb = 4;
  std::string ckpt = "none";
  std::string attention = "flash";
  std::string norm = "fused";
  std::string grad = "fp32";
  int64_t cp = 1;
  int64_t ep = 1;  // --ep: expert-parallel degree (MoE models)
  std::string dispatch = "a2a";  // --dispatch: how ep moves the routed rows
  int64_t etp = 1;                // --etp: the expert tp degree
  bool ep_fold = false;           // --ep-fold: the ep group folded over the tp ranks
  std::string cp_comm = "ring";
  std::string fp8 = "off";
  int64_t zero = 0;
  LoraArgs lora;
  // --device's default: $WEFT_DEVICE when set (scripts and test suites pin
  // the CPU this way on machines with a GPU), else auto.
  std::string device = std::getenv("WEFT_DEVICE") ? std::getenv("WEFT_DEVICE") : "auto";
  std::string precision = "auto";
  std::string memory_limit;
  std::string tensorboard;  // --tensorboard's folder; empty with the flag: <out>/tensorboard
  CLI::Option* tensorboard_opt = nullptr;
  trainer::TrainConfig cfg;
  std::string schedule = "cosine";
  std::string layout;
  std::string recipe;
  bool force_recipe = false;
  bool overwrite = false;
  double comm_timeout = 300;
  std::string comm = "auto";  // --comm: what carries a multi-rank GPU run's tensors
  AutoArgs tune;
  // The layout knobs: given without --auto they choose the layout by hand;
  // with --auto they restrict the tuner's space.
  std::vector<CLI::Option*> knobs;
  CLI::Option* tune_top = nullptr;
  CLI::Option* model_option = nullptr;
  // The settings a resume takes from its checkpoint unless stated
  // (trainer::resumable_settings), by name without dashes.
  std::vector<std::pair<std::string, CLI::Option*>> resumable;
};

// The note on mpirun's stop grace: empty when it leaves the ranks 10 s or
// more, or outside Open MPI.
std::string mpirun_stop_note();
// The model of a run with --init (or of its checkpoint on a resume).
ModelSpec init_model(const TrainArgs& a, const trainer::TrainConfig& c);
// The end-of-run summary, to stdout.
void print_summary(const trainer::TrainConfig& c, const trainer::TrainReport& r);
// InputError where a knob given beside --layout or --recipe (`what`)
// disagrees with the layout.
void knobs_agree(const TrainArgs& a, const Layout& knobs, const Layout& layout, const std::string& what);

}  // namespace weft::cli
