// swiglu on the CPU: one elementwise pass each way, in Acc.
//
// Forward fuses silu and the product (no silu(gate) tensor is kept); the
// backward recomputes sigmoid(gate) instead of saving it:
//   dup   = dact * silu(g)
//   dgate = dact * up * s * (1 + g * (1 - s)),  s = sigmoid(g)
// sigmoid is 1 / (1 + exp(-g)), from exp(-|g|) so that it saturates cleanly
// to 0 or 1 for large |g|; in fp32 it is cpu::sigmoid_fast, whose loops vectorize.
// With a row scale w (swiglu.h) the backward's dact is the scaled
// activation's gradient: dw = sum_f dact * silu(g) * up over the row, in
// order, and the two above take w * dact.
#include "kernels/swiglu/swiglu.h"

#include "kernels/cpu_common.h"
#include "kernels/cpu_math.h"
#include "kernels/swiglu/swiglu_check.h"

namespace weft::kernels {

using cpu::sigmoid;

template <typename Elem>
bool supports(const SwigluForwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const SwigluForwardParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const SwigluForwardParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t n = p.rows * p.F;
  if (p.row_scale) {
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t i = r * p.F; i < (r + 1) * p.F; ++i) {
        const A g = A(p.gate[i]);
        p.act[i] = Elem(p.row_scale[r] * (g * sigmoid(g) * A(p.up[i])));
      }
    return Status::ok;
  }
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const A g = A(p.gate[i]);
    p.act[i] = Elem(g * sigmoid(g) * A(p.up[i]));
  }
  return Status::ok;
}

template <typename Elem>
bool supports(const SwigluBackwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const SwigluBackwardParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const SwigluBackwardParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t n = p.rows * p.F;
  if (p.row_scale) {  // a row at a time: its dw sums in order
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
    for (int64_t r = 0; r < p.rows; ++r) {
      const A w = p.row_scale[r];
      A dw = 0;
      for (int64_t i = r * p.F; i < (r + 1) * p.F; ++i) {
        const A g = A(p.gate[i]), u = A(p.up[i]), da = A(p.dact[i]);
        const A s = sigmoid(g);
        dw += da * (g * s * u);
        p.dup[i] = Elem(w * da * g * s);
        p.dgate[i] = Elem(w * da * u * s * (A(1) + g * (A(1) - s)));
      }
      if (p.drow_scale) p.drow_scale[r] = dw;
    }
    return Status::ok;
  }
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const A g = A(p.gate[i]), u = A(p.up[i]), da = A(p.dact[i]);
    const A s = sigmoid(g);
    p.dup[i] = Elem(da * g * s);
    p.dgate[i] = Elem(da * u * s * (A(1) + g * (A(1) - s)));
  }
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(SwigluForwardParams)
WEFT_CPU_INSTANTIATE(SwigluBackwardParams)

}  // namespace weft::kernels
