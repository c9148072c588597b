// rmsnorm on the CPU.
//
// Fused forward: one parallel pass over rows (optional residual add, sum of
// squares, scale by rstd and by w). Fused backward: with g = dy * w and
// x_hat = x * rstd,
//   dx = rstd * (g - x_hat * mean(g * x_hat))
// per row, then dweight += sum over rows of dy * x_hat in a second pass over
// column blocks, so each weight's sum runs over rows in a fixed order.
//
// Unfused: the same math as separate ops with materialised intermediates
// (rstd; x_hat; y; then dweight; g; mean(g * x_hat); dx), the shape an eager
// framework gives it and the memory the layout's norm:unfused knob pays for.
//
// Rounding follows Hugging Face: x * rstd is rounded to the element type
// before the multiplication by w.
#include "kernels/rmsnorm/rmsnorm.h"

#include <cmath>

#include "kernels/cpu_common.h"
#include "kernels/rmsnorm/rmsnorm_check.h"

namespace weft::kernels {
namespace {

template <typename A, typename X>
A sum_squares(const X* x, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += A(x[c]) * A(x[c]);
  return s;
}

template <typename Elem>
void store(Elem* dst, Acc<Elem> value, Write write) {
  *dst = write == Write::accumulate ? Elem(Acc<Elem>(*dst) + value) : Elem(value);
}

// dweight[c] += sum_r dy[r, c] * x_hat(r, c), parallel over column blocks.
template <typename Elem, typename G, typename XHat>
void dweight_accumulate(int64_t rows, int64_t C, const Elem* dy, XHat x_hat, G* dweight) {
  using A = Acc<Elem>;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(rows * C))
  for (int64_t c0 = 0; c0 < C; c0 += cpu::kColumnBlock) {
    const int64_t c1 = std::min(C, c0 + cpu::kColumnBlock);
    A acc[cpu::kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += A(dy[r * C + c]) * x_hat(r, c);
    for (int64_t c = c0; c < c1; ++c) dweight[c] += acc[c - c0];
  }
}

template <typename Elem>
void fused_forward(const RmsnormForwardParams<Elem>& p) {
  using A = Acc<Elem>;
  const int64_t C = p.C;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r) {
    const Elem* x = p.x + r * C;
    if (p.residual) {
      Elem* sum = p.sum + r * C;
      const Elem* res = p.residual + r * C;
      for (int64_t c = 0; c < C; ++c) sum[c] = x[c] + res[c];
      x = sum;
    }
    const A rs = A(1) / std::sqrt(sum_squares<A>(x, C) / A(C) + A(p.eps));
    Elem* y = p.y + r * C;
    for (int64_t c = 0; c < C; ++c) y[c] = Elem(A(p.weight[c]) * A(Elem(A(x[c]) * rs)));
    p.rstd[r] = rs;
  }
}

template <typename Elem, typename G>
void fused_backward(const RmsnormBackwardParams<Elem, G>& p) {
  using A = Acc<Elem>;
  const int64_t C = p.C;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r) {
    const Elem* x = p.x + r * C;
    const Elem* dy = p.dy + r * C;
    const A rs = p.rstd[r];
    A g_dot_x = 0;
#pragma omp simd reduction(+ : g_dot_x)
    for (int64_t c = 0; c < C; ++c) g_dot_x += A(dy[c]) * A(p.weight[c]) * A(x[c]);
    // mean(g * x_hat) * rstd, folded into one coefficient on x.
    const A coeff = g_dot_x * rs * rs * rs / A(C);
    Elem* dx = p.dx + r * C;
    for (int64_t c = 0; c < C; ++c)
      store(dx + c, rs * A(dy[c]) * A(p.weight[c]) - coeff * A(x[c]), p.dx_write);
  }
  if (p.dweight)
    dweight_accumulate(p.rows, C, p.dy,
                       [&](int64_t r, int64_t c) { return A(p.x[r * C + c]) * A(p.rstd[r]); },
                       p.dweight);
}

template <typename Elem>
void unfused_forward(const RmsnormUnfusedForwardParams<Elem>& p) {
  using A = Acc<Elem>;
  const int64_t C = p.C;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r)
    p.rstd[r] = A(1) / std::sqrt(sum_squares<A>(p.x + r * C, C) / A(C) + A(p.eps));
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < C; ++c) p.x_hat[r * C + c] = A(p.x[r * C + c]) * p.rstd[r];
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < C; ++c)
      p.y[r * C + c] = Elem(A(p.weight[c]) * A(Elem(p.x_hat[r * C + c])));
}

template <typename Elem, typename G>
void unfused_backward(const RmsnormUnfusedBackwardParams<Elem, G>& p, Acc<Elem>* g,
                      Acc<Elem>* g_dot_xhat) {
  using A = Acc<Elem>;
  const int64_t C = p.C;
  if (p.dweight)
    dweight_accumulate(p.rows, C, p.dy, [&](int64_t r, int64_t c) { return p.x_hat[r * C + c]; },
                       p.dweight);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < C; ++c) g[r * C + c] = A(p.dy[r * C + c]) * A(p.weight[c]);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r) {
    A s = 0;
    for (int64_t c = 0; c < C; ++c) s += g[r * C + c] * p.x_hat[r * C + c];
    g_dot_xhat[r] = s / A(C);
  }
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * C))
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < C; ++c)
      store(p.dx + r * C + c, p.rstd[r] * (g[r * C + c] - p.x_hat[r * C + c] * g_dot_xhat[r]),
            p.dx_write);
}

}  // namespace

template <typename Elem>
bool supports(const RmsnormForwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const RmsnormForwardParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const RmsnormForwardParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  fused_forward(p);
  return Status::ok;
}

template <typename Elem, typename G>
bool supports(const RmsnormBackwardParams<Elem, G>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem, typename G>
int64_t workspace_bytes(const RmsnormBackwardParams<Elem, G>&, Backend) {
  return 0;
}
template <typename Elem, typename G>
Status launch(const RmsnormBackwardParams<Elem, G>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  fused_backward(p);
  return Status::ok;
}

template <typename Elem>
bool supports(const RmsnormUnfusedForwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const RmsnormUnfusedForwardParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const RmsnormUnfusedForwardParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  unfused_forward(p);
  return Status::ok;
}

template <typename Elem, typename G>
bool supports(const RmsnormUnfusedBackwardParams<Elem, G>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem, typename G>
int64_t workspace_bytes(const RmsnormUnfusedBackwardParams<Elem, G>& p, Backend) {
  if (params_check(p) != Status::ok) return 0;
  return cpu::piece_bytes<Acc<Elem>>(p.rows * p.C) + cpu::piece_bytes<Acc<Elem>>(p.rows);
}
template <typename Elem, typename G>
Status launch(const RmsnormUnfusedBackwardParams<Elem, G>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), workspace_bytes(p), ws, stream); s != Status::ok)
    return s;
  cpu::WorkspaceCarver carve(ws);
  Acc<Elem>* g = carve.take<Acc<Elem>>(p.rows * p.C);
  Acc<Elem>* g_dot_xhat = carve.take<Acc<Elem>>(p.rows);
  unfused_backward(p, g, g_dot_xhat);
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(RmsnormForwardParams)
WEFT_CPU_INSTANTIATE(RmsnormBackwardParams)
WEFT_CPU_INSTANTIATE(RmsnormUnfusedForwardParams)
WEFT_CPU_INSTANTIATE(RmsnormUnfusedBackwardParams)

}  // namespace weft::kernels
