// moe on the CPU: rows in parallel, everything else in a fixed order.
//
// route scores each row in Acc (softmax shifted by the row's max logit) and
// takes the k largest logits by k passes over the row (k is at most 8 in the
// published models), which also fixes the order ties take: the lower index
// first. The backward of renormalised weights w_j = a s_j / S (S the sum of
// the chosen scores) is ds_m = a / S (dw_m - sum_j dw_j s_j / S), then
// through the softmax ds -> s (ds - s . ds) or the sigmoid ds s (1 - s).
// permute numbers each expert's choices in one pass over the rows (so the
// order within an expert is the token order, and a capacity keeps the first
// tokens), then copies rows in parallel; every other pass is one row per
// iteration, its choices summed in order.
#include "kernels/moe/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cpu_common.h"
#include "kernels/moe/moe_check.h"

namespace weft::kernels {
namespace {

// out[t] = (out[t] +) the sum over t's kept choices of src[pos(t, j)], each
// times weights[t, j] unless weights is null: the unpermute, and the
// permute's backward for dx.
template <typename Elem>
void combine_rows(int64_t rows, int64_t C, int64_t k, const int64_t* position, const Acc<Elem>* weights,
                  const Elem* src, Elem* out, bool add) {
  using A = Acc<Elem>;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(rows * k * C))
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t* pos = position + t * k;
    Elem* dst = out + t * C;
    for (int64_t c = 0; c < C; ++c) {
      A sum = add ? A(dst[c]) : A(0);
      for (int64_t j = 0; j < k; ++j) {
        if (pos[j] < 0) continue;
        const A v = A(src[pos[j] * C + c]);
        sum += weights ? weights[t * k + j] * v : v;
      }
      dst[c] = Elem(sum);
    }
  }
}

}  // namespace

// supports() of a CPU op: the backend and the params' rules; the ops that
// need no scratch.
#define WEFT_MOE_CPU_SUPPORTS(Params)                                  \
  template <typename Elem>                                             \
  bool supports(const Params<Elem>& p, Backend backend) {              \
    return backend == Backend::cpu && params_check(p) == Status::ok;   \
  }
#define WEFT_MOE_CPU_NO_WORKSPACE(Params)                  \
  template <typename Elem>                                 \
  int64_t workspace_bytes(const Params<Elem>&, Backend) {  \
    return 0;                                              \
  }

WEFT_MOE_CPU_SUPPORTS(MoeRouteParams)
WEFT_MOE_CPU_NO_WORKSPACE(MoeRouteParams)
template <typename Elem>
Status launch(const MoeRouteParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t E = p.router.experts, k = p.router.top_k;
  const bool softmax = p.router.score == RouterScore::softmax;
  const bool renormalize = p.router.weights == RouterWeights::renormalized;
  const A scale = A(p.router.scale);
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * E))
  for (int64_t t = 0; t < p.rows; ++t) {
    const Elem* z = p.logits + t * E;
    A* s = p.scores + t * E;
    if (softmax) {
      A top = A(z[0]);
      for (int64_t e = 1; e < E; ++e) top = std::max(top, A(z[e]));
      A sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        s[e] = std::exp(A(z[e]) - top);
        sum += s[e];
      }
      for (int64_t e = 0; e < E; ++e) s[e] /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = A(1) / (A(1) + std::exp(-A(z[e])));
    }
    int32_t* chosen = p.experts + t * k;
    A* w = p.weights + t * k;
    A chosen_sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (std::find(chosen, chosen + j, int32_t(e)) != chosen + j) continue;
        if (best < 0 || A(z[e]) > A(z[best])) best = e;
      }
      chosen[j] = int32_t(best);
      w[j] = s[best];
      chosen_sum += s[best];
    }
    for (int64_t j = 0; j < k; ++j) w[j] = scale * (renormalize ? w[j] / chosen_sum : w[j]);
  }
  for (int64_t i = 0; i < p.rows * k; ++i) ++p.counts[p.experts[i]];
  if (p.score_sums) {
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * E))
    for (int64_t e = 0; e < E; ++e) {
      double sum = 0;
      for (int64_t t = 0; t < p.rows; ++t) sum += double(p.scores[t * E + e]);
      p.score_sums[e] += sum;
    }
  }
  return Status::ok;
}

WEFT_MOE_CPU_SUPPORTS(MoeRouteBackwardParams)
WEFT_MOE_CPU_NO_WORKSPACE(MoeRouteBackwardParams)
template <typename Elem>
Status launch(const MoeRouteBackwardParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t E = p.router.experts, k = p.router.top_k;
  const bool softmax = p.router.score == RouterScore::softmax;
  const bool renormalize = p.router.weights == RouterWeights::renormalized;
  const A scale = A(p.router.scale);
#pragma omp parallel if (cpu::worth_parallel(p.rows * E))
  {
    std::vector<A> ds(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.rows; ++t) {
      const A* s = p.scores + t * E;
      const int32_t* chosen = p.experts + t * k;
      const A* dw = p.dweights + t * k;
      for (int64_t e = 0; e < E; ++e) ds[e] = p.dscore_per_expert ? A(p.dscore_per_expert[e]) : A(0);
      if (renormalize) {
        A sum = 0, weighted = 0;
        for (int64_t j = 0; j < k; ++j) sum += s[chosen[j]];
        for (int64_t j = 0; j < k; ++j) weighted += dw[j] * s[chosen[j]];
        weighted /= sum;
        for (int64_t j = 0; j < k; ++j) ds[chosen[j]] += scale / sum * (dw[j] - weighted);
      } else {
        for (int64_t j = 0; j < k; ++j) ds[chosen[j]] += scale * dw[j];
      }
      Elem* dz = p.dlogits + t * E;
      if (softmax) {
        A dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += ds[e] * s[e];
        for (int64_t e = 0; e < E; ++e) dz[e] = Elem(s[e] * (ds[e] - dot));
      } else {
        for (int64_t e = 0; e < E; ++e) dz[e] = Elem(ds[e] * s[e] * (A(1) - s[e]));
      }
    }
  }
  return Status::ok;
}

WEFT_MOE_CPU_SUPPORTS(MoePermuteParams)
template <typename Elem>
int64_t workspace_bytes(const MoePermuteParams<Elem>& p, Backend) {
  return cpu::piece_bytes<int64_t>(p.experts);
}
template <typename Elem>
Status launch(const MoePermuteParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), workspace_bytes(p, Backend::cpu), ws, stream); s != Status::ok)
    return s;
  const int64_t E = p.experts, k = p.top_k, n = p.rows * k;
  int64_t* kept = cpu::WorkspaceCarver(ws).take<int64_t>(E);
  std::fill(kept, kept + E, int64_t{0});
  // Each choice's place among its expert's, in token order; past the
  // capacity it is dropped.
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = p.expert_of[i];
    if (e < 0 || e >= E)
      throw InputError(fmt::format("moe permute: expert id {} of choice {} (token {}) is outside [0, E) for E = {}",
                                   e, i % k, i / k, E));
    if (p.capacity > 0 && kept[e] >= p.capacity) {
      p.position[i] = -1;
      ++dropped;
      continue;
    }
    p.position[i] = kept[e]++;
  }
  p.offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) p.offsets[e + 1] = p.offsets[e] + kept[e];
  for (int64_t i = 0; i < n; ++i)
    if (p.position[i] >= 0) p.position[i] += p.offsets[p.expert_of[i]];
  if (p.dropped) *p.dropped += dropped;
  if (p.row_weights)
    for (int64_t i = 0; i < n; ++i)
      if (p.position[i] >= 0) p.row_weights[p.position[i]] = p.weights[i];
  const bool gated = p.gate == GateOn::input;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n * p.C))
  for (int64_t i = 0; i < n; ++i) {
    if (p.position[i] < 0) continue;
    const Elem* src = p.x + (i / k) * p.C;
    Elem* dst = p.out + p.position[i] * p.C;
    if (gated) {
      const A w = p.weights[i];
      for (int64_t c = 0; c < p.C; ++c) dst[c] = Elem(w * A(src[c]));
    } else {
      std::copy(src, src + p.C, dst);
    }
  }
  return Status::ok;
}

WEFT_MOE_CPU_SUPPORTS(MoePermuteBackwardParams)
WEFT_MOE_CPU_NO_WORKSPACE(MoePermuteBackwardParams)
template <typename Elem>
Status launch(const MoePermuteBackwardParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t k = p.top_k, C = p.C;
  const bool gated = p.gate == GateOn::input;
  if (gated) {
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * k * C))
    for (int64_t t = 0; t < p.rows; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t pos = p.position[t * k + j];
        A dot = 0;
        if (pos >= 0)
          for (int64_t c = 0; c < C; ++c) dot += A(p.x[t * C + c]) * A(p.dout[pos * C + c]);
        p.dweights[t * k + j] = dot;
      }
  } else if (p.row_dweights) {
    for (int64_t i = 0; i < p.rows * k; ++i) p.dweights[i] = p.position[i] >= 0 ? p.row_dweights[p.position[i]] : A(0);
  }
  combine_rows(p.rows, C, k, p.position, gated ? p.weights : nullptr, p.dout, p.dx, p.write == Write::accumulate);
  return Status::ok;
}

WEFT_MOE_CPU_SUPPORTS(MoeUnpermuteParams)
WEFT_MOE_CPU_NO_WORKSPACE(MoeUnpermuteParams)
template <typename Elem>
Status launch(const MoeUnpermuteParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  combine_rows(p.rows, p.C, p.top_k, p.position, p.gate == GateOn::output ? p.weights : nullptr, p.y, p.out,
               p.write == Write::accumulate);
  return Status::ok;
}

WEFT_MOE_CPU_SUPPORTS(MoeUnpermuteBackwardParams)
WEFT_MOE_CPU_NO_WORKSPACE(MoeUnpermuteBackwardParams)
template <typename Elem>
Status launch(const MoeUnpermuteBackwardParams<Elem>& p, Workspace ws, Stream stream) {
  using A = Acc<Elem>;
  if (Status s = cpu::preflight(params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t k = p.top_k, C = p.C;
  const bool weighted = p.gate == GateOn::output;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(p.rows * k * C))
  for (int64_t t = 0; t < p.rows; ++t) {
    const Elem* g = p.dout + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pos = p.position[t * k + j];
      if (pos < 0) {
        if (weighted) p.dweights[t * k + j] = 0;
        continue;
      }
      Elem* dy = p.dy + pos * C;
      if (!weighted) {
        std::copy(g, g + C, dy);
        continue;
      }
      const A w = p.weights[t * k + j];
      const Elem* y = p.y + pos * C;
      A dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dot += A(y[c]) * A(g[c]);
        dy[c] = Elem(w * A(g[c]));
      }
      p.dweights[t * k + j] = dot;
    }
  }
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(MoeRouteParams)
WEFT_CPU_INSTANTIATE(MoeRouteBackwardParams)
WEFT_CPU_INSTANTIATE(MoePermuteParams)
WEFT_CPU_INSTANTIATE(MoePermuteBackwardParams)
WEFT_CPU_INSTANTIATE(MoeUnpermuteParams)
WEFT_CPU_INSTANTIATE(MoeUnpermuteBackwardParams)

}  // namespace weft::kernels
