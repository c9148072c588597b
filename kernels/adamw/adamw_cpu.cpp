// adamw on the CPU: one fused elementwise pass per tensor (decay, both
// moments, the update), parallel over its elements.
//
// The per-step scalars (bias corrections, step size) are computed once in
// double, as PyTorch computes them in Python floats, then applied in Acc.
#include "kernels/adamw/adamw.h"

#include <cmath>

#include "kernels/adamw/adamw_check.h"
#include "kernels/cpu_common.h"

namespace weft::kernels {

template <typename Elem, typename G>
bool supports(const AdamwParams<Elem, G>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}

template <typename Elem, typename G>
int64_t workspace_bytes(const AdamwParams<Elem, G>&, Backend) {
  return 0;
}

template <typename Elem, typename G>
Status launch(const AdamwParams<Elem, G>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const double t = static_cast<double>(p.step);
  const double bias1 = 1.0 - std::pow(p.beta1, t);
  const double bias2 = 1.0 - std::pow(p.beta2, t);
  const A step_size = A(p.lr / bias1);
  const A bias2_sqrt = A(std::sqrt(bias2));
  // 1 - beta in double then rounded, as torch passes them as Python floats.
  const A beta2 = A(p.beta2), one_minus_beta1 = A(1.0 - p.beta1), one_minus_beta2 = A(1.0 - p.beta2);
  const A eps = A(p.eps), grad_scale = A(p.grad_scale);
  const A decay_factor = A(1.0 - p.lr * p.weight_decay);
  for (const AdamwTensor<Elem, G>& tensor : p.tensors) {
    const bool decay = tensor.decay == WeightDecay::apply && p.weight_decay != 0;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(tensor.n))
    for (int64_t i = 0; i < tensor.n; ++i) {
      const A g = tensor.grad[i] * grad_scale;
      A param = tensor.param[i];
      if (decay) param *= decay_factor;
      // torch: m.lerp_(g, 1 - beta1); v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
      const A m = tensor.m[i] + one_minus_beta1 * (g - tensor.m[i]);
      const A v = beta2 * tensor.v[i] + one_minus_beta2 * g * g;
      param -= step_size * (m / (std::sqrt(v) / bias2_sqrt + eps));
      tensor.m[i] = m;
      tensor.v[i] = v;
      tensor.param[i] = param;
    }
  }
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(AdamwParams)

}  // namespace weft::kernels
