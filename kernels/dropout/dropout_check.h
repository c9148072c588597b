// The dropout params' rules (Status::invalid_argument), defined once for
// both backends. Free of CUDA and fmt, so nvcc compiles it too.
#pragma once

#include <cstdint>

#include "kernels/cpu_common.h"
#include "kernels/dropout/dropout.h"

namespace weft::kernels {

template <typename Elem>
Status params_check(const DropoutParams<Elem>& p) {
  const int64_t n = p.rows * p.cols;
  const bool split = p.cp == 1 || (p.cp > 1 && p.seq % (2 * p.cp) == 0 && p.local_seq == p.seq / p.cp &&
                                   p.cp_rank >= 0 && p.cp_rank < p.cp);
  return cpu::status_of(p.rows >= 0 && p.cols >= 0 && p.p >= 0 && p.p < 1 && p.local_seq > 0 && p.seq > 0 &&
                        (p.cp > 1 || p.local_seq == p.seq) && split && p.first_sample >= 0 && p.col_offset >= 0 &&
                        p.col_offset + p.cols <= p.full_cols && p.rows % p.local_seq == 0 &&
                        cpu::present(p.x, n) && cpu::present(p.y, n));
}

}  // namespace weft::kernels
