// dropout on the CPU: one OpenMP-parallel pass over the rows, in Acc.
#include "kernels/dropout/dropout.h"

#include "kernels/cpu_common.h"
#include "kernels/dropout/dropout_check.h"

namespace weft::kernels {

template <typename Elem>
bool supports(const DropoutParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const DropoutParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const DropoutParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const A scale = A(1) / (A(1) - A(p.p));
  const bool add = p.write == Write::accumulate;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * p.cols))
  for (int64_t r = 0; r < p.rows; ++r)
    for (int64_t c = 0; c < p.cols; ++c) {
      const int64_t i = r * p.cols + c;
      const A v = dropout_keep(p.key, dropout_index(p, r, c), p.p) ? A(p.x[i]) * scale : A(0);
      p.y[i] = add ? Elem(A(p.y[i]) + v) : Elem(v);
    }
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(DropoutParams)

}  // namespace weft::kernels
