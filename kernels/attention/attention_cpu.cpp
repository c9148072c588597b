// attention on the CPU: causal GQA attention, flash-style and materialized.
//
// Flash forward: each query row walks its keys in blocks of kKeyBlock with an
// online softmax (running max and sum; the output accumulator is rescaled
// once per block), so no T x T matrix exists; it saves lse per row. The
// backward recomputes P_ij = exp(scale * q_i.k_j - lse_i) and uses
// delta_i = rowsum(dO_i * O_i) for dS_ij = P_ij (dP_ij - delta_i).
//
// Materialized: the forward writes the scaled scores of a row, softmaxes them
// in place into P and multiplies by V, as an eager framework would; the
// backward writes dP = dO V^T into its workspace, turns it into dS in place
// (delta_i = sum_j P_ij dP_ij) and reads P and dS back.
//
// Both backwards share two gradient passes: dq parallel over query rows, and
// dk, dv parallel over (batch, kv head, key row), each kv row summing over the
// query heads of its group. Computing the probabilities in both passes costs
// a second recompute but needs no atomics, and every sum runs in a fixed
// order, so results do not depend on the thread count.
#include "kernels/attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu_common.h"

namespace weft::kernels {
namespace {

// 64 keys: the block's scores (256 bytes in fp32) stay in L1, and the
// accumulator is rescaled once per 64 keys rather than once per key.
constexpr int64_t kKeyBlock = 64;

// Flat offsets into the contiguous layouts.
struct Dims {
  int64_t B, T, H, H_kv, D;
  int64_t group() const { return H / H_kv; }
  int64_t q_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * D; }
  int64_t kv_at(int64_t b, int64_t t, int64_t hk) const { return ((b * T + t) * H_kv + hk) * D; }
  int64_t row_at(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * T + t; }
  int64_t probs_at(int64_t b, int64_t h, int64_t i) const { return row_at(b, h, i) * T; }
};

template <typename P>
Dims dims_of(const P& p) {
  return {p.B, p.T, p.H, p.H_kv, p.D};
}

template <typename A, typename X, typename Y>
A dot(const X* x, const Y* y, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < n; ++d) s += A(x[d]) * A(y[d]);
  return s;
}

// acc += a * x
template <typename A, typename X>
void axpy(A a, const X* x, A* acc, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) acc[d] += a * A(x[d]);
}

// Multiply-adds of one pass over the causal (query, key) pairs.
template <typename P>
int64_t pair_work(const P& p) {
  return p.B * p.H * p.T * (p.T + 1) / 2 * p.D;
}

bool dims_valid(int64_t B, int64_t T, int64_t H, int64_t H_kv, int64_t D) {
  return B >= 0 && T >= 0 && H >= 1 && H_kv >= 1 && D >= 1 && H % H_kv == 0;
}

template <typename Elem>
Status check(const AttentionForwardParams<Elem>& p) {
  if (!dims_valid(p.B, p.T, p.H, p.H_kv, p.D)) return Status::invalid_argument;
  const int64_t nq = p.B * p.T * p.H * p.D, nkv = p.B * p.T * p.H_kv * p.D;
  bool ok = cpu::present(p.q, nq) && cpu::present(p.k, nkv) && cpu::present(p.v, nkv) &&
            cpu::present(p.out, nq);
  if (p.kind == AttentionKind::flash) ok = ok && cpu::present(p.lse, p.B * p.H * p.T);
  if (p.kind == AttentionKind::materialized) ok = ok && cpu::present(p.probs, p.B * p.H * p.T * p.T);
  return cpu::status_of(ok);
}

template <typename Elem>
Status check(const AttentionBackwardParams<Elem>& p) {
  if (!dims_valid(p.B, p.T, p.H, p.H_kv, p.D)) return Status::invalid_argument;
  const int64_t nq = p.B * p.T * p.H * p.D, nkv = p.B * p.T * p.H_kv * p.D;
  bool ok = cpu::present(p.q, nq) && cpu::present(p.k, nkv) && cpu::present(p.v, nkv) &&
            cpu::present(p.dout, nq) && cpu::present(p.dq, nq) && cpu::present(p.dk, nkv) &&
            cpu::present(p.dv, nkv);
  if (p.kind == AttentionKind::flash)
    ok = ok && cpu::present(p.out, nq) && cpu::present(p.lse, p.B * p.H * p.T);
  if (p.kind == AttentionKind::materialized) ok = ok && cpu::present(p.probs, p.B * p.H * p.T * p.T);
  return cpu::status_of(ok);
}

template <typename Elem>
void flash_forward(const AttentionForwardParams<Elem>& p) {
  using A = Acc<Elem>;
  const Dims d = dims_of(p);
  const A scale = A(1) / std::sqrt(A(p.D));
#pragma omp parallel if (cpu::worth_parallel(pair_work(p)))
  {
    std::vector<A> o(p.D);
    A s[kKeyBlock];
    // Causal rows grow with i, so rows are dealt out dynamically.
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t i = 0; i < p.T; ++i) {
          const int64_t hk = h / d.group();
          const Elem* qi = p.q + d.q_at(b, i, h);
          A row_max = -std::numeric_limits<A>::infinity();
          A row_sum = 0;
          std::fill(o.begin(), o.end(), A(0));
          for (int64_t j0 = 0; j0 <= i; j0 += kKeyBlock) {
            const int64_t n = std::min(kKeyBlock, i + 1 - j0);
            A block_max = -std::numeric_limits<A>::infinity();
            for (int64_t jj = 0; jj < n; ++jj) {
              s[jj] = scale * dot<A>(qi, p.k + d.kv_at(b, j0 + jj, hk), p.D);
              block_max = std::max(block_max, s[jj]);
            }
            const A new_max = std::max(row_max, block_max);
            // exp(-inf) = 0 on the first block, where row_sum and o are zero anyway.
            const A rescale = std::exp(row_max - new_max);
            row_sum *= rescale;
            for (A& x : o) x *= rescale;
            for (int64_t jj = 0; jj < n; ++jj) {
              const A pj = std::exp(s[jj] - new_max);
              row_sum += pj;
              axpy(pj, p.v + d.kv_at(b, j0 + jj, hk), o.data(), p.D);
            }
            row_max = new_max;
          }
          Elem* oi = p.out + d.q_at(b, i, h);
          for (int64_t c = 0; c < p.D; ++c) oi[c] = Elem(o[c] / row_sum);
          p.lse[d.row_at(b, h, i)] = row_max + std::log(row_sum);
        }
  }
}

template <typename Elem>
void materialized_forward(const AttentionForwardParams<Elem>& p) {
  using A = Acc<Elem>;
  const Dims d = dims_of(p);
  const A scale = A(1) / std::sqrt(A(p.D));
#pragma omp parallel if (cpu::worth_parallel(pair_work(p)))
  {
    std::vector<A> o(p.D);
    std::vector<A> s(p.T);
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t i = 0; i < p.T; ++i) {
          const int64_t hk = h / d.group();
          const Elem* qi = p.q + d.q_at(b, i, h);
          Elem* prow = p.probs + d.probs_at(b, h, i);
          A row_max = -std::numeric_limits<A>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            s[j] = scale * dot<A>(qi, p.k + d.kv_at(b, j, hk), p.D);
            row_max = std::max(row_max, s[j]);
          }
          A row_sum = 0;
          for (int64_t j = 0; j <= i; ++j) {
            s[j] = std::exp(s[j] - row_max);
            row_sum += s[j];
          }
          for (int64_t j = 0; j <= i; ++j) prow[j] = Elem(s[j] / row_sum);
          std::fill(prow + i + 1, prow + p.T, Elem(0));
          // The output uses the stored probabilities, the ones the backward reads.
          std::fill(o.begin(), o.end(), A(0));
          for (int64_t j = 0; j <= i; ++j) axpy(A(prow[j]), p.v + d.kv_at(b, j, hk), o.data(), p.D);
          Elem* oi = p.out + d.q_at(b, i, h);
          for (int64_t c = 0; c < p.D; ++c) oi[c] = Elem(o[c]);
          if (p.lse) p.lse[d.row_at(b, h, i)] = row_max + std::log(row_sum);
        }
  }
}

// dq_i = scale * sum_{j <= i} dS_ij k_j, where prob_grad(b, h, i, j) returns
// {P_ij, dS_ij}.
template <typename Elem, typename ProbGrad>
void dq_pass(const AttentionBackwardParams<Elem>& p, ProbGrad prob_grad) {
  using A = Acc<Elem>;
  const Dims d = dims_of(p);
  const A scale = A(1) / std::sqrt(A(p.D));
#pragma omp parallel if (cpu::worth_parallel(pair_work(p)))
  {
    std::vector<A> acc(p.D);
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t i = 0; i < p.T; ++i) {
          const int64_t hk = h / d.group();
          std::fill(acc.begin(), acc.end(), A(0));
          for (int64_t j = 0; j <= i; ++j)
            axpy(prob_grad(b, h, i, j).second, p.k + d.kv_at(b, j, hk), acc.data(), p.D);
          Elem* dqi = p.dq + d.q_at(b, i, h);
          for (int64_t c = 0; c < p.D; ++c) dqi[c] = Elem(scale * acc[c]);
        }
  }
}

// dv_j = sum_h sum_{i >= j} P_ij dO_i and dk_j = scale * sum_h sum_{i >= j}
// dS_ij q_i, over the query heads h of kv head hk.
template <typename Elem, typename ProbGrad>
void dkdv_pass(const AttentionBackwardParams<Elem>& p, ProbGrad prob_grad) {
  using A = Acc<Elem>;
  const Dims d = dims_of(p);
  const A scale = A(1) / std::sqrt(A(p.D));
#pragma omp parallel if (cpu::worth_parallel(pair_work(p)))
  {
    std::vector<A> dk(p.D), dv(p.D);
#pragma omp for collapse(3) schedule(dynamic, 4)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hk = 0; hk < p.H_kv; ++hk)
        for (int64_t j = 0; j < p.T; ++j) {
          std::fill(dk.begin(), dk.end(), A(0));
          std::fill(dv.begin(), dv.end(), A(0));
          for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h)
            for (int64_t i = j; i < p.T; ++i) {
              const auto [pij, dsij] = prob_grad(b, h, i, j);
              axpy(pij, p.dout + d.q_at(b, i, h), dv.data(), p.D);
              axpy(dsij, p.q + d.q_at(b, i, h), dk.data(), p.D);
            }
          Elem* dkj = p.dk + d.kv_at(b, j, hk);
          Elem* dvj = p.dv + d.kv_at(b, j, hk);
          for (int64_t c = 0; c < p.D; ++c) {
            dkj[c] = Elem(scale * dk[c]);
            dvj[c] = Elem(dv[c]);
          }
        }
  }
}

template <typename Elem>
void flash_backward(const AttentionBackwardParams<Elem>& p, Acc<Elem>* delta) {
  using A = Acc<Elem>;
  const Dims d = dims_of(p);
  const A scale = A(1) / std::sqrt(A(p.D));
#pragma omp parallel for collapse(3) if (cpu::worth_parallel(p.B * p.H * p.T * p.D))
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.T; ++i)
        delta[d.row_at(b, h, i)] = dot<A>(p.dout + d.q_at(b, i, h), p.out + d.q_at(b, i, h), p.D);
  auto prob_grad = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t hk = h / d.group();
    const int64_t row = d.row_at(b, h, i);
    const A pij = std::exp(scale * dot<A>(p.q + d.q_at(b, i, h), p.k + d.kv_at(b, j, hk), p.D) -
                           A(p.lse[row]));
    const A dpij = dot<A>(p.dout + d.q_at(b, i, h), p.v + d.kv_at(b, j, hk), p.D);
    return std::pair<A, A>(pij, pij * (dpij - delta[row]));
  };
  dq_pass(p, prob_grad);
  dkdv_pass(p, prob_grad);
}

template <typename Elem>
void materialized_backward(const AttentionBackwardParams<Elem>& p, Elem* ds) {
  using A = Acc<Elem>;
  const Dims d = dims_of(p);
  // dP = dO V^T row by row, then dS = P (dP - delta) in place.
#pragma omp parallel for collapse(3) schedule(dynamic, 4) if (cpu::worth_parallel(pair_work(p)))
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < p.T; ++i) {
        const int64_t hk = h / d.group();
        const Elem* prow = p.probs + d.probs_at(b, h, i);
        Elem* dsrow = ds + d.probs_at(b, h, i);
        A delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
          dsrow[j] = Elem(dot<A>(p.dout + d.q_at(b, i, h), p.v + d.kv_at(b, j, hk), p.D));
          delta += A(prow[j]) * A(dsrow[j]);
        }
        for (int64_t j = 0; j <= i; ++j) dsrow[j] = Elem(A(prow[j]) * (A(dsrow[j]) - delta));
      }
  auto prob_grad = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t at = d.probs_at(b, h, i) + j;
    return std::pair<A, A>(A(p.probs[at]), A(ds[at]));
  };
  dq_pass(p, prob_grad);
  dkdv_pass(p, prob_grad);
}

}  // namespace

template <typename Elem>
bool supports(const AttentionForwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const AttentionForwardParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const AttentionForwardParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(check(p), 0, ws, stream); s != Status::ok) return s;
  if (p.kind == AttentionKind::flash)
    flash_forward(p);
  else
    materialized_forward(p);
  return Status::ok;
}

template <typename Elem>
bool supports(const AttentionBackwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const AttentionBackwardParams<Elem>& p, Backend) {
  if (check(p) != Status::ok) return 0;
  if (p.kind == AttentionKind::flash) return cpu::piece_bytes<Acc<Elem>>(p.B * p.H * p.T);
  return cpu::piece_bytes<Elem>(p.B * p.H * p.T * p.T);
}

template <typename Elem>
Status launch(const AttentionBackwardParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(check(p), workspace_bytes(p), ws, stream); s != Status::ok) return s;
  cpu::WorkspaceCarver carve(ws);
  if (p.kind == AttentionKind::flash)
    flash_backward(p, carve.take<Acc<Elem>>(p.B * p.H * p.T));
  else
    materialized_backward(p, carve.take<Elem>(p.B * p.H * p.T * p.T));
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(AttentionForwardParams)
WEFT_CPU_INSTANTIATE(AttentionBackwardParams)

}  // namespace weft::kernels
