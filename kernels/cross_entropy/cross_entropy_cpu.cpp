// cross_entropy on the CPU: each phase is one parallel pass over rows.
//
// Subtracting the global row max before exp keeps every exponent <= 0, so
// sum_exp cannot overflow whatever the logits; log(sum_exp) + max is the
// log-sum-exp of the row. Phase (c) computes the loss from the target logit
// before the row is overwritten by its gradient.
#include "kernels/cross_entropy/cross_entropy.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cpu_common.h"
#include "kernels/cpu_math.h"
#include "kernels/cross_entropy/cross_entropy_check.h"

namespace weft::kernels {
namespace {

void targets_check(const int32_t* targets, int64_t rows, int64_t V, int32_t ignore_index) {
  for (int64_t i = 0; i < rows; ++i)
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= V))
      throw InputError(fmt::format(
          "cross_entropy: target id {} at position {} is outside [0, V) for the model's "
          "vocabulary size V = {} and is not the ignore index {}",
          targets[i], i, V, ignore_index));
}

}  // namespace

template <typename Elem>
bool supports(const CrossEntropyMaxParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const CrossEntropyMaxParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const CrossEntropyMaxParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t valid = valid_columns(p.valid, p.V_local);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * p.V_local))
  for (int64_t r = 0; r < p.rows; ++r) {
    const Elem* x = p.logits + r * p.V_local;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, A(x[j]));
    p.row_max[r] = m;
  }
  return Status::ok;
}

template <typename Elem>
bool supports(const CrossEntropySumExpParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const CrossEntropySumExpParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const CrossEntropySumExpParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t valid = valid_columns(p.valid, p.V_local);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * p.V_local))
  for (int64_t r = 0; r < p.rows; ++r) {
    const Elem* x = p.logits + r * p.V_local;
    const A m = p.row_max[r];
    A s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < valid; ++j) s += cpu::exp_nonpositive(A(x[j]) - m);
    p.sum_exp[r] = s;
  }
  return Status::ok;
}

template <typename Elem>
bool supports(const CrossEntropyLossGradParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}
template <typename Elem>
int64_t workspace_bytes(const CrossEntropyLossGradParams<Elem>&, Backend) {
  return 0;
}
template <typename Elem>
Status launch(const CrossEntropyLossGradParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  targets_check(p.targets, p.rows, p.V, p.ignore_index);
  const A scale = A(p.grad_scale);
  const int64_t valid = valid_columns(p.V, p.vocab_start, p.V_local);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * p.V_local))
  for (int64_t r = 0; r < p.rows; ++r) {
    Elem* x = p.logits + r * p.V_local;
    if (p.targets[r] == p.ignore_index) {
      std::fill(x, x + p.V_local, Elem(0));
      if (p.loss) p.loss[r] = 0;
      continue;
    }
    const int64_t local = int64_t{p.targets[r]} - p.vocab_start;
    const bool owner = local >= 0 && local < p.V_local;
    const A m = p.row_max[r];
    const A inv_sum = A(1) / p.sum_exp[r];
    const A target_logit = owner ? A(x[local]) : A(0);
    if (p.loss) p.loss[r] = owner ? std::log(p.sum_exp[r]) + m - target_logit : A(0);
    for (int64_t j = 0; j < valid; ++j) x[j] = Elem(cpu::exp_nonpositive(A(x[j]) - m) * inv_sum * scale);
    std::fill(x + valid, x + p.V_local, Elem(0));  // padding: no probability
    // Recomputed from the saved logit: (p - 1) * scale rounds once, where
    // adjusting the stored p * scale would round twice.
    if (owner) x[local] = Elem((cpu::exp_nonpositive(target_logit - m) * inv_sum - A(1)) * scale);
  }
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(CrossEntropyMaxParams)
WEFT_CPU_INSTANTIATE(CrossEntropySumExpParams)
WEFT_CPU_INSTANTIATE(CrossEntropyLossGradParams)

}  // namespace weft::kernels
