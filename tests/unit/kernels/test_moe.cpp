// moe: routing against an fp64 reference and finite differences, the
// permute and unpermute against a reference walk and finite differences
// through both gate placements, capacity drops, and thread-count independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/moe/moe.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/test_util.h"

namespace weft::kernels::test {
namespace {

struct RouteCase {
  int64_t rows, E, k;
  RouterScore score;
  RouterWeights weights;
  double scale;
};

std::string route_name(const RouteCase& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.E) + "_top" + std::to_string(c.k) +
         (c.score == RouterScore::softmax ? "_softmax" : "_sigmoid") +
         (c.weights == RouterWeights::renormalized ? "_renorm" : "") + (c.scale != 1.0 ? "_scaled" : "");
}

// Mixtral (softmax, top 2, renormalised), Qwen3 without norm_topk_prob
// (softmax, top 8 of 128 cut to odd sizes), Llama 4 (sigmoid, top 1),
// DeepSeek-style (sigmoid, renormalised, scaled), and the edges k = E and E = 1.
const std::vector<RouteCase> kRouteCases = {
    {37, 8, 2, RouterScore::softmax, RouterWeights::renormalized, 1.0},
    {113, 13, 5, RouterScore::softmax, RouterWeights::scores, 1.0},
    {29, 16, 1, RouterScore::sigmoid, RouterWeights::scores, 1.0},
    {31, 12, 3, RouterScore::sigmoid, RouterWeights::renormalized, 2.5},
    {5, 3, 3, RouterScore::softmax, RouterWeights::renormalized, 1.0},
    {7, 1, 1, RouterScore::softmax, RouterWeights::scores, 1.0},
};

template <typename R>
struct Routed {
  std::vector<R> scores, weights;
  std::vector<int32_t> experts;
};

// The routing written out in R: scores, the k largest logits (ties: the
// lower index), the weights.
template <typename R, typename L>
Routed<R> route_reference(const RouteCase& c, const std::vector<L>& logits) {
  Routed<R> r;
  r.scores.resize(size_t(c.rows * c.E));
  r.weights.resize(size_t(c.rows * c.k));
  r.experts.resize(size_t(c.rows * c.k));
  for (int64_t t = 0; t < c.rows; ++t) {
    const L* z = logits.data() + t * c.E;
    R* s = r.scores.data() + t * c.E;
    if (c.score == RouterScore::softmax) {
      R top = R(*std::max_element(z, z + c.E)), sum = 0;
      for (int64_t e = 0; e < c.E; ++e) sum += s[e] = std::exp(R(z[e]) - top);
      for (int64_t e = 0; e < c.E; ++e) s[e] /= sum;
    } else {
      for (int64_t e = 0; e < c.E; ++e) s[e] = R(1) / (R(1) + std::exp(-R(z[e])));
    }
    std::vector<int32_t> order(size_t(c.E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    R sum = 0;
    for (int64_t j = 0; j < c.k; ++j) sum += s[order[j]];
    for (int64_t j = 0; j < c.k; ++j) {
      r.experts[t * c.k + j] = order[j];
      const R w = s[order[j]];
      r.weights[t * c.k + j] = R(c.scale) * (c.weights == RouterWeights::renormalized ? w / sum : w);
    }
  }
  return r;
}

RouterConfig router_of(const RouteCase& c) { return {c.E, c.k, c.score, c.weights, c.scale}; }

class MoeRouteTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(MoeRouteTest, MatchesFp64Reference) {
  const RouteCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto logits = rng.uniform<float>(c.rows * c.E, -4, 4);
  const auto ref = route_reference<double>(c, logits);
  const auto naive = route_reference<float>(c, logits);
  std::vector<float> scores(size_t(c.rows * c.E)), weights(size_t(c.rows * c.k));
  std::vector<int32_t> experts(size_t(c.rows * c.k));
  std::vector<int64_t> counts(size_t(c.E), 3);  // added to
  std::vector<double> sums(size_t(c.E), 0.5);   // added to
  ASSERT_EQ(run(MoeRouteParams<float>{.rows = c.rows, .router = router_of(c), .logits = logits.data(),
                                      .scores = scores.data(), .experts = experts.data(),
                                      .weights = weights.data(), .counts = counts.data(),
                                      .score_sums = sums.data()}),
            Status::ok);
  EXPECT_EQ(experts, ref.experts);
  expect_within_rule("scores", scores, naive.scores, ref.scores);
  expect_within_rule("weights", weights, naive.weights, ref.weights);
  for (int64_t e = 0; e < c.E; ++e) {
    int64_t n = 0;
    double sum = 0;
    for (int32_t x : ref.experts) n += x == e;
    for (int64_t t = 0; t < c.rows; ++t) sum += ref.scores[t * c.E + e];
    EXPECT_EQ(counts[e], 3 + n) << "expert " << e;
    EXPECT_NEAR(sums[e], 0.5 + sum, 1e-5 * (1 + sum)) << "expert " << e;
  }
}

// d/dlogits of sum r_w . weights + sum_t sum_e g_e scores[t, e]: the combine
// weights' gradient and a balancing loss's per-expert score gradient.
TEST_P(MoeRouteTest, GradientsMatchFiniteDifferences) {
  const RouteCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  auto logits = rng.uniform<double>(c.rows * c.E, -3, 3);
  const auto r = rng.uniform<double>(c.rows * c.k);
  const auto g = rng.uniform<double>(c.E);
  std::vector<double> scores(size_t(c.rows * c.E)), weights(size_t(c.rows * c.k));
  std::vector<int32_t> experts(size_t(c.rows * c.k));
  std::vector<int64_t> counts(size_t(c.E));
  const auto forward = [&] {
    run_or_throw(MoeRouteParams<double>{.rows = c.rows, .router = router_of(c), .logits = logits.data(),
                                        .scores = scores.data(), .experts = experts.data(),
                                        .weights = weights.data(), .counts = counts.data()});
    double loss = dot(r, weights);
    for (int64_t t = 0; t < c.rows; ++t)
      for (int64_t e = 0; e < c.E; ++e) loss += g[e] * scores[t * c.E + e];
    return loss;
  };
  forward();
  std::vector<double> dlogits(size_t(c.rows * c.E));
  ASSERT_EQ(run(MoeRouteBackwardParams<double>{.rows = c.rows, .router = router_of(c), .scores = scores.data(),
                                               .experts = experts.data(), .dweights = r.data(),
                                               .dscore_per_expert = g.data(), .dlogits = dlogits.data()}),
            Status::ok);
  EXPECT_LE(fd_error(logits, dlogits, forward, rng), kFdTolerance);
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeRouteTest, ::testing::ValuesIn(kRouteCases),
                         [](const auto& info) { return route_name(info.param); });

// The balancing loss against transformers' load_balancing_loss_func (the
// routers of every layer concatenated, one-hot masks over the k choices)
// and Megatron's per-layer aux_loss, both written out from the reference
// routing in double; and its score gradient through route's backward
// against finite differences of that written-out loss.
TEST(MoeBalanceLoss, IsTransformersAndMegatronsLoss) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const RouteCase base : {RouteCase{23, 8, 2, RouterScore::softmax, RouterWeights::renormalized, 1.0},
                               RouteCase{31, 6, 3, RouterScore::softmax, RouterWeights::scores, 1.0},
                               RouteCase{17, 5, 1, RouterScore::sigmoid, RouterWeights::scores, 1.0}}) {
    SCOPED_TRACE(route_name(base));
    const int64_t L = 1 + rng.index(3), T = base.rows, E = base.E, k = base.k;
    const double coef = 0.001 + rng.uniform<double>(1, 0, 0.05)[0];
    std::vector<std::vector<double>> logits;
    for (int64_t l = 0; l < L; ++l) logits.push_back(rng.uniform<double>(T * E, -3, 3));
    // transformers: rows of all layers, tokens_per_expert (k, E) the mean of
    // the one-hot choices, router_prob_per_expert (E) the mean score,
    // loss = E * sum over (j, e) of their product.
    const auto hf_loss = [&] {
      std::vector<double> per_slot(size_t(k * E), 0), prob(size_t(E), 0);
      for (int64_t l = 0; l < L; ++l) {
        const auto r = route_reference<double>(base, logits[size_t(l)]);
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t j = 0; j < k; ++j) per_slot[size_t(j * E + r.experts[size_t(t * k + j)])] += 1;
          for (int64_t e = 0; e < E; ++e) prob[size_t(e)] += r.scores[size_t(t * E + e)];
        }
      }
      double loss = 0;
      const double R = double(T * L);
      for (int64_t j = 0; j < k; ++j)
        for (int64_t e = 0; e < E; ++e) loss += per_slot[size_t(j * E + e)] / R * (prob[size_t(e)] / R);
      return coef * double(E) * loss;
    };
    // Megatron: per layer E * sum_e tokens_e / (T k) * mean score_e, summed.
    const auto megatron_loss = [&] {
      double loss = 0;
      for (int64_t l = 0; l < L; ++l) {
        const auto r = route_reference<double>(base, logits[size_t(l)]);
        for (int64_t e = 0; e < E; ++e) {
          double tokens = 0, score = 0;
          for (int32_t x : r.experts) tokens += x == e;
          for (int64_t t = 0; t < T; ++t) score += r.scores[size_t(t * E + e)];
          loss += double(E) * tokens / double(T * k) * score / double(T);
        }
      }
      return coef * loss;
    };
    // The kernels' statistics, layer by layer.
    std::vector<int64_t> counts(size_t(L * E), 0);
    std::vector<double> sums(size_t(L * E), 0);
    std::vector<std::vector<double>> scores(static_cast<size_t>(L));
    std::vector<std::vector<int32_t>> experts(static_cast<size_t>(L));
    for (int64_t l = 0; l < L; ++l) {
      scores[size_t(l)].resize(size_t(T * E));
      experts[size_t(l)].resize(size_t(T * k));
      std::vector<double> weights(size_t(T * k));
      run_or_throw(MoeRouteParams<double>{.rows = T, .router = router_of(base), .logits = logits[size_t(l)].data(),
                                          .scores = scores[size_t(l)].data(), .experts = experts[size_t(l)].data(),
                                          .weights = weights.data(), .counts = counts.data() + l * E,
                                          .score_sums = sums.data() + l * E});
    }
    for (const auto& [scope, reference] : {std::pair{AuxLossScope::global, std::function<double()>(hf_loss)},
                                           std::pair{AuxLossScope::per_layer, std::function<double()>(megatron_loss)}}) {
      std::vector<double> dscore(size_t(L * E));
      const double loss = moe_balance_loss(scope, coef, L, E, k, T, counts.data(), sums.data(), dscore.data());
      const double want = reference();
      EXPECT_NEAR(loss, want, 1e-12 * want) << aux_loss_scope_name(scope);
      // One layer's logits: route's backward with the per-expert score
      // gradient and no weight gradient, against central differences.
      const int64_t l = rng.index(L);
      std::vector<double> dlogits(size_t(T * E)), no_dweights(size_t(T * k), 0);
      run_or_throw(MoeRouteBackwardParams<double>{.rows = T, .router = router_of(base),
                                                  .scores = scores[size_t(l)].data(),
                                                  .experts = experts[size_t(l)].data(), .dweights = no_dweights.data(),
                                                  .dscore_per_expert = dscore.data() + l * E,
                                                  .dlogits = dlogits.data()});
      EXPECT_LE(fd_error(logits[size_t(l)], dlogits, reference, rng), kFdTolerance) << aux_loss_scope_name(scope);
    }
    // The two scopes differ by the cross-layer terms and by k.
    if (L == 1) {
      std::vector<double> d(static_cast<size_t>(E));
      EXPECT_NEAR(moe_balance_loss(AuxLossScope::global, coef, 1, E, k, T, counts.data(), sums.data(), d.data()),
                  double(k) * megatron_loss(), 1e-12 * megatron_loss());
    }
  }
}

TEST(MoeBalanceLoss, StatisticsThatNoRouteGivesAreRefused) {
  // 2 layers x 3 experts, 2 tokens, top 2: each layer's counts sum to 4.
  std::vector<int64_t> counts = {2, 1, 1, 2, 2, 0};
  std::vector<double> sums = {1.2, 0.5, 0.3, 0.9, 0.6, 0.5}, d(6);
  const auto loss = [&](AuxLossScope scope, double coef, int64_t k) {
    return moe_balance_loss(scope, coef, 2, 3, k, 2, counts.data(), sums.data(), d.data());
  };
  EXPECT_GT(loss(AuxLossScope::global, 0.01, 2), 0);
  counts[5] = 1;
  WEFT_EXPECT_THROW_MSG(loss(AuxLossScope::global, 0.01, 2), InputError, "layer 1's counts sum to 5", "2 x 2");
  counts[5] = 0;
  sums[1] = -0.1;
  WEFT_EXPECT_THROW_MSG(loss(AuxLossScope::per_layer, 0.01, 2), InputError, "layer 0 expert 1", "-0.1");
  sums[1] = 0.5;
  WEFT_EXPECT_THROW_MSG(loss(AuxLossScope::global, 0.01, 4), InputError, "top_k=4");
  WEFT_EXPECT_THROW_MSG(loss(AuxLossScope::global, -1, 2), InputError, "coefficient -1");
}

struct PermuteCase {
  int64_t rows, C, E, k, capacity;
  GateOn gate;
};

std::string permute_name(const PermuteCase& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.C) + "_E" + std::to_string(c.E) + "_top" +
         std::to_string(c.k) + (c.capacity > 0 ? "_cap" + std::to_string(c.capacity) : "") +
         (c.gate == GateOn::input ? "_gate_in" : "_gate_out");
}

const std::vector<PermuteCase> kPermuteCases = {
    {37, 5, 8, 2, 0, GateOn::output}, {29, 7, 16, 1, 0, GateOn::input}, {41, 3, 4, 3, 0, GateOn::output},
    {53, 6, 5, 2, 9, GateOn::output}, {23, 4, 6, 2, 3, GateOn::input},  {1, 9, 3, 3, 0, GateOn::output},
};

// A random choice of k distinct experts per row, skewed towards expert 0 so
// that capacities drop.
std::vector<int32_t> random_choices(const PermuteCase& c, Rng& rng) {
  std::vector<int32_t> v(size_t(c.rows * c.k));
  for (int64_t t = 0; t < c.rows; ++t) {
    std::vector<int32_t> all(size_t(c.E));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t j = 0; j < c.k; ++j) {
      const int64_t pick = rng.index(4) == 0 ? 0 : rng.index(int64_t(all.size()));
      v[t * c.k + j] = all[size_t(pick)];
      all.erase(all.begin() + pick);
    }
  }
  return v;
}

// The layer's token movement around stand-in experts (expert e scales its
// rows by a[e]), in double: permute, experts, unpermute.
struct Pipeline {
  Pipeline(const PermuteCase& c_, std::vector<int32_t> choices_, std::vector<double> a_)
      : c(c_), choices(std::move(choices_)), a(std::move(a_)) {}
  PermuteCase c;
  std::vector<int32_t> choices;
  std::vector<double> a;  // (E)
  std::vector<int64_t> offsets, position;
  std::vector<double> permuted, expert_out, out;
  int64_t dropped = 0;

  void forward(const std::vector<double>& x, const std::vector<double>& w) {
    const int64_t n = c.rows * c.k;
    offsets.assign(size_t(c.E + 1), 0);
    position.assign(size_t(n), 0);
    permuted.assign(size_t(n * c.C), 0);
    out.assign(size_t(c.rows * c.C), 0);
    dropped = 0;
    run_or_throw(MoePermuteParams<double>{.rows = c.rows, .C = c.C, .experts = c.E, .top_k = c.k,
                                          .capacity = c.capacity, .gate = c.gate, .expert_of = choices.data(),
                                          .weights = w.data(), .x = x.data(), .out = permuted.data(),
                                          .offsets = offsets.data(), .position = position.data(),
                                          .dropped = &dropped});
    expert_out = permuted;
    for (int64_t e = 0; e < c.E; ++e)
      for (int64_t i = offsets[e] * c.C; i < offsets[e + 1] * c.C; ++i) expert_out[i] *= a[e];
    run_or_throw(MoeUnpermuteParams<double>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                            .position = position.data(), .weights = w.data(),
                                            .y = expert_out.data(), .out = out.data()});
  }
};

class MoePermuteTest : public ::testing::TestWithParam<PermuteCase> {};

// The permuted rows, offsets, positions and the combined output against a
// walk over the choices written out here.
TEST_P(MoePermuteTest, MatchesReferenceWalk) {
  const PermuteCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  Pipeline p{c, random_choices(c, rng), rng.uniform<double>(c.E, 0.5, 2)};
  const auto x = rng.uniform<double>(c.rows * c.C), w = rng.uniform<double>(c.rows * c.k, 0.1, 1);
  p.forward(x, w);
  // Reference: each expert keeps its first `capacity` tokens in token order.
  std::vector<int64_t> kept(size_t(c.E), 0), expect_pos(size_t(c.rows * c.k), -1);
  int64_t dropped = 0;
  for (int64_t i = 0; i < c.rows * c.k; ++i) {
    const int32_t e = p.choices[i];
    if (c.capacity > 0 && kept[e] >= c.capacity) {
      ++dropped;
      continue;
    }
    expect_pos[i] = kept[e]++;
  }
  std::vector<int64_t> expect_offsets(size_t(c.E + 1), 0);
  for (int64_t e = 0; e < c.E; ++e) expect_offsets[e + 1] = expect_offsets[e] + kept[e];
  for (int64_t i = 0; i < c.rows * c.k; ++i)
    if (expect_pos[i] >= 0) expect_pos[i] += expect_offsets[p.choices[i]];
  EXPECT_EQ(p.offsets, expect_offsets);
  EXPECT_EQ(p.position, expect_pos);
  EXPECT_EQ(p.dropped, dropped);
  if (c.capacity > 0) {
    EXPECT_GT(dropped, 0) << "the case was meant to drop";
  }
  std::vector<double> expect_out(size_t(c.rows * c.C), 0);
  for (int64_t t = 0; t < c.rows; ++t)
    for (int64_t j = 0; j < c.k; ++j) {
      const int64_t i = t * c.k + j;
      if (expect_pos[i] < 0) continue;
      const double scale = p.a[p.choices[i]] * w[i];
      for (int64_t col = 0; col < c.C; ++col) {
        const double xi = x[t * c.C + col];
        EXPECT_EQ(p.permuted[expect_pos[i] * c.C + col], c.gate == GateOn::input ? w[i] * xi : xi);
        expect_out[t * c.C + col] += scale * xi;
      }
    }
  for (size_t i = 0; i < expect_out.size(); ++i)
    EXPECT_NEAR(p.out[i], expect_out[i], 1e-12 * (1 + std::abs(expect_out[i]))) << "out " << i;
}

// d/dx and d/dweights of r . out through the permute, the stand-in experts
// and the unpermute, with their backwards chained as a block runs them.
TEST_P(MoePermuteTest, GradientsMatchFiniteDifferences) {
  const PermuteCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  Pipeline p{c, random_choices(c, rng), rng.uniform<double>(c.E, 0.5, 2)};
  auto x = rng.uniform<double>(c.rows * c.C), w = rng.uniform<double>(c.rows * c.k, 0.1, 1);
  const auto r = rng.uniform<double>(c.rows * c.C);
  const auto loss = [&] {
    p.forward(x, w);
    return dot(r, p.out);
  };
  loss();
  const int64_t n = c.rows * c.k;
  std::vector<double> dexpert(size_t(n * c.C), 7.0), dw(size_t(n), 7.0), dx(size_t(c.rows * c.C), 0.25);
  ASSERT_EQ(run(MoeUnpermuteBackwardParams<double>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                   .position = p.position.data(), .weights = w.data(),
                                                   .y = p.expert_out.data(), .dout = r.data(),
                                                   .dy = dexpert.data(), .dweights = dw.data()}),
            Status::ok);
  for (int64_t e = 0; e < c.E; ++e)
    for (int64_t i = p.offsets[e] * c.C; i < p.offsets[e + 1] * c.C; ++i) dexpert[i] *= p.a[e];
  std::vector<double> dw_in(size_t(n), 7.0);
  ASSERT_EQ(run(MoePermuteBackwardParams<double>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                 .position = p.position.data(), .weights = w.data(), .x = x.data(),
                                                 .dout = dexpert.data(), .dx = dx.data(), .dweights = dw_in.data(),
                                                 .write = Write::accumulate}),
            Status::ok);
  for (double& v : dx) v -= 0.25;  // accumulated onto 0.25
  if (c.gate == GateOn::input) dw = dw_in;
  EXPECT_LE(fd_error(x, dx, loss, rng), kFdTolerance) << "dx";
  EXPECT_LE(fd_error(w, dw, loss, rng), kFdTolerance) << "dweights";
}

// The gate on the output applied inside the experts (Megatron-Core's
// order): the permute lays the weights out in row order, each expert
// scales its rows by them, the combine is the plain sum. The same layer as
// the weighted combine; the permute's backward returns the rows' weight
// gradients to the choices, and they and dx match finite differences.
TEST_P(MoePermuteTest, WeightsAppliedInTheExpertsGiveTheSameLayer) {
  const PermuteCase& c = GetParam();
  if (c.gate != GateOn::output) GTEST_SKIP() << "the gate is on the input";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  Pipeline p{c, random_choices(c, rng), rng.uniform<double>(c.E, 0.5, 2)};
  auto x = rng.uniform<double>(c.rows * c.C), w = rng.uniform<double>(c.rows * c.k, 0.1, 1);
  const auto r = rng.uniform<double>(c.rows * c.C);
  const int64_t n = c.rows * c.k;
  std::vector<double> row_w(size_t(n), 7.0), permuted(size_t(n * c.C)), expert_out, out(size_t(c.rows * c.C));
  std::vector<int64_t> offsets(size_t(c.E + 1)), position(static_cast<size_t>(n));
  const auto forward = [&] {
    run_or_throw(MoePermuteParams<double>{.rows = c.rows, .C = c.C, .experts = c.E, .top_k = c.k,
                                          .capacity = c.capacity, .gate = c.gate, .expert_of = p.choices.data(),
                                          .weights = w.data(), .x = x.data(), .out = permuted.data(),
                                          .offsets = offsets.data(), .position = position.data(),
                                          .row_weights = row_w.data()});
    expert_out = permuted;
    for (int64_t e = 0; e < c.E; ++e)
      for (int64_t row = offsets[e]; row < offsets[e + 1]; ++row)
        for (int64_t col = 0; col < c.C; ++col) expert_out[row * c.C + col] *= p.a[e] * row_w[row];
    run_or_throw(MoeUnpermuteParams<double>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = GateOn::input,
                                            .position = position.data(), .y = expert_out.data(),
                                            .out = out.data()});
    return dot(r, out);
  };
  forward();
  p.forward(x, w);  // the weighted combine's
  for (int64_t i = 0; i < n; ++i) {
    if (position[i] >= 0) {
      EXPECT_EQ(row_w[position[i]], w[i]) << "choice " << i;
    }
  }
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_NEAR(out[i], p.out[i], 1e-12 * (1 + std::abs(p.out[i]))) << "out " << i;
  std::vector<double> dy(size_t(n * c.C)), row_dw(size_t(n), 0.0), dw(size_t(n), 7.0), dx(size_t(c.rows * c.C));
  ASSERT_EQ(run(MoeUnpermuteBackwardParams<double>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = GateOn::input,
                                                   .position = position.data(), .dout = r.data(),
                                                   .dy = dy.data()}),
            Status::ok);
  for (int64_t e = 0; e < c.E; ++e)
    for (int64_t row = offsets[e]; row < offsets[e + 1]; ++row)
      for (int64_t col = 0; col < c.C; ++col) {
        double& g = dy[row * c.C + col];
        row_dw[row] += g * p.a[e] * permuted[row * c.C + col];
        g *= p.a[e] * row_w[row];
      }
  ASSERT_EQ(run(MoePermuteBackwardParams<double>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                 .position = position.data(), .dout = dy.data(), .dx = dx.data(),
                                                 .dweights = dw.data(), .row_dweights = row_dw.data()}),
            Status::ok);
  for (int64_t i = 0; i < n; ++i) {
    if (position[i] < 0) {
      EXPECT_EQ(dw[i], 0.0) << "a dropped choice's weight gradient";
    }
  }
  EXPECT_LE(fd_error(x, dx, forward, rng), kFdTolerance) << "dx";
  EXPECT_LE(fd_error(w, dw, forward, rng), kFdTolerance) << "dweights";
}

// Parallel passes give the bits of one thread.
TEST_P(MoePermuteTest, ResultsDoNotDependOnThreadCount) {
  const PermuteCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t rows = c.rows * 400;  // past the size that runs on one thread
  PermuteCase big = c;
  big.rows = rows;
  const auto choices = random_choices(big, rng);
  const auto x = rng.uniform<float>(rows * c.C), w = rng.uniform<float>(rows * c.k);
  const auto logits = rng.uniform<float>(rows * c.E, -4, 4);
  const auto once = [&] {
    std::vector<float> permuted(size_t(rows * c.k * c.C)), out(size_t(rows * c.C)), scores(size_t(rows * c.E)),
        weights(size_t(rows * c.k));
    std::vector<int64_t> offsets(size_t(c.E + 1)), position(size_t(rows * c.k)), counts(size_t(c.E));
    std::vector<int32_t> experts(size_t(rows * c.k));
    std::vector<double> sums(size_t(c.E));
    run_or_throw(MoePermuteParams<float>{.rows = rows, .C = c.C, .experts = c.E, .top_k = c.k,
                                         .capacity = c.capacity, .gate = c.gate, .expert_of = choices.data(),
                                         .weights = w.data(), .x = x.data(), .out = permuted.data(),
                                         .offsets = offsets.data(), .position = position.data()});
    run_or_throw(MoeUnpermuteParams<float>{.rows = rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                           .position = position.data(), .weights = w.data(), .y = permuted.data(),
                                           .out = out.data()});
    run_or_throw(MoeRouteParams<float>{.rows = rows, .router = {c.E, c.k, RouterScore::softmax,
                                                                RouterWeights::renormalized, 1.0},
                                       .logits = logits.data(), .scores = scores.data(), .experts = experts.data(),
                                       .weights = weights.data(), .counts = counts.data(), .score_sums = sums.data()});
    return std::make_tuple(permuted, out, scores, weights, sums);
  };
  EXPECT_TRUE(with_threads(1, once) == with_threads(2, once));
}

INSTANTIATE_TEST_SUITE_P(Cases, MoePermuteTest, ::testing::ValuesIn(kPermuteCases),
                         [](const auto& info) { return permute_name(info.param); });

TEST(MoeArgs, RejectsImpossibleParams) {
  std::vector<float> logits(8), scores(8), weights(4), x(8), out(16);
  std::vector<int32_t> experts(4);
  std::vector<int64_t> counts(4), offsets(5), position(4);
  const auto route = [&](RouterConfig r) {
    return run(MoeRouteParams<float>{.rows = 2, .router = r, .logits = logits.data(), .scores = scores.data(),
                                     .experts = experts.data(), .weights = weights.data(), .counts = counts.data()});
  };
  EXPECT_EQ(route({4, 2}), Status::ok);
  EXPECT_EQ(route({4, 0}), Status::invalid_argument);  // k = 0
  EXPECT_EQ(route({4, 5}), Status::invalid_argument);  // k > E
  EXPECT_EQ(route({0, 1}), Status::invalid_argument);  // no experts
  EXPECT_EQ(route({4, 2, RouterScore::softmax, RouterWeights::scores, 0.0}), Status::invalid_argument);
  EXPECT_EQ(route({4, 2, RouterScore::softmax, RouterWeights::scores, std::nan("")}), Status::invalid_argument);
  EXPECT_EQ(run(MoeRouteParams<float>{.rows = 2, .router = {4, 2}, .logits = logits.data(), .scores = scores.data(),
                                      .experts = experts.data(), .weights = weights.data()}),
            Status::invalid_argument);  // no counts
  const auto permute = [&](int64_t capacity, GateOn gate, const float* w) {
    return run(MoePermuteParams<float>{.rows = 2, .C = 4, .experts = 4, .top_k = 2, .capacity = capacity,
                                       .gate = gate, .expert_of = experts.data(), .weights = w, .x = x.data(),
                                       .out = out.data(), .offsets = offsets.data(), .position = position.data()});
  };
  experts = {0, 1, 2, 3};
  EXPECT_EQ(permute(0, GateOn::output, nullptr), Status::ok);
  EXPECT_EQ(permute(-1, GateOn::output, nullptr), Status::invalid_argument);
  EXPECT_EQ(permute(0, GateOn::input, nullptr), Status::invalid_argument);  // the gate needs weights
  EXPECT_EQ(permute(0, GateOn::input, weights.data()), Status::ok);
  // The rows' weights: only with the gate on the output, from its weights.
  std::vector<float> row_weights(4), dweights(4), dx(8);
  const auto with_rows = [&](GateOn gate, const float* w) {
    return run(MoePermuteParams<float>{.rows = 2, .C = 4, .experts = 4, .top_k = 2, .gate = gate,
                                       .expert_of = experts.data(), .weights = w, .x = x.data(), .out = out.data(),
                                       .offsets = offsets.data(), .position = position.data(),
                                       .row_weights = row_weights.data()});
  };
  EXPECT_EQ(with_rows(GateOn::output, weights.data()), Status::ok);
  EXPECT_EQ(with_rows(GateOn::output, nullptr), Status::invalid_argument);
  EXPECT_EQ(with_rows(GateOn::input, weights.data()), Status::invalid_argument);
  const auto back = [&](float* dw) {
    return run(MoePermuteBackwardParams<float>{.rows = 2, .C = 4, .top_k = 2, .gate = GateOn::output,
                                               .position = position.data(), .dout = out.data(), .dx = dx.data(),
                                               .dweights = dw, .row_dweights = row_weights.data()});
  };
  EXPECT_EQ(back(dweights.data()), Status::ok);
  EXPECT_EQ(back(nullptr), Status::invalid_argument);  // nowhere for the choices' gradients
  EXPECT_FALSE(supports(MoePermuteParams<float>{.rows = 2, .C = 4, .experts = 4, .top_k = 2},
                        Backend::cuda));
  // An expert id past E is the data's fault: named.
  experts = {0, 1, 4, 3};
  try {
    permute(0, GateOn::output, nullptr);
    FAIL() << "expert id 4 of E = 4 was accepted";
  } catch (const weft::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace weft::kernels::test
