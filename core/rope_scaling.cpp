#include "core/rope_scaling.h"

#include <cmath>

#include <fmt/format.h>

namespace weft {

RopeScaling rope_scaling_llama3(double factor, double low_freq_factor, double high_freq_factor,
                                int64_t original_max_position) {
  return RopeScaling{.type = RopeScalingType::llama3,
                     .factor = factor,
                     .low_freq_factor = low_freq_factor,
                     .high_freq_factor = high_freq_factor,
                     .original_max_position = original_max_position};
}

std::vector<double> rope_inv_freq(int64_t D, double theta, const RopeScaling& s) {
  std::vector<double> out(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i)
    out[size_t(i)] = rope_scaled_inv_freq(std::pow(theta, -double(2 * i) / double(D)), s);
  return out;
}

std::vector<std::string> rope_scaling_problems(const RopeScaling& s, const std::string& field) {
  std::vector<std::string> bad;
  if (!s.enabled()) return bad;
  if (!std::isfinite(s.factor) || s.factor < 1)
    bad.push_back(fmt::format("{}.factor={} must be a finite number >= 1", field, s.factor));
  if (!std::isfinite(s.low_freq_factor) || s.low_freq_factor <= 0)
    bad.push_back(fmt::format("{}.low_freq_factor={} must be a finite number > 0", field,
                              s.low_freq_factor));
  if (!std::isfinite(s.high_freq_factor) || s.high_freq_factor <= 0)
    bad.push_back(fmt::format("{}.high_freq_factor={} must be a finite number > 0", field,
                              s.high_freq_factor));
  else if (std::isfinite(s.low_freq_factor) && !(s.low_freq_factor < s.high_freq_factor))
    bad.push_back(fmt::format("{}.low_freq_factor={} must be less than high_freq_factor={}", field,
                              s.low_freq_factor, s.high_freq_factor));
  if (s.original_max_position <= 0)
    bad.push_back(fmt::format("{}.original_max_position_embeddings={} must be positive", field,
                              s.original_max_position));
  return bad;
}

const char* rope_scaling_type_name(RopeScalingType t) {
  return t == RopeScalingType::llama3 ? "llama3" : "default";
}

std::string rope_scaling_summary(const RopeScaling& s) {
  if (!s.enabled()) return "";
  return fmt::format("rope {} x{} ({}-{}, {})", rope_scaling_type_name(s.type), s.factor,
                     s.low_freq_factor, s.high_freq_factor, s.original_max_position);
}

}  // namespace weft
