// The adamw params' rules (Status::invalid_argument), defined once for both
// backends: adamw_cpu.cpp and adamw.cu apply them before any limit of their
// own. Free of CUDA and fmt, so nvcc compiles it too.
#pragma once

#include <cmath>

#include "kernels/adamw/adamw.h"
#include "kernels/cpu_common.h"

namespace weft::kernels {

template <typename Elem, typename G>
Status params_check(const AdamwParams<Elem, G>& p) {
  const bool finite = std::isfinite(p.lr) && std::isfinite(p.beta1) && std::isfinite(p.beta2) &&
                      std::isfinite(p.eps) && std::isfinite(p.weight_decay) &&
                      std::isfinite(p.grad_scale);
  if (!finite || p.step < 1 || p.lr < 0 || p.beta1 < 0 || p.beta1 >= 1 || p.beta2 < 0 ||
      p.beta2 >= 1 || p.eps < 0 || p.weight_decay < 0)
    return Status::invalid_argument;
  // A master copy exists exactly where the weights are narrower than Acc.
  constexpr bool needs_master = sizeof(Elem) < sizeof(Acc<Elem>);
  for (const AdamwTensor<Elem, G>& t : p.tensors)
    if (t.n < 0 || !cpu::present(t.param, t.n) || !cpu::present(t.grad, t.n) ||
        !cpu::present(t.m, t.n) || !cpu::present(t.v, t.n) ||
        (needs_master ? !cpu::present(t.master, t.n) : t.master != nullptr))
      return Status::invalid_argument;
  return Status::ok;
}

}  // namespace weft::kernels
