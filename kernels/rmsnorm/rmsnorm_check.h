// The rmsnorm params' rules (Status::invalid_argument), defined once for both
// backends: rmsnorm_cpu.cpp and rmsnorm.cu apply them beside any limit of
// their own. Free of CUDA and fmt, so nvcc compiles it too.
#pragma once

#include <cstdint>

#include "kernels/cpu_common.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace weft::kernels {

template <typename Elem>
Status params_check(const RmsnormForwardParams<Elem>& p) {
  const int64_t n = p.rows * p.C;
  const bool ok = p.rows >= 0 && p.C >= 1 && p.eps >= 0 && cpu::present(p.x, n) &&
                  cpu::present(p.weight, p.C) && cpu::present(p.y, n) &&
                  cpu::present(p.rstd, p.rows) && (p.residual == nullptr || cpu::present(p.sum, n));
  return cpu::status_of(ok);
}

template <typename Elem, typename G>
Status params_check(const RmsnormBackwardParams<Elem, G>& p) {
  const int64_t n = p.rows * p.C;
  const bool ok = p.rows >= 0 && p.C >= 1 && cpu::present(p.x, n) && cpu::present(p.weight, p.C) &&
                  cpu::present(p.rstd, p.rows) && cpu::present(p.dy, n) && cpu::present(p.dx, n) &&
                  (!p.dweight || cpu::present(p.dweight, p.C));
  return cpu::status_of(ok);
}

template <typename Elem>
Status params_check(const RmsnormUnfusedForwardParams<Elem>& p) {
  const int64_t n = p.rows * p.C;
  const bool ok = p.rows >= 0 && p.C >= 1 && p.eps >= 0 && cpu::present(p.x, n) &&
                  cpu::present(p.weight, p.C) && cpu::present(p.y, n) &&
                  cpu::present(p.rstd, p.rows) && cpu::present(p.x_hat, n);
  return cpu::status_of(ok);
}

template <typename Elem, typename G>
Status params_check(const RmsnormUnfusedBackwardParams<Elem, G>& p) {
  const int64_t n = p.rows * p.C;
  const bool ok = p.rows >= 0 && p.C >= 1 && cpu::present(p.x_hat, n) &&
                  cpu::present(p.rstd, p.rows) && cpu::present(p.weight, p.C) &&
                  cpu::present(p.dy, n) && cpu::present(p.dx, n) && (!p.dweight || cpu::present(p.dweight, p.C));
  return cpu::status_of(ok);
}

}  // namespace weft::kernels
