// An MoE model's part of a training record (trainer/loop.cpp): the experts'
// loads, the dispatch and receive peaks and a capacity's drops since the
// last record, reduced over the ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trainer/loop.h"
#include "trainer/parallel/comm.h"

namespace weft::trainer {

struct MoeRecord {
  nlohmann::json expert_load;  // the record's "expert_load"
  std::string text;            // for the progress line: " | ep peak ..." and " | dropped ..."
};

// From this rank's windows since the last record (RunState's expert_load,
// (model layers) x E; expert_dropped, (model layers); dispatch_peaks, E + 1;
// received_peak), reduced over `world` (every rank calls it), which are then
// cleared for the next window. The tokens each expert of each MoE layer
// took (all k choices, the whole global batch: each stage's layers from its
// first tp and cp rank), with a capacity the choices each layer dropped, the
// most uneven dispatches at each ep degree and, under ep, the most rows an
// ep rank received over the balanced rows x k.
MoeRecord moe_record(const TrainConfig& c, parallel::Comm& world, std::vector<int64_t>& load,
                     std::vector<int64_t>& dropped, std::vector<double>& peaks, double& received_peak);

}  // namespace weft::trainer
