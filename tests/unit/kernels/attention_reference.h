// The textbook causal attention both attention tests compare against: the
// CPU kernels' (in fp64, and in fp32 for the tolerance rule's naive error)
// and the GPU kernels' (in fp64, and in fp32 rounding to bf16 wherever an
// eager framework stores a tensor).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {

// Offsets into q, out and dout (B, T, H, D), k and v (B, T, H_kv, D), and the
// per-row tensors lse (B, H, T) and probs (B, H, T, T).
struct AttentionIndex {
  const AttentionCase& c;
  int64_t q(int64_t b, int64_t t, int64_t h) const { return ((b * c.T + t) * c.H + h) * c.D; }
  int64_t kv(int64_t b, int64_t t, int64_t h) const { return ((b * c.T + t) * c.H_kv + h) * c.D; }
  int64_t row(int64_t b, int64_t h, int64_t t) const { return (b * c.H + h) * c.T + t; }
};

template <typename R>
struct AttentionResult {
  std::vector<R> out, lse, probs, dq, dk, dv;
};

// Causal softmax attention, forward and backward, computed in R from inputs
// of any type: the row of scaled scores is materialised, softmaxed and
// multiplied by V, and the backward goes through the softmax Jacobian.
// `round` is applied where a stored tensor would be rounded (scores,
// probabilities, dP, dS and the outputs); the identity by default. With
// chunk > 0, query i sees only the keys of its chunk, from
// floor(i / chunk) * chunk to i (Llama 4's chunked attention).
template <typename R, typename In, typename Round>
AttentionResult<R> textbook_attention(const AttentionCase& c, const std::vector<In>& q,
                                      const std::vector<In>& k, const std::vector<In>& v,
                                      const std::vector<In>& dout, Round round, int64_t chunk = 0) {
  const AttentionIndex at{c};
  const R scale = R(1) / std::sqrt(R(c.D));
  const int64_t group = c.H / c.H_kv;
  AttentionResult<R> r;
  r.out.assign(q.size(), R(0));
  r.dq.assign(q.size(), R(0));
  r.dk.assign(k.size(), R(0));
  r.dv.assign(v.size(), R(0));
  r.lse.assign(c.B * c.H * c.T, R(0));
  r.probs.assign(c.B * c.H * c.T * c.T, R(0));
  std::vector<R> s(c.T), dp(c.T);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = 0; i < c.T; ++i) {
        const int64_t hk = h / group;
        const In* qi = &q[at.q(b, i, h)];
        const In* doi = &dout[at.q(b, i, h)];
        const int64_t j0 = chunk > 0 ? i / chunk * chunk : 0;
        R mx = -INFINITY;
        for (int64_t j = j0; j <= i; ++j) {
          const In* kj = &k[at.kv(b, j, hk)];
          R dot = 0;
          for (int64_t d = 0; d < c.D; ++d) dot += R(qi[d]) * R(kj[d]);
          s[j] = round(scale * dot);
          mx = std::max(mx, s[j]);
        }
        R sum = 0;
        for (int64_t j = j0; j <= i; ++j) sum += std::exp(s[j] - mx);
        r.lse[at.row(b, h, i)] = mx + std::log(sum);
        R* prow = &r.probs[at.row(b, h, i) * c.T];
        R delta = 0;
        for (int64_t j = j0; j <= i; ++j) {
          const In* vj = &v[at.kv(b, j, hk)];
          prow[j] = round(std::exp(s[j] - mx) / sum);
          R dot = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            r.out[at.q(b, i, h) + d] += prow[j] * R(vj[d]);
            dot += R(doi[d]) * R(vj[d]);
          }
          dp[j] = round(dot);
          delta += prow[j] * dp[j];
        }
        for (int64_t j = j0; j <= i; ++j) {
          const R ds = round(prow[j] * (dp[j] - delta));
          const In* kj = &k[at.kv(b, j, hk)];
          for (int64_t d = 0; d < c.D; ++d) {
            r.dq[at.q(b, i, h) + d] += ds * R(kj[d]);
            r.dk[at.kv(b, j, hk) + d] += scale * ds * R(qi[d]);
            r.dv[at.kv(b, j, hk) + d] += prow[j] * R(doi[d]);
          }
        }
      }
  for (R& x : r.dq) x *= scale;
  for (auto* t : {&r.out, &r.dq, &r.dk, &r.dv})
    for (R& x : *t) x = round(x);
  return r;
}

template <typename R, typename In>
AttentionResult<R> textbook_attention(const AttentionCase& c, const std::vector<In>& q,
                                      const std::vector<In>& k, const std::vector<In>& v,
                                      const std::vector<In>& dout) {
  return textbook_attention<R>(c, q, k, v, dout, [](R x) { return x; });
}

}  // namespace weft::kernels::test
