// swiglu against an fp64 reference and finite differences, in place too.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/swiglu/swiglu.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

// act = g / (1 + e^-g) * u, and its derivatives worked out by hand:
// d silu / dg = s + g s (1 - s) with s the sigmoid.
template <typename R>
void reference(const std::vector<R>& g, const std::vector<R>& u, const std::vector<R>& da,
               std::vector<R>& act, std::vector<R>& dg, std::vector<R>& du) {
  act.resize(g.size());
  dg.resize(g.size());
  du.resize(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const R s = R(1) / (R(1) + std::exp(-g[i]));
    act[i] = g[i] * s * u[i];
    du[i] = da[i] * g[i] * s;
    dg[i] = da[i] * u[i] * (s + g[i] * s * (R(1) - s));
  }
}

class SwigluTest : public ::testing::TestWithParam<SwigluCase> {};

TEST_P(SwigluTest, MatchesFp64Reference) {
  const SwigluCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.F;
  // Gate pre-activations across silu's curved part and both tails.
  auto g = rng.uniform<float>(n, -6, 6), u = rng.uniform<float>(n), da = rng.uniform<float>(n);
  std::vector<double> ref_act, ref_dg, ref_du;
  std::vector<float> naive_act, naive_dg, naive_du;
  reference(cast<double>(g), cast<double>(u), cast<double>(da), ref_act, ref_dg, ref_du);
  reference(g, u, da, naive_act, naive_dg, naive_du);
  std::vector<float> act(n);
  ASSERT_EQ(run(SwigluForwardParams<float>{.rows = c.rows, .F = c.F, .gate = g.data(),
                                          .up = u.data(), .act = act.data()}),
            Status::ok);
  // The backward overwrites gate and up with their gradients, in place.
  ASSERT_EQ(run(SwigluBackwardParams<float>{.rows = c.rows, .F = c.F, .gate = g.data(),
                                           .up = u.data(), .dact = da.data(), .dgate = g.data(),
                                           .dup = u.data()}),
            Status::ok);
  expect_within_rule("act", act, naive_act, ref_act);
  expect_within_rule("dgate", g, naive_dg, ref_dg);
  expect_within_rule("dup", u, naive_du, ref_du);
}

// Both forms: without a row scale, and with one (its gradient checked too).
TEST_P(SwigluTest, GradientsMatchFiniteDifferences) {
  const SwigluCase& c = GetParam();
  for (const bool scaled : {false, true}) {
    Rng rng;
    SCOPED_TRACE(rng.trace() + (scaled ? ", with a row scale" : ""));
    const int64_t n = c.rows * c.F;
    auto g = rng.uniform<double>(n, -6, 6), u = rng.uniform<double>(n), w = rng.uniform<double>(c.rows, 0.05, 1);
    const auto r = rng.uniform<double>(n);
    std::vector<double> act(n), dg(n), du(n), dw(size_t(c.rows));
    const double* scale = scaled ? w.data() : nullptr;
    auto loss = [&] {
      run_or_throw(SwigluForwardParams<double>{.rows = c.rows, .F = c.F, .gate = g.data(), .up = u.data(),
                                               .act = act.data(), .row_scale = scale});
      return dot(r, act);
    };
    ASSERT_EQ(run(SwigluBackwardParams<double>{.rows = c.rows, .F = c.F, .gate = g.data(), .up = u.data(),
                                              .dact = r.data(), .dgate = dg.data(), .dup = du.data(),
                                              .row_scale = scale, .drow_scale = scaled ? dw.data() : nullptr}),
              Status::ok);
    EXPECT_LE(fd_error(g, dg, loss, rng), kFdTolerance) << "dgate";
    EXPECT_LE(fd_error(u, du, loss, rng), kFdTolerance) << "dup";
    if (scaled) {
      EXPECT_LE(fd_error(w, dw, loss, rng), kFdTolerance) << "dw";
    }
  }
}

// With a row scale (an MoE expert's rows, each scaled by its combine
// weight): act = w_r silu(g) u, and the backward's dw_r = sum_f dact silu(g) u.
TEST_P(SwigluTest, RowScaleMatchesFp64Reference) {
  const SwigluCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.F;
  auto g = rng.uniform<float>(n, -6, 6), u = rng.uniform<float>(n), da = rng.uniform<float>(n);
  const auto w = rng.uniform<float>(c.rows, 0.05, 1);
  std::vector<double> act64, dg64, du64;
  std::vector<float> act32, dg32, du32;
  reference(cast<double>(g), cast<double>(u), cast<double>(da), act64, dg64, du64);
  reference(g, u, da, act32, dg32, du32);
  std::vector<double> dw64(size_t(c.rows), 0.0);
  std::vector<float> dw32(size_t(c.rows), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / c.F;
    dw64[size_t(r)] += double(da[size_t(i)]) * act64[size_t(i)];
    dw32[size_t(r)] += da[size_t(i)] * act32[size_t(i)];
    act64[size_t(i)] *= w[size_t(r)], dg64[size_t(i)] *= w[size_t(r)], du64[size_t(i)] *= w[size_t(r)];
    act32[size_t(i)] *= w[size_t(r)], dg32[size_t(i)] *= w[size_t(r)], du32[size_t(i)] *= w[size_t(r)];
  }
  std::vector<float> act(n), dw(size_t(c.rows), -1.0f);
  ASSERT_EQ(run(SwigluForwardParams<float>{.rows = c.rows, .F = c.F, .gate = g.data(), .up = u.data(),
                                          .act = act.data(), .row_scale = w.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluBackwardParams<float>{.rows = c.rows, .F = c.F, .gate = g.data(), .up = u.data(),
                                           .dact = da.data(), .dgate = g.data(), .dup = u.data(),
                                           .row_scale = w.data(), .drow_scale = dw.data()}),
            Status::ok);
  expect_within_rule("act", act, act32, act64);
  expect_within_rule("dgate", g, dg32, dg64);
  expect_within_rule("dup", u, du32, du64);
  expect_within_rule("dw", dw, dw32, dw64);
}

INSTANTIATE_TEST_SUITE_P(Cases, SwigluTest, ::testing::ValuesIn(swiglu_cases()), CaseName{});

TEST(SwigluArgs, RejectsImpossibleParams) {
  std::vector<float> g(6), u(6), a(6);
  const SwigluForwardParams<float> ok{.rows = 2, .F = 3, .gate = g.data(), .up = u.data(),
                                      .act = a.data()};
  EXPECT_TRUE(supports(ok));
  EXPECT_EQ(workspace_bytes(ok), 0);
  auto bad = ok;
  bad.F = -3;
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.up = nullptr;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  SwigluBackwardParams<float> bwd{.rows = 2, .F = 3, .gate = g.data(), .up = u.data(),
                                  .dact = a.data(), .dgate = g.data(), .dup = nullptr};
  EXPECT_EQ(run(bwd), Status::invalid_argument);
  std::vector<float> dw(2);
  bwd.dup = u.data();
  bwd.drow_scale = dw.data();  // a row scale's gradient without the scale
  EXPECT_EQ(run(bwd), Status::invalid_argument);
  EXPECT_EQ(launch(ok, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);
}

}  // namespace
}  // namespace weft::kernels::test
