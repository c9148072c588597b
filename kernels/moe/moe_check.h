// The moe params' rules (Status::invalid_argument), defined once for every
// backend. Free of CUDA and fmt, so nvcc compiles it too.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu_common.h"
#include "kernels/moe/moe.h"

namespace weft::kernels {

// Expert ids are int32; k of E, and a scale that keeps weights finite and
// of one sign.
inline bool router_valid(const RouterConfig& r) {
  return r.experts >= 1 && r.experts <= (int64_t{1} << 31) - 1 && r.top_k >= 1 && r.top_k <= r.experts &&
         std::isfinite(r.scale) && r.scale > 0;
}

// rows * k * C stays inside int64.
inline bool moe_sizes_valid(int64_t rows, int64_t C, int64_t top_k) {
  return rows >= 0 && C >= 1 && C <= (int64_t{1} << 22) && top_k >= 1 && top_k <= (int64_t{1} << 31) &&
         rows <= (int64_t{1} << 40) / top_k;
}

template <typename Elem>
Status params_check(const MoeRouteParams<Elem>& p) {
  const int64_t E = p.router.experts;
  return cpu::status_of(router_valid(p.router) && p.rows >= 0 && p.rows <= (int64_t{1} << 40) / E &&
                        cpu::present(p.logits, p.rows * E) && cpu::present(p.scores, p.rows * E) &&
                        cpu::present(p.experts, p.rows * p.router.top_k) &&
                        cpu::present(p.weights, p.rows * p.router.top_k) && p.counts != nullptr);
}

template <typename Elem>
Status params_check(const MoeRouteBackwardParams<Elem>& p) {
  const int64_t E = p.router.experts;
  return cpu::status_of(router_valid(p.router) && p.rows >= 0 && p.rows <= (int64_t{1} << 40) / E &&
                        cpu::present(p.scores, p.rows * E) && cpu::present(p.experts, p.rows * p.router.top_k) &&
                        cpu::present(p.dweights, p.rows * p.router.top_k) && cpu::present(p.dlogits, p.rows * E));
}

template <typename Elem>
Status params_check(const MoePermuteParams<Elem>& p) {
  const bool gated = p.gate == GateOn::input;
  return cpu::status_of(moe_sizes_valid(p.rows, p.C, p.top_k) && p.experts >= 1 && p.top_k <= p.experts &&
                        p.experts <= (int64_t{1} << 31) - 1 && p.capacity >= 0 &&
                        cpu::present(p.expert_of, p.rows * p.top_k) &&
                        (!gated || cpu::present(p.weights, p.rows * p.top_k)) && cpu::present(p.x, p.rows * p.C) &&
                        cpu::present(p.out, p.rows * p.top_k * p.C) && p.offsets != nullptr &&
                        cpu::present(p.position, p.rows * p.top_k) &&
                        (!p.row_weights || (!gated && cpu::present(p.weights, p.rows * p.top_k))));
}

template <typename Elem>
Status params_check(const MoePermuteBackwardParams<Elem>& p) {
  const bool gated = p.gate == GateOn::input;
  const int64_t n = p.rows * p.top_k;
  return cpu::status_of(moe_sizes_valid(p.rows, p.C, p.top_k) && cpu::present(p.position, n) &&
                        cpu::present(p.dout, n * p.C) && cpu::present(p.dx, p.rows * p.C) &&
                        (!gated || (cpu::present(p.weights, n) && cpu::present(p.x, p.rows * p.C) &&
                                    cpu::present(p.dweights, n))) &&
                        (!p.row_dweights || (!gated && cpu::present(p.dweights, n))));
}

template <typename Elem>
Status params_check(const MoeUnpermuteParams<Elem>& p) {
  const int64_t n = p.rows * p.top_k;
  return cpu::status_of(moe_sizes_valid(p.rows, p.C, p.top_k) && cpu::present(p.position, n) &&
                        (p.gate == GateOn::input || cpu::present(p.weights, n)) && cpu::present(p.y, n * p.C) &&
                        cpu::present(p.out, p.rows * p.C));
}

template <typename Elem>
Status params_check(const MoeUnpermuteBackwardParams<Elem>& p) {
  const bool gated_out = p.gate == GateOn::output;
  const int64_t n = p.rows * p.top_k;
  return cpu::status_of(moe_sizes_valid(p.rows, p.C, p.top_k) && cpu::present(p.position, n) &&
                        cpu::present(p.dout, p.rows * p.C) && cpu::present(p.dy, n * p.C) &&
                        (!gated_out || (cpu::present(p.weights, n) && cpu::present(p.y, n * p.C) &&
                                        cpu::present(p.dweights, n))));
}

}  // namespace weft::kernels
