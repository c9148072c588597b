#include "core/measured_rates.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace weft {

const std::vector<std::string>& stream_families() {
  static const std::vector<std::string> f = {
      "rmsnorm_fwd", "rmsnorm_bwd",   "rmsnorm_unfused_fwd", "rmsnorm_unfused_bwd", "rope",          "residual",
      "swiglu_fwd",  "swiglu_bwd",    "embedding_fwd",       "embedding_bwd",       "cross_entropy", "adamw"};
  return f;
}

StreamWork stream_work(std::string_view family, double rows, double width, double a) {
  const double n = rows * width;
  // RMSNorm fused reads x and writes y (backward: reads x and dy, writes dx);
  // the unfused composition upcasts, reduces, normalises and scales in
  // separate passes over fp32 intermediates, and its backward is two of those.
  const double upcast = a == 4 ? 0 : a + 4;
  if (family == "rmsnorm_fwd") return {2 * a * n, 1};
  if (family == "rmsnorm_bwd") return {3 * a * n, 1};
  if (family == "rmsnorm_unfused_fwd") return {(upcast + 16 + a) * n, a == 4 ? 3 : 4};
  if (family == "rmsnorm_unfused_bwd") return {2 * (upcast + 16 + a) * n, a == 4 ? 6 : 8};
  // RoPE rotates q and k in place (width: (H + H_kv) D); the residual add
  // reads two and writes one; SwiGLU reads gate and up and writes the
  // product (backward: reads three, writes two).
  if (family == "rope") return {2 * a * n, 1};
  if (family == "residual") return {3 * a * n, 1};
  if (family == "swiglu_fwd") return {3 * a * n, 1};
  if (family == "swiglu_bwd") return {5 * a * n, 1};
  // The embedding gathers rows (backward: scatter-adds them into fp32).
  if (family == "embedding_fwd") return {2 * a * n, 1};
  if (family == "embedding_bwd") return {8 * n, 1};
  // The vocab-parallel loss reads the logits in fp32 four times in three passes.
  if (family == "cross_entropy") return {16 * n, 3};
  // An MoE layer's routing (rows x E: reads the logits, writes fp32 scores;
  // backward: reads the scores, writes the logits' gradient) and token
  // movement (rows x C of the routed choices: permute reads each token's row
  // and writes it once per choice after a counting pass; unpermute reads the
  // choices and writes the combined rows; their backwards the same).
  if (family == "moe_route" || family == "moe_route_bwd") return {(a + 4) * n, 1};
  if (family == "moe_permute") return {2 * a * n, 2};
  if (family == "moe_unpermute") return {2 * a * n, 1};
  // AdamW streams master, m, v (read and write), the gradient (read for the
  // norm, the update and the zeroing) and writes the compute copy.
  if (family == "adamw") return {rows * (24 + 3 * width + a), 4};
  throw InternalError("unknown stream family '" + std::string(family) + "'");
}

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
