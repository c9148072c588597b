// The findings of the public large-scale layout studies of Llama 13B/30B/65B
// on 64-256 A100-80GB GPUs, checked against this cost and memory model:
// which of them the model reproduces for a scenario, with the evidence.
#pragma once

#include <string>
#include <vector>

#include "tuner/space.h"

namespace weft::calibration {

struct Scenario {
  std::string model;
  int64_t gpus;
  int64_t seq;
  int64_t global_batch;
};

struct Finding {
  std::string claim;
  bool reproduced = false;
  std::string evidence;
};

// The scenarios of the studies: 2k and 8k sequences, ~4M tokens per step.
std::vector<Scenario> study_scenarios();

// Evaluates the full space of the scenario on a100-80gb and checks each claim:
// micro-batch 1 wins; no checkpointing when memory allows; at equal tp*pp more
// pp and less tp wins; sequence parallelism matters (>1% faster) at 30B from
// 8k tokens and at 65B, where the study's sp sweeps measured a gain, and not
// at 13B nor at 30B with 2k; flash attention with a fused norm wins.
std::vector<Finding> check_findings(const Scenario& s);

}  // namespace weft::calibration
