#include "core/flops.h"

namespace weft {

double model_flops_per_token(const ModelSpec& m, int64_t seq) {
  return 6.0 * double(m.flop_params()) + 12.0 * double(m.layers) * double(m.hidden) * double(seq);
}

double model_flops_per_step(const ModelSpec& m, const RunSpec& run) {
  return model_flops_per_token(m, run.seq) * double(run.tokens_per_step());
}

double mfu(double model_flops_per_second, int64_t devices, double peak_flops_per_device) {
  return model_flops_per_second / (double(devices) * peak_flops_per_device);
}

}  // namespace weft
