// The cross_entropy params' rules (Status::invalid_argument), defined once for
// both backends: cross_entropy_cpu.cpp and cross_entropy.cu apply them beside
// any limit of their own. Free of CUDA and fmt, so nvcc compiles it too.
#pragma once

#include <cmath>

#include "kernels/cpu_common.h"
#include "kernels/cross_entropy/cross_entropy.h"

namespace weft::kernels {

template <typename Elem>
Status params_check(const CrossEntropyMaxParams<Elem>& p) {
  return cpu::status_of(p.rows >= 0 && p.V_local >= 1 && p.valid >= -1 && p.valid <= p.V_local &&
                        cpu::present(p.logits, p.rows * p.V_local) && cpu::present(p.row_max, p.rows));
}

template <typename Elem>
Status params_check(const CrossEntropySumExpParams<Elem>& p) {
  return cpu::status_of(p.rows >= 0 && p.V_local >= 1 && p.valid >= -1 && p.valid <= p.V_local &&
                        cpu::present(p.logits, p.rows * p.V_local) && cpu::present(p.row_max, p.rows) &&
                        cpu::present(p.sum_exp, p.rows));
}

template <typename Elem>
Status params_check(const CrossEntropyLossGradParams<Elem>& p) {
  // A shard may reach past V, or lie past it: a padded vocabulary.
  const bool ok = p.rows >= 0 && p.V >= 1 && p.vocab_start >= 0 && p.V_local >= 1 &&
                  std::isfinite(p.grad_scale) &&
                  (p.ignore_index < 0 || p.ignore_index >= p.V) &&
                  cpu::present(p.logits, p.rows * p.V_local) && cpu::present(p.targets, p.rows) &&
                  cpu::present(p.row_max, p.rows) && cpu::present(p.sum_exp, p.rows);
  return cpu::status_of(ok);
}

}  // namespace weft::kernels
