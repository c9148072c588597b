// FLOP accounting and MFU, exactly as the design states:
//   model FLOPs per token = 6 N + 12 L C T
// with N = ModelSpec::flop_params() (every matmul weight: the blocks, the final
// norm and the LM head, but not the input-embedding lookup) and T the sequence
// length (the attention score and value matmuls, counted without the causal
// halving). Recomputation is not counted.
#pragma once

#include <cstdint>

#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft {

double model_flops_per_token(const ModelSpec& m, int64_t seq);
double model_flops_per_step(const ModelSpec& m, const RunSpec& run);
// MFU = model FLOPs per second / (devices x dense peak per device).
double mfu(double model_flops_per_second, int64_t devices, double peak_flops_per_device);

}  // namespace weft
