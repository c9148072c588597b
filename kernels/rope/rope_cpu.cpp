// rope on the CPU: build the (T, D/2) cos/sin table once in the workspace,
// then rotate every (row, head) pair of halves in place, q and k in one pass.
//
// The table follows Hugging Face's fp32 arithmetic (in Acc): inv_freq =
// 1 / theta^(2i / D), angle = position * inv_freq, then cos and sin, so fp32
// results match transformers to rounding. A scaled model's inv_freq is that
// value through rope_scaled_inv_freq in double, rounded once (transformers
// applies the same rule in fp32: within an ulp of it). The backward uses the
// same table with sin negated, which is exactly the transposed rotation.
#include "kernels/rope/rope.h"

#include <cmath>

#include "kernels/cpu_common.h"
#include "kernels/rope/rope_check.h"

namespace weft::kernels {
namespace {

template <typename Elem>
void rotate_heads(Elem* x, int64_t heads, int64_t D, const Acc<Elem>* cos_t,
                  const Acc<Elem>* sin_t) {
  using A = Acc<Elem>;
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    Elem* lo = x + h * D;
    Elem* hi = lo + half;
    for (int64_t i = 0; i < half; ++i) {
      const A a = A(lo[i]), b = A(hi[i]);
      lo[i] = Elem(a * cos_t[i] - b * sin_t[i]);
      hi[i] = Elem(b * cos_t[i] + a * sin_t[i]);
    }
  }
}

}  // namespace

template <typename Elem>
bool supports(const RopeParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const RopeParams<Elem>& p, Backend) {
  if (params_check(p) != Status::ok) return 0;
  return 2 * cpu::piece_bytes<Acc<Elem>>(p.T * (p.D / 2));
}

template <typename Elem>
Status launch(const RopeParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), workspace_bytes(p), ws, stream); s != Status::ok)
    return s;
  const int64_t half = p.D / 2;
  cpu::WorkspaceCarver carve(ws);
  A* cos_table = carve.take<A>(p.T * half);
  A* sin_table = carve.take<A>(p.T * half);
  const A sign = p.direction == RopeDirection::forward ? A(1) : A(-1);
// pow, cos and sin cost tens of multiply-adds each.
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.T * half * 32))
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      A inv_freq = A(1) / std::pow(A(p.theta), A(2 * i) / A(p.D));
      if (p.scaling.enabled()) inv_freq = A(rope_scaled_inv_freq(double(inv_freq), p.scaling));
      const A angle = A(p.position_offset + t) * inv_freq;
      cos_table[t * half + i] = std::cos(angle);
      sin_table[t * half + i] = sign * std::sin(angle);
    }
#pragma omp parallel for collapse(2) schedule(static) \
    if (cpu::worth_parallel(p.B * p.T * (p.H + p.H_kv) * p.D))
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t t = 0; t < p.T; ++t) {
      const int64_t row = b * p.T + t;
      rotate_heads(p.q + row * p.H * p.D, p.H, p.D, cos_table + t * half, sin_table + t * half);
      rotate_heads(p.k + row * p.H_kv * p.D, p.H_kv, p.D, cos_table + t * half,
                   sin_table + t * half);
    }
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(RopeParams)

}  // namespace weft::kernels
