// The rope params' rules (Status::invalid_argument), defined once for both
// backends: rope_cpu.cpp and rope.cu apply them beside any limit of their own.
// Free of CUDA and fmt, so nvcc compiles it too.
#pragma once

#include "kernels/cpu_common.h"
#include "kernels/rope/rope.h"

namespace weft::kernels {

template <typename Elem>
Status params_check(const RopeParams<Elem>& p) {
  const bool ok = p.B >= 0 && p.T >= 0 && p.H >= 1 && p.H_kv >= 1 && p.D >= 2 && p.D % 2 == 0 &&
                  p.position_offset >= 0 && p.theta > 0 && rope_scaling_problems(p.scaling).empty() &&
                  cpu::present(p.q, p.B * p.T * p.H * p.D) &&
                  cpu::present(p.k, p.B * p.T * p.H_kv * p.D);
  return cpu::status_of(ok);
}

}  // namespace weft::kernels
