// moe on CUDA against the CPU backend (fp32) and fp64: the routing (the same
// experts, scores and weights within the fp32 rule, exact counts), its
// backward, and the permute, unpermute and their backwards over several
// chunks of choices, with capacity drops and both gate placements.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/moe/moe.h"
#include "tests/gpu/gpu_test_util.h"

namespace weft::kernels::test {
namespace {

struct GpuRouteCase {
  int64_t rows, E, k;
  RouterScore score;
  RouterWeights weights;
  double scale;
};

class GpuMoeRoute : public ::testing::TestWithParam<GpuRouteCase> {};

// Mixtral, Qwen3 (128 experts, top 8), Llama 4 Maverick (128, sigmoid top
// 1), DeepSeek-style (256 experts, sigmoid, renormalised, scaled) and an
// odd E.
const std::vector<GpuRouteCase> kCases = {
    {300, 8, 2, RouterScore::softmax, RouterWeights::renormalized, 1.0},
    {257, 128, 8, RouterScore::softmax, RouterWeights::renormalized, 1.0},
    {129, 128, 1, RouterScore::sigmoid, RouterWeights::scores, 1.0},
    {65, 256, 8, RouterScore::sigmoid, RouterWeights::renormalized, 2.5},
    {33, 37, 3, RouterScore::softmax, RouterWeights::scores, 1.0},
};

template <typename Elem>
struct CpuRoute {
  std::vector<Acc<Elem>> scores, weights;
  std::vector<Elem> dlogits;
  std::vector<int32_t> experts;
  std::vector<int64_t> counts;
  std::vector<double> sums;
};

template <typename Elem>
CpuRoute<Elem> cpu_route(const GpuRouteCase& c, const std::vector<Elem>& logits, const std::vector<float>& dw,
                         const std::vector<double>& dscore) {
  CpuRoute<Elem> r;
  const RouterConfig router{c.E, c.k, c.score, c.weights, c.scale};
  r.scores.resize(size_t(c.rows * c.E));
  r.weights.resize(size_t(c.rows * c.k));
  r.experts.resize(size_t(c.rows * c.k));
  r.counts.assign(size_t(c.E), 0);
  r.sums.assign(size_t(c.E), 0);
  status_check(run(MoeRouteParams<Elem>{.rows = c.rows, .router = router, .logits = logits.data(),
                                        .scores = r.scores.data(), .experts = r.experts.data(),
                                        .weights = r.weights.data(), .counts = r.counts.data(),
                                        .score_sums = r.sums.data()}),
               "cpu route");
  const std::vector<Acc<Elem>> dwa(dw.begin(), dw.end());
  r.dlogits.resize(size_t(c.rows * c.E));
  status_check(run(MoeRouteBackwardParams<Elem>{.rows = c.rows, .router = router, .scores = r.scores.data(),
                                                .experts = r.experts.data(), .dweights = dwa.data(),
                                                .dscore_per_expert = dscore.data(), .dlogits = r.dlogits.data()}),
               "cpu route backward");
  return r;
}

TEST_P(GpuMoeRoute, ForwardBackward) {
  const GpuRouteCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values logits = random_bf16(rng, c.rows * c.E, -4.0, 4.0);
  const auto dw = rng.uniform<float>(c.rows * c.k);
  const auto dscore = rng.uniform<double>(c.E);
  const auto ref = cpu_route<double>(c, logits.d, dw, dscore);
  const auto cpu = cpu_route<float>(c, logits.f, dw, dscore);

  const RouterConfig router{c.E, c.k, c.score, c.weights, c.scale};
  DeviceArray<bf16> dlogits_in(logits.bits), dlogits(c.rows * c.E);
  DeviceArray<float> scores(c.rows * c.E), weights(c.rows * c.k), ddw(dw);
  DeviceArray<int32_t> experts(c.rows * c.k);
  DeviceArray<int64_t> counts(std::vector<int64_t>(size_t(c.E), 0));
  DeviceArray<double> sums(std::vector<double>(size_t(c.E), 0)), ddscore(dscore);
  ASSERT_EQ(run_cuda(MoeRouteParams<bf16>{.rows = c.rows, .router = router, .logits = dlogits_in.data(),
                                          .scores = scores.data(), .experts = experts.data(),
                                          .weights = weights.data(), .counts = counts.data(),
                                          .score_sums = sums.data()}),
            Status::ok);
  // bf16 logits tie often: both backends take the lower index.
  EXPECT_EQ(experts.download(), ref.experts);
  EXPECT_EQ(counts.download(), ref.counts);
  expect_fp32_rule("scores", scores.download(), cpu.scores, ref.scores);
  expect_fp32_rule("weights", weights.download(), cpu.weights, ref.weights);
  const auto got_sums = sums.download();
  for (int64_t e = 0; e < c.E; ++e) EXPECT_NEAR(got_sums[e], ref.sums[e], 1e-4 * (1 + ref.sums[e])) << e;

  ASSERT_EQ(run_cuda(MoeRouteBackwardParams<bf16>{.rows = c.rows, .router = router, .scores = scores.data(),
                                                  .experts = experts.data(), .dweights = ddw.data(),
                                                  .dscore_per_expert = ddscore.data(), .dlogits = dlogits.data()}),
            Status::ok);
  expect_bf16_rule("dlogits", dlogits.download(), cpu.dlogits, ref.dlogits);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuMoeRoute, ::testing::ValuesIn(kCases));

// A lane scores 8 experts: 256 route on the GPU, 257 do not (host buffers
// stand in for device ones: supports() reads none).
TEST(GpuMoeRoute, MoreThan256ExpertsIsUnsupported) {
  std::vector<bf16> logits(257);
  std::vector<float> scores(257), weights(8);
  std::vector<int32_t> experts(8);
  std::vector<int64_t> counts(257);
  const auto with = [&](int64_t E) {
    return MoeRouteParams<bf16>{.rows = 1, .router = {E, 8}, .logits = logits.data(), .scores = scores.data(),
                                .experts = experts.data(), .weights = weights.data(), .counts = counts.data()};
  };
  EXPECT_TRUE(supports(with(256), Backend::cuda));
  EXPECT_FALSE(supports(with(257), Backend::cuda));
  EXPECT_EQ(launch(with(257), Workspace{}, make_cuda_stream(gpu_stream())), Status::unsupported);
}

struct GpuPermuteCase {
  int64_t rows, C, E, k, capacity;
  GateOn gate;
};

class GpuMoePermute : public ::testing::TestWithParam<GpuPermuteCase> {};

// Several 1,024-choice chunks; C off and on 8; capacity drops.
const std::vector<GpuPermuteCase> kPermuteCases = {
    {1500, 64, 8, 2, 0, GateOn::output},   {700, 37, 16, 3, 0, GateOn::input},
    {2100, 24, 6, 2, 500, GateOn::output}, {301, 128, 128, 8, 12, GateOn::input},
    {1, 5, 4, 4, 0, GateOn::output},
};

std::vector<int32_t> skewed_choices(const GpuPermuteCase& c, Rng& rng) {
  std::vector<int32_t> v(size_t(c.rows * c.k));
  for (int64_t t = 0; t < c.rows; ++t) {
    std::vector<int32_t> all(size_t(c.E));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t j = 0; j < c.k; ++j) {
      const int64_t pick = rng.index(3) == 0 ? 0 : rng.index(int64_t(all.size()));
      v[t * c.k + j] = all[size_t(pick)];
      all.erase(all.begin() + pick);
    }
  }
  return v;
}

// The CPU's four passes in Elem on the same inputs.
template <typename Elem>
struct CpuMove {
  std::vector<Elem> permuted, out, dx, dy;
  std::vector<Acc<Elem>> dw_in, dw_out;
  std::vector<int64_t> offsets, position;
  int64_t dropped = 0;
};

template <typename Elem>
CpuMove<Elem> cpu_move(const GpuPermuteCase& c, const std::vector<int32_t>& choices, const std::vector<Elem>& x,
                       const std::vector<Acc<Elem>>& w, const std::vector<Elem>& dout_rows,
                       const std::vector<Elem>& dout_permuted) {
  const int64_t n = c.rows * c.k;
  CpuMove<Elem> m;
  m.permuted.assign(size_t(n * c.C), Elem(0));
  m.out.resize(size_t(c.rows * c.C));
  m.dx.resize(size_t(c.rows * c.C));
  m.dy.assign(size_t(n * c.C), Elem(0));
  m.dw_in.resize(size_t(n));
  m.dw_out.resize(size_t(n));
  m.offsets.resize(size_t(c.E + 1));
  m.position.resize(size_t(n));
  status_check(run(MoePermuteParams<Elem>{.rows = c.rows, .C = c.C, .experts = c.E, .top_k = c.k,
                                          .capacity = c.capacity, .gate = c.gate, .expert_of = choices.data(),
                                          .weights = w.data(), .x = x.data(), .out = m.permuted.data(),
                                          .offsets = m.offsets.data(), .position = m.position.data(),
                                          .dropped = &m.dropped}),
               "cpu permute");
  status_check(run(MoeUnpermuteParams<Elem>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                            .position = m.position.data(), .weights = w.data(),
                                            .y = m.permuted.data(), .out = m.out.data()}),
               "cpu unpermute");
  status_check(run(MoeUnpermuteBackwardParams<Elem>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                    .position = m.position.data(), .weights = w.data(),
                                                    .y = m.permuted.data(), .dout = dout_rows.data(),
                                                    .dy = m.dy.data(), .dweights = m.dw_out.data()}),
               "cpu unpermute backward");
  status_check(run(MoePermuteBackwardParams<Elem>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                  .position = m.position.data(), .weights = w.data(),
                                                  .x = x.data(), .dout = dout_permuted.data(), .dx = m.dx.data(),
                                                  .dweights = m.dw_in.data()}),
               "cpu permute backward");
  return m;
}

TEST_P(GpuMoePermute, MatchesCpu) {
  const GpuPermuteCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.k;
  const auto choices = skewed_choices(c, rng);
  const Bf16Values x = random_bf16(rng, c.rows * c.C), dout_rows = random_bf16(rng, c.rows * c.C),
                   dout_permuted = random_bf16(rng, n * c.C);
  const auto w = rng.uniform<float>(n, 0.1, 1.0);
  const std::vector<double> wd(w.begin(), w.end());
  const auto ref = cpu_move<double>(c, choices, x.d, wd, dout_rows.d, dout_permuted.d);
  const auto cpu = cpu_move<float>(c, choices, x.f, w, dout_rows.f, dout_permuted.f);
  if (c.capacity > 0) {
    EXPECT_GT(ref.dropped, 0) << "the case was meant to drop";
  }

  DeviceArray<int32_t> dchoices(choices);
  DeviceArray<float> dw(w), dw_in(n), dw_out(n);
  DeviceArray<bf16> dx_in(x.bits), ddout_rows(dout_rows.bits), ddout_permuted(dout_permuted.bits),
      permuted(std::vector<bf16>(size_t(n * c.C))), out(c.rows * c.C), dx(c.rows * c.C),
      dy(std::vector<bf16>(size_t(n * c.C)));
  DeviceArray<int64_t> offsets(c.E + 1), position(n), dropped(std::vector<int64_t>{5});
  ASSERT_EQ(run_cuda(MoePermuteParams<bf16>{.rows = c.rows, .C = c.C, .experts = c.E, .top_k = c.k,
                                            .capacity = c.capacity, .gate = c.gate, .expert_of = dchoices.data(),
                                            .weights = dw.data(), .x = dx_in.data(), .out = permuted.data(),
                                            .offsets = offsets.data(), .position = position.data(),
                                            .dropped = dropped.data()}),
            Status::ok);
  EXPECT_EQ(offsets.download(), ref.offsets);
  EXPECT_EQ(position.download(), ref.position);
  EXPECT_EQ(dropped.download(), std::vector<int64_t>{5 + ref.dropped});
  // The copies are exact (bf16 rows), or one rounding of w * x.
  const auto cpu_permuted = cpu.permuted;
  expect_bf16_rule("permuted", permuted.download(), cpu_permuted, ref.permuted);
  ASSERT_EQ(run_cuda(MoeUnpermuteParams<bf16>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                              .position = position.data(), .weights = dw.data(),
                                              .y = permuted.data(), .out = out.data()}),
            Status::ok);
  expect_bf16_rule("out", out.download(), cpu.out, ref.out);
  ASSERT_EQ(run_cuda(MoeUnpermuteBackwardParams<bf16>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                      .position = position.data(), .weights = dw.data(),
                                                      .y = permuted.data(), .dout = ddout_rows.data(),
                                                      .dy = dy.data(), .dweights = dw_out.data()}),
            Status::ok);
  expect_bf16_rule("dy", dy.download(), cpu.dy, ref.dy);
  ASSERT_EQ(run_cuda(MoePermuteBackwardParams<bf16>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                    .position = position.data(), .weights = dw.data(),
                                                    .x = dx_in.data(), .dout = ddout_permuted.data(),
                                                    .dx = dx.data(), .dweights = dw_in.data()}),
            Status::ok);
  expect_bf16_rule("dx", dx.download(), cpu.dx, ref.dx);
  if (c.gate == GateOn::input) {
    expect_fp32_rule("dweights (gate on the input)", dw_in.download(), cpu.dw_in, ref.dw_in);
  } else {
    expect_fp32_rule("dweights (gate on the output)", dw_out.download(), cpu.dw_out, ref.dw_out);
  }
}

// The gate on the output applied in the experts: the permute lays the
// weights out in row order and its backward takes the rows' weight
// gradients back to the choices, exactly (copies), 0 for a dropped choice.
TEST_P(GpuMoePermute, RowWeights) {
  const GpuPermuteCase& c = GetParam();
  if (c.gate != GateOn::output) GTEST_SKIP() << "the gate is on the input";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.k;
  const auto choices = skewed_choices(c, rng);
  const Bf16Values x = random_bf16(rng, c.rows * c.C), dout = random_bf16(rng, n * c.C);
  const auto w = rng.uniform<float>(n, 0.1, 1.0), row_dw = rng.uniform<float>(n, -1.0, 1.0);
  DeviceArray<int32_t> dchoices(choices);
  DeviceArray<float> dw(w), row_w(std::vector<float>(size_t(n), -7.0f)), drow_dw(row_dw), dweights(n);
  DeviceArray<bf16> dx_in(x.bits), ddout(dout.bits), permuted(std::vector<bf16>(size_t(n * c.C))),
      dx(c.rows * c.C);
  DeviceArray<int64_t> offsets(c.E + 1), position(n);
  ASSERT_EQ(run_cuda(MoePermuteParams<bf16>{.rows = c.rows, .C = c.C, .experts = c.E, .top_k = c.k,
                                            .capacity = c.capacity, .gate = c.gate, .expert_of = dchoices.data(),
                                            .weights = dw.data(), .x = dx_in.data(), .out = permuted.data(),
                                            .offsets = offsets.data(), .position = position.data(),
                                            .row_weights = row_w.data()}),
            Status::ok);
  ASSERT_EQ(run_cuda(MoePermuteBackwardParams<bf16>{.rows = c.rows, .C = c.C, .top_k = c.k, .gate = c.gate,
                                                    .position = position.data(), .dout = ddout.data(),
                                                    .dx = dx.data(), .dweights = dweights.data(),
                                                    .row_dweights = drow_dw.data()}),
            Status::ok);
  const std::vector<int64_t> pos = position.download();
  const std::vector<float> got_rows = row_w.download(), got = dweights.download();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = pos[size_t(i)];
    EXPECT_EQ(got[size_t(i)], p >= 0 ? row_dw[size_t(p)] : 0.0f) << "dweights of choice " << i;
    if (p >= 0) {
      EXPECT_EQ(got_rows[size_t(p)], w[size_t(i)]) << "row weight of choice " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuMoePermute, ::testing::ValuesIn(kPermuteCases));

}  // namespace
}  // namespace weft::kernels::test
