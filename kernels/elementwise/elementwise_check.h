// The elementwise params' rules (Status::invalid_argument), defined once for
// both backends: elementwise_cpu.cpp and elementwise.cu apply them. Free of
// CUDA and fmt, so nvcc compiles it too.
#pragma once

#include "kernels/cpu_common.h"
#include "kernels/elementwise/elementwise.h"

namespace weft::kernels {

template <typename Elem>
Status params_check(const AddParams<Elem>& p) {
  return cpu::status_of(p.n >= 0 && cpu::present(p.a, p.n) && cpu::present(p.b, p.n) &&
                        cpu::present(p.out, p.n));
}
template <typename Elem>
Status params_check(const ScaleParams<Elem>& p) {
  return cpu::status_of(p.n >= 0 && cpu::present(p.x, p.n) && cpu::present(p.out, p.n));
}
template <typename Elem>
Status params_check(const AxpyParams<Elem>& p) {
  return cpu::status_of(p.n >= 0 && cpu::present(p.x, p.n) && cpu::present(p.y, p.n));
}
template <typename Elem>
Status params_check(const FillParams<Elem>& p) {
  return cpu::status_of(p.n >= 0 && cpu::present(p.x, p.n));
}
template <typename Elem>
Status params_check(const SumSquaresParams<Elem>& p) {
  return cpu::status_of(p.n >= 0 && cpu::present(p.x, p.n) && p.sum != nullptr);
}
template <typename Elem>
Status params_check(const WidenParams<Elem>& p) {
  return cpu::status_of(p.n >= 0 && cpu::present(p.x, p.n) && cpu::present(p.out, p.n));
}
template <typename Elem>
Status params_check(const NarrowParams<Elem>& p) {
  return cpu::status_of(p.n >= 0 && cpu::present(p.x, p.n) && cpu::present(p.out, p.n));
}

}  // namespace weft::kernels
