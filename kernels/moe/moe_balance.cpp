// The load-balancing loss from a micro-batch's routing statistics (moe.h).
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/moe/moe.h"

namespace weft::kernels {

double moe_balance_loss(AuxLossScope scope, double coef, int64_t layers, int64_t experts, int64_t top_k,
                        int64_t tokens, const int64_t* counts, const double* score_sums, double* dscore) {
  if (layers < 1 || experts < 1 || top_k < 1 || top_k > experts || tokens < 1)
    throw InputError(fmt::format("moe_balance_loss: layers={} experts={} top_k={} tokens={}; each must be at "
                                 "least 1 and top_k at most experts",
                                 layers, experts, top_k, tokens));
  if (!(coef >= 0 && std::isfinite(coef)))
    throw InputError(fmt::format("moe_balance_loss: coefficient {} must be finite and at least 0", coef));
  for (int64_t l = 0; l < layers; ++l) {
    int64_t routed = 0;
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t c = counts[l * experts + e];
      const double s = score_sums[l * experts + e];
      if (c < 0 || !(s >= 0 && std::isfinite(s)))
        throw InputError(fmt::format("moe_balance_loss: layer {} expert {}: count {} and score sum {} must be "
                                     "at least 0 and finite",
                                     l, e, c, s));
      routed += c;
    }
    if (routed != tokens * top_k)
      throw InputError(fmt::format("moe_balance_loss: layer {}'s counts sum to {}, not tokens x top_k = {} x {}", l,
                                   routed, tokens, top_k));
  }
  const double E = double(experts), T = double(tokens), k = double(top_k);
  double loss = 0;
  if (scope == AuxLossScope::global) {
    const double R = T * double(layers);
    std::vector<double> c(size_t(experts), 0), S(size_t(experts), 0);
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t e = 0; e < experts; ++e) {
        c[size_t(e)] += double(counts[l * experts + e]);
        S[size_t(e)] += score_sums[l * experts + e];
      }
    for (int64_t e = 0; e < experts; ++e) loss += c[size_t(e)] / R * (S[size_t(e)] / R);
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t e = 0; e < experts; ++e) dscore[l * experts + e] = coef * E * c[size_t(e)] / (R * R);
  } else {
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t e = 0; e < experts; ++e) {
        const double c = double(counts[l * experts + e]);
        loss += c / (T * k) * (score_sums[l * experts + e] / T);
        dscore[l * experts + e] = coef * E * c / (T * T * k);
      }
  }
  return coef * E * loss;
}

}  // namespace weft::kernels
