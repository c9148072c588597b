// What the single-rank stage tests share: a batch of random token and
// target ids, and a stage on the CPU started from a seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "trainer/model/llama.h"

namespace weft::trainer::test_stage {

inline DeviceSpec cpu() { return device_preset("cpu"); }

struct Batch {
  std::vector<int32_t> tokens, targets;
};

// `rows` ids of each, uniform in [0, V), from `seed`.
inline Batch random_batch(int64_t rows, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  for (int64_t i = 0; i < rows; ++i) {
    b.tokens.push_back(int32_t(rng() % uint64_t(V)));
    b.targets.push_back(int32_t(rng() % uint64_t(V)));
  }
  return b;
}

// One rank's stage 0 of a layout, its weights from `seed`, its arena and
// process groups its own.
template <typename Elem>
struct Stage {
  memory::Arena arena;
  parallel::ProcessGroups groups = parallel::single_process_groups();
  LlamaStage<Elem> stage;
  Stage(const ModelSpec& m, const RunSpec& run, const Layout& l, uint64_t seed)
      : stage(m, run, l, 0, cpu(), arena, groups) {
    stage.init_weights(seed);
  }
  // Weights larger than the 0.02 init, so that every path matters to a
  // finite-difference check: N(0, 0.3) added to each; the generator goes on
  // to the check's own draws.
  std::mt19937_64 spread_weights(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd(0.0, 0.3);
    for (int64_t i = 0; i < stage.param_elements(); ++i) stage.weights()[i] += Elem(nd(rng));
    return rng;
  }
};

}  // namespace weft::trainer::test_stage
