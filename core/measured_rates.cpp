#include "core/measured_rates.h"

#include <cmath>
#include <limits>

namespace weft {

namespace {

double log_distance(double a, double b) { return std::abs(std::log(a / b)); }

}  // namespace

std::optional<double> MeasuredRates::gemm_seconds(double m, double n, double k) const {
  const GemmRate* best = nullptr;
  double d_best = std::numeric_limits<double>::infinity();
  for (const auto& g : gemm) {
    const double d = log_distance(m, double(g.m)) + log_distance(n, double(g.n)) + log_distance(k, double(g.k));
    if (d < d_best) {
      d_best = d;
      best = &g;
    }
  }
  if (!best) return std::nullopt;
  return best->seconds * (m * n * k) / (double(best->m) * double(best->n) * double(best->k));
}

std::optional<double> MeasuredRates::stream_seconds(const std::string& family, double bytes) const {
  const auto it = streams.find(family);
  if (it == streams.end()) return std::nullopt;
  return it->second.launch_s + bytes / it->second.bytes_per_s;
}

std::optional<double> MeasuredRates::attention_seconds(const std::string& kind, bool backward, double b,
                                                       double h, double h_kv, double t, double d) const {
  const AttentionRate* best = nullptr;
  double d_best = std::numeric_limits<double>::infinity();
  for (const auto& a : attention) {
    if (a.kind != kind) continue;
    const double dist = log_distance(b, double(a.b)) + log_distance(h, double(a.h)) +
                        log_distance(h_kv, double(a.h_kv)) + 2 * log_distance(t, double(a.t)) +
                        log_distance(d, double(a.d));
    if (dist < d_best) {
      d_best = dist;
      best = &a;
    }
  }
  if (!best) return std::nullopt;
  const double scale = (b * h * t * t * d) / (double(best->b) * double(best->h) * double(best->t) *
                                              double(best->t) * double(best->d));
  return (backward ? best->bwd_s : best->fwd_s) * scale;
}

std::optional<double> MeasuredRates::comm_seconds(const std::string& op, int64_t ranks, double bytes) const {
  if (ranks <= 1) return 0.0;
  for (const auto& c : comm)
    if (c.op == op && c.ranks == ranks) return c.latency_s + bytes / c.bytes_per_s;
  return std::nullopt;
}

}  // namespace weft
