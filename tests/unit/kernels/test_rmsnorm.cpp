// rmsnorm: fused, fused with residual add, and unfused, against an fp64
// reference and finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/rmsnorm/rmsnorm.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

// Straight from the definition, y = w * x / sqrt(mean(x^2) + eps); run in
// double it is the reference, in float the naive fp32 implementation.
template <typename R>
void reference_forward(const NormCase& c, const std::vector<R>& x, const std::vector<R>& w,
                       std::vector<R>& y, std::vector<R>& rstd) {
  y.assign(x.size(), R(0));
  rstd.assign(c.rows, R(0));
  for (int64_t r = 0; r < c.rows; ++r) {
    R ms = 0;
    for (int64_t i = 0; i < c.C; ++i) ms += x[r * c.C + i] * x[r * c.C + i];
    rstd[r] = R(1) / std::sqrt(ms / R(c.C) + R(c.eps));
    for (int64_t i = 0; i < c.C; ++i) y[r * c.C + i] = w[i] * x[r * c.C + i] * rstd[r];
  }
}

// dx_i = rstd * (g_i - x_hat_i * mean_j(g_j * x_hat_j)) with g = dy * w;
// dw_i = sum over rows of dy_i * x_hat_i, added to dw.
template <typename R>
void reference_backward(const NormCase& c, const std::vector<R>& x, const std::vector<R>& w,
                        const std::vector<R>& dy, std::vector<R>& dx, std::vector<R>& dw) {
  dx.assign(x.size(), R(0));
  for (int64_t r = 0; r < c.rows; ++r) {
    R ms = 0;
    for (int64_t i = 0; i < c.C; ++i) ms += x[r * c.C + i] * x[r * c.C + i];
    const R rs = R(1) / std::sqrt(ms / R(c.C) + R(c.eps));
    R mean_gx = 0;
    for (int64_t i = 0; i < c.C; ++i) mean_gx += dy[r * c.C + i] * w[i] * x[r * c.C + i] * rs;
    mean_gx /= R(c.C);
    for (int64_t i = 0; i < c.C; ++i) {
      const R x_hat = x[r * c.C + i] * rs;
      dx[r * c.C + i] = rs * (dy[r * c.C + i] * w[i] - x_hat * mean_gx);
      dw[i] += dy[r * c.C + i] * x_hat;
    }
  }
}

class RmsnormTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsnormTest, FusedMatchesFp64Reference) {
  const NormCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.C;
  auto x = rng.uniform<float>(n), w = rng.uniform<float>(c.C, 0.5, 1.5);
  auto dy = rng.uniform<float>(n), dw = rng.uniform<float>(c.C);
  const auto dw_start = dw;

  std::vector<float> y(n), dx(n), rstd(c.rows);
  ASSERT_EQ(run(RmsnormForwardParams<float>{.rows = c.rows, .C = c.C, .eps = c.eps, .x = x.data(),
                                           .weight = w.data(), .y = y.data(), .rstd = rstd.data()}),
            Status::ok);
  ASSERT_EQ(run(RmsnormBackwardParams<float>{.rows = c.rows, .C = c.C, .x = x.data(),
                                            .weight = w.data(), .rstd = rstd.data(),
                                            .dy = dy.data(), .dx = dx.data(), .dweight = dw.data()}),
            Status::ok);

  std::vector<double> ref_y, ref_rstd, ref_dx, ref_dw = cast<double>(dw_start);
  reference_forward(c, cast<double>(x), cast<double>(w), ref_y, ref_rstd);
  reference_backward(c, cast<double>(x), cast<double>(w), cast<double>(dy), ref_dx, ref_dw);
  std::vector<float> naive_y, naive_rstd, naive_dx, naive_dw = dw_start;
  reference_forward(c, x, w, naive_y, naive_rstd);
  reference_backward(c, x, w, dy, naive_dx, naive_dw);

  expect_within_rule("y", y, naive_y, ref_y);
  expect_within_rule("rstd", rstd, naive_rstd, ref_rstd);
  expect_within_rule("dx", dx, naive_dx, ref_dx);
  expect_within_rule("dweight (accumulated)", dw, naive_dw, ref_dw);
}

TEST_P(RmsnormTest, FusedResidualAddMatchesFp64Reference) {
  const NormCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.C;
  auto x = rng.uniform<float>(n), res = rng.uniform<float>(n);
  auto w = rng.uniform<float>(c.C, 0.5, 1.5);
  std::vector<float> y(n), rstd(c.rows);
  // The sum overwrites the residual stream in place, as the trainer runs it.
  std::vector<float> stream = res;
  ASSERT_EQ(run(RmsnormForwardParams<float>{.rows = c.rows, .C = c.C, .eps = c.eps, .x = x.data(),
                                           .residual = stream.data(), .sum = stream.data(),
                                           .weight = w.data(), .y = y.data(),
                                           .rstd = rstd.data()}),
            Status::ok);
  std::vector<double> ref_sum(n);
  std::vector<float> naive_sum(n);
  for (int64_t i = 0; i < n; ++i) {
    ref_sum[i] = double(x[i]) + double(res[i]);
    naive_sum[i] = x[i] + res[i];
  }
  std::vector<double> ref_y, ref_rstd;
  std::vector<float> naive_y, naive_rstd;
  reference_forward(c, ref_sum, cast<double>(w), ref_y, ref_rstd);
  reference_forward(c, naive_sum, w, naive_y, naive_rstd);
  expect_within_rule("sum", stream, naive_sum, ref_sum);
  expect_within_rule("y", y, naive_y, ref_y);
  expect_within_rule("rstd", rstd, naive_rstd, ref_rstd);
}

TEST_P(RmsnormTest, UnfusedMatchesFp64ReferenceAndKeepsXHat) {
  const NormCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.C;
  auto x = rng.uniform<float>(n), w = rng.uniform<float>(c.C, 0.5, 1.5);
  auto dy = rng.uniform<float>(n), dw = rng.uniform<float>(c.C);
  const auto dw_start = dw;
  std::vector<float> y(n), dx(n), rstd(c.rows), x_hat(n);
  ASSERT_EQ(run(RmsnormUnfusedForwardParams<float>{.rows = c.rows, .C = c.C, .eps = c.eps,
                                                  .x = x.data(), .weight = w.data(), .y = y.data(),
                                                  .rstd = rstd.data(), .x_hat = x_hat.data()}),
            Status::ok);
  ASSERT_EQ(run(RmsnormUnfusedBackwardParams<float>{
                .rows = c.rows, .C = c.C, .x_hat = x_hat.data(), .rstd = rstd.data(),
                .weight = w.data(), .dy = dy.data(), .dx = dx.data(), .dweight = dw.data()}),
            Status::ok);
  std::vector<double> ref_y, ref_rstd, ref_dx, ref_dw = cast<double>(dw_start);
  reference_forward(c, cast<double>(x), cast<double>(w), ref_y, ref_rstd);
  reference_backward(c, cast<double>(x), cast<double>(w), cast<double>(dy), ref_dx, ref_dw);
  std::vector<float> naive_y, naive_rstd, naive_dx, naive_dw = dw_start;
  reference_forward(c, x, w, naive_y, naive_rstd);
  reference_backward(c, x, w, dy, naive_dx, naive_dw);
  std::vector<double> ref_x_hat(n);
  std::vector<float> naive_x_hat(n);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.C; ++i) {
      ref_x_hat[r * c.C + i] = double(x[r * c.C + i]) * ref_rstd[r];
      naive_x_hat[r * c.C + i] = x[r * c.C + i] * naive_rstd[r];
    }
  expect_within_rule("y", y, naive_y, ref_y);
  expect_within_rule("x_hat", x_hat, naive_x_hat, ref_x_hat);
  expect_within_rule("dx", dx, naive_dx, ref_dx);
  expect_within_rule("dweight (accumulated)", dw, naive_dw, ref_dw);
}

// Fused forms, in double: L = <r_y, y> + <r_s, x + residual>. The backward
// accumulates the norm's dx into r_s, the residual stream's own gradient,
// which is then the gradient of both x and residual.
TEST_P(RmsnormTest, FusedGradientsMatchFiniteDifferences) {
  const NormCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.C;
  auto x = rng.uniform<double>(n), res = rng.uniform<double>(n);
  auto w = rng.uniform<double>(c.C, 0.5, 1.5);
  const auto r_y = rng.uniform<double>(n), r_s = rng.uniform<double>(n);
  std::vector<double> y(n), sum(n), rstd(c.rows);
  auto forward = [&] {
    run_or_throw(RmsnormForwardParams<double>{.rows = c.rows, .C = c.C, .eps = c.eps,
                                              .x = x.data(), .residual = res.data(),
                                              .sum = sum.data(), .weight = w.data(),
                                              .y = y.data(), .rstd = rstd.data()});
  };
  auto loss = [&] {
    forward();
    return dot(r_y, y) + dot(r_s, sum);
  };
  forward();
  std::vector<double> d_stream = r_s, dw(c.C, 0.0);
  ASSERT_EQ(run(RmsnormBackwardParams<double>{.rows = c.rows, .C = c.C, .x = sum.data(),
                                             .weight = w.data(), .rstd = rstd.data(),
                                             .dy = r_y.data(), .dx = d_stream.data(),
                                             .dx_write = Write::accumulate, .dweight = dw.data()}),
            Status::ok);
  EXPECT_LE(fd_error(x, d_stream, loss, rng), kFdTolerance) << "dx";
  EXPECT_LE(fd_error(res, d_stream, loss, rng), kFdTolerance) << "dresidual";
  EXPECT_LE(fd_error(w, dw, loss, rng), kFdTolerance) << "dweight";
}

TEST_P(RmsnormTest, UnfusedGradientsMatchFiniteDifferences) {
  const NormCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.C;
  auto x = rng.uniform<double>(n), w = rng.uniform<double>(c.C, 0.5, 1.5);
  const auto r_y = rng.uniform<double>(n);
  std::vector<double> y(n), rstd(c.rows), x_hat(n);
  auto loss = [&] {
    run_or_throw(RmsnormUnfusedForwardParams<double>{.rows = c.rows, .C = c.C, .eps = c.eps,
                                                     .x = x.data(), .weight = w.data(),
                                                     .y = y.data(), .rstd = rstd.data(),
                                                     .x_hat = x_hat.data()});
    return dot(r_y, y);
  };
  loss();
  std::vector<double> dx(n), dw(c.C, 0.0);
  ASSERT_EQ(run(RmsnormUnfusedBackwardParams<double>{
                .rows = c.rows, .C = c.C, .x_hat = x_hat.data(), .rstd = rstd.data(),
                .weight = w.data(), .dy = r_y.data(), .dx = dx.data(), .dweight = dw.data()}),
            Status::ok);
  EXPECT_LE(fd_error(x, dx, loss, rng), kFdTolerance) << "dx";
  EXPECT_LE(fd_error(w, dw, loss, rng), kFdTolerance) << "dweight";
}

// dweight sums over rows in column blocks; the kernel promises the same bits
// on any number of threads.
TEST_P(RmsnormTest, ResultsDoNotDependOnThreadCount) {
  const NormCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t n = c.rows * c.C;
  const auto x = rng.uniform<float>(n), w = rng.uniform<float>(c.C, 0.5, 1.5);
  const auto dy = rng.uniform<float>(n);
  auto fused = [&] {
    std::vector<float> y(n), dx(n), rstd(c.rows), dw(c.C, 0.0f);
    run_or_throw(RmsnormForwardParams<float>{.rows = c.rows, .C = c.C, .eps = c.eps, .x = x.data(),
                                             .weight = w.data(), .y = y.data(), .rstd = rstd.data()});
    run_or_throw(RmsnormBackwardParams<float>{.rows = c.rows, .C = c.C, .x = x.data(),
                                              .weight = w.data(), .rstd = rstd.data(),
                                              .dy = dy.data(), .dx = dx.data(), .dweight = dw.data()});
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  EXPECT_EQ(with_threads(1, fused), with_threads(3, fused));
}

INSTANTIATE_TEST_SUITE_P(Cases, RmsnormTest, ::testing::ValuesIn(norm_cases()), CaseName{});

TEST(RmsnormArgs, RejectsImpossibleParams) {
  std::vector<float> x(12), w(4), y(12), rstd(3);
  RmsnormForwardParams<float> ok{.rows = 3, .C = 4, .eps = 1e-6, .x = x.data(), .weight = w.data(),
                                 .y = y.data(), .rstd = rstd.data()};
  EXPECT_TRUE(supports(ok));
  EXPECT_FALSE(supports(ok, Backend::cuda)) << "no CUDA backend in this build";
  EXPECT_EQ(launch(ok, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);

  auto bad = ok;
  bad.C = 0;
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.rows = -1;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.rstd = nullptr;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.residual = x.data();  // a residual without somewhere to write the sum
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.eps = -1;
  EXPECT_EQ(run(bad), Status::invalid_argument);

  // The unfused backward needs its workspace.
  std::vector<float> dx(12), dw(4);
  RmsnormUnfusedBackwardParams<float> ub{.rows = 3, .C = 4, .x_hat = x.data(), .rstd = rstd.data(),
                                         .weight = w.data(), .dy = y.data(), .dx = dx.data(),
                                         .dweight = dw.data()};
  EXPECT_GE(workspace_bytes(ub), int64_t{(3 * 4 + 3) * 4}) << "g (rows, C) and mean(g * x_hat) (rows)";
  EXPECT_EQ(launch(ub, {}, {}), Status::invalid_argument);
  EXPECT_EQ(run(ub), Status::ok);
}

}  // namespace
}  // namespace weft::kernels::test
