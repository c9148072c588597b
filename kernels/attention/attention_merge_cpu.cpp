// attention_merge on the CPU: one pass over the rows, the weights of the two
// parts in fp64 (their exponentials of lse differences lose nothing there),
// rows split over the OpenMP team; each row's arithmetic is the same for any
// thread count.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_check.h"
#include "kernels/cpu_common.h"

namespace weft::kernels {
namespace {

template <typename Elem>
void merge(const AttentionMergeParams<Elem>& p) {
  const int64_t qr = p.q_batch_rows ? p.q_batch_rows : p.T, lr = p.lse_batch_rows ? p.lse_batch_rows : p.T;
  const int64_t rows = p.B * p.H * p.T;
  constexpr double kNone = -std::numeric_limits<double>::infinity();
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(rows * p.D))
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row % p.T, h = (row / p.T) % p.H, b = row / (p.T * p.H);
    const int64_t li = (b * p.H + h) * lr + t;
    const double l1 = double(p.lse[li]), l2 = double(p.part_lse[li]);
    if (l2 == kNone) continue;  // the part saw no key
    const double hi = std::max(l1, l2);
    const double l = hi + std::log((l1 == kNone ? 0.0 : std::exp(l1 - hi)) + std::exp(l2 - hi));
    const double w1 = l1 == kNone ? 0.0 : std::exp(l1 - l), w2 = std::exp(l2 - l);
    Elem* o = p.out + ((b * qr + t) * p.H + h) * p.D;
    const Elem* po = p.part_out + ((b * qr + t) * p.H + h) * p.D;
    for (int64_t d = 0; d < p.D; ++d) o[d] = Elem(w1 * double(o[d]) + w2 * double(po[d]));
    p.lse[li] = Acc<Elem>(l);
  }
}

}  // namespace

template <typename Elem>
bool supports(const AttentionMergeParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && params_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const AttentionMergeParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const AttentionMergeParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  merge(p);
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(AttentionMergeParams)

}  // namespace weft::kernels
