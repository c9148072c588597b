// RopeScaling: how a model rescales RoPE's per-pair inverse frequencies to
// reach past the context it was first trained on. weft computes plain RoPE
// and Llama 3's scheme (Hugging Face rope_type "llama3": Llama 3.1 and 3.2).
//
// Llama 3's rule, for pair i of a head (i < D/2) with unscaled inverse
// frequency f = theta^(-2i / D), wavelength w = 2 pi / f, and L0 the original
// context (original_max_position_embeddings):
//   w < L0 / high_freq_factor   f            high frequencies are kept
//   w > L0 / low_freq_factor    f / factor   low frequencies are slowed
//   otherwise                   (1 - s) f / factor + s f,
//                               s = (L0 / w - low_freq_factor) / (high_freq_factor - low_freq_factor)
// s is 1 and 0 at the two edges, so the rule is continuous. Only the
// frequencies change: llama3 scales neither cos nor sin.
//
// Free of fmt and of the JSON library: the rope kernels (nvcc too) include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

enum class RopeScalingType { none, llama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;  // L0, Hugging Face original_max_position_embeddings

  constexpr bool enabled() const { return type != RopeScalingType::none; }
  bool operator==(const RopeScaling&) const = default;
};

// Llama 3's scaling with these values (not validated: rope_scaling_validate).
RopeScaling rope_scaling_llama3(double factor, double low_freq_factor, double high_freq_factor,
                                int64_t original_max_position);

// The inverse frequency of a pair whose unscaled one is inv_freq, by the rule
// above, in double. constexpr so that CUDA device code calls it as well
// (kernels are built with --expt-relaxed-constexpr).
constexpr double rope_scaled_inv_freq(double inv_freq, const RopeScaling& s) {
  if (s.type != RopeScalingType::llama3) return inv_freq;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double wavelength = kTwoPi / inv_freq;
  const double L0 = double(s.original_max_position);
  if (wavelength < L0 / s.high_freq_factor) return inv_freq;
  if (wavelength > L0 / s.low_freq_factor) return inv_freq / s.factor;
  const double smooth = (L0 / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

// The D/2 inverse frequencies of a head, theta^(-2i / D) scaled, in double.
std::vector<double> rope_inv_freq(int64_t D, double theta, const RopeScaling& s);

// Each value that is out of range, as "<field>.<key>=<value> must ...";
// empty when valid (always for type none).
std::vector<std::string> rope_scaling_problems(const RopeScaling& s,
                                               const std::string& field = "rope_scaling");

// "llama3" or "default" (Hugging Face's rope_type names).
const char* rope_scaling_type_name(RopeScalingType t);

// A short form for summaries, e.g. "rope llama3 x8 (1-4, 8192)"; empty for none.
std::string rope_scaling_summary(const RopeScaling& s);

}  // namespace weft
