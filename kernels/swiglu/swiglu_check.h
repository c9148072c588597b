// The swiglu params' rules (Status::invalid_argument), defined once for both
// backends: swiglu_cpu.cpp and swiglu.cu apply them. Free of CUDA and fmt, so
// nvcc compiles it too.
#pragma once

#include <cstdint>

#include "kernels/cpu_common.h"
#include "kernels/swiglu/swiglu.h"

namespace weft::kernels {

template <typename Elem>
Status params_check(const SwigluForwardParams<Elem>& p) {
  const int64_t n = p.rows * p.F;
  return cpu::status_of(p.rows >= 0 && p.F >= 0 && cpu::present(p.gate, n) &&
                        cpu::present(p.up, n) && cpu::present(p.act, n) &&
                        (!p.row_scale || p.rows == 0 || p.F > 0));
}

template <typename Elem>
Status params_check(const SwigluBackwardParams<Elem>& p) {
  const int64_t n = p.rows * p.F;
  return cpu::status_of(p.rows >= 0 && p.F >= 0 && cpu::present(p.gate, n) &&
                        cpu::present(p.up, n) && cpu::present(p.dact, n) &&
                        cpu::present(p.dgate, n) && cpu::present(p.dup, n) &&
                        (!p.drow_scale || p.row_scale) && (!p.row_scale || p.rows == 0 || p.F > 0));
}

}  // namespace weft::kernels
