// elementwise and reduce against fp64 references; the sum of squares for
// thread-count independence. These ops are linear (their backwards are the
// same ops: add passes dout to both inputs, scale scales it), so they have no
// separate backward kernels to check by finite differences.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/elementwise_fp32_cuda.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

class ElementwiseTest : public ::testing::TestWithParam<ElementwiseCase> {};

TEST_P(ElementwiseTest, MatchFp64Reference) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto a = rng.uniform<float>(n), b = rng.uniform<float>(n);
  const double alpha = -0.37;
  std::vector<double> ref_add(n), ref_scale(n), ref_axpy(n);
  std::vector<float> naive_add(n), naive_scale(n), naive_axpy(n);
  for (int64_t i = 0; i < n; ++i) {
    ref_add[i] = double(a[i]) + double(b[i]);
    naive_add[i] = a[i] + b[i];
    ref_scale[i] = alpha * double(a[i]);
    naive_scale[i] = float(alpha) * a[i];
    ref_axpy[i] = double(b[i]) + alpha * double(a[i]);
    naive_axpy[i] = b[i] + float(alpha) * a[i];
  }
  std::vector<float> sum(n), scaled = a, y = b;
  ASSERT_EQ(run(AddParams<float>{.n = n, .a = a.data(), .b = b.data(), .out = sum.data()}), Status::ok);
  ASSERT_EQ(run(ScaleParams<float>{.n = n, .alpha = alpha, .x = scaled.data(), .out = scaled.data()}),
            Status::ok);
  ASSERT_EQ(run(AxpyParams<float>{.n = n, .alpha = alpha, .x = a.data(), .y = y.data()}), Status::ok);
  expect_within_rule("add", sum, naive_add, ref_add);
  expect_within_rule("scale (in place)", scaled, naive_scale, ref_scale);
  expect_within_rule("axpy", y, naive_axpy, ref_axpy);

  std::vector<float> filled = a;
  ASSERT_EQ(run(FillParams<float>{.n = n, .x = filled.data()}), Status::ok);
  EXPECT_EQ(filled, std::vector<float>(n, 0.0f));
}

// Summed in double, the result of n squares of floats is exact to ~n * 1e-16
// relative: 1e-12 bounds it for every case here with room to spare.
TEST_P(ElementwiseTest, SumSquaresAccumulatesInDouble) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto x = rng.uniform<float>(n);
  double ref = 0.5;  // what an earlier tensor contributed
  for (float v : x) ref += double(v) * double(v);
  double sum = 0.5;
  ASSERT_EQ(run(SumSquaresParams<float>{.n = n, .x = x.data(), .sum = &sum}), Status::ok);
  EXPECT_NEAR(sum, ref, 1e-12 * ref);
}

INSTANTIATE_TEST_SUITE_P(Cases, ElementwiseTest, ::testing::ValuesIn(elementwise_cases()), CaseName{});

TEST(SumSquares, BitIdenticalForAnyThreadCount) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto x = rng.uniform<float>(5 * kSumChunk + 113);
  const int saved = omp_get_max_threads();
  std::vector<double> sums;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    double s = 0;
    ASSERT_EQ(run(SumSquaresParams<float>{.n = int64_t(x.size()), .x = x.data(), .sum = &s}), Status::ok);
    sums.push_back(s);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(sums[0], sums[2]);
}

TEST(SumSquares, NonFiniteValuesPropagate) {
  std::vector<float> x = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
  double s = 0;
  ASSERT_EQ(run(SumSquaresParams<float>{.n = 3, .x = x.data(), .sum = &s}), Status::ok);
  EXPECT_TRUE(std::isinf(s)) << "a non-finite gradient norm must be visible to the trainer";
}

TEST(ElementwiseArgs, RejectsImpossibleParams) {
  std::vector<float> a(4), b(4);
  EXPECT_EQ(run(AddParams<float>{.n = -1, .a = a.data(), .b = b.data(), .out = a.data()}),
            Status::invalid_argument);
  EXPECT_EQ(run(AddParams<float>{.n = 4, .a = a.data(), .b = nullptr, .out = a.data()}),
            Status::invalid_argument);
  EXPECT_EQ(run(AddParams<float>{.n = 0}), Status::ok) << "empty tensors need no storage";
  EXPECT_EQ(run(AxpyParams<float>{.n = 4, .x = a.data(), .y = nullptr}), Status::invalid_argument);
  EXPECT_EQ(run(FillParams<float>{.n = 4, .x = nullptr}), Status::invalid_argument);
  const SumSquaresParams<float> ss{.n = 4, .x = a.data(), .sum = nullptr};
  EXPECT_FALSE(supports(ss));
  double s = 0;
  const SumSquaresParams<float> ok{.n = 4, .x = a.data(), .sum = &s};
  EXPECT_GE(workspace_bytes(ok), int64_t{8}) << "one partial sum per chunk";
  EXPECT_EQ(launch(ok, {}, {}), Status::invalid_argument) << "no workspace";
  // fp32 sums of squares also run on CUDA (the main gradients of bf16
  // training): there the missing workspace is the answer; without CUDA the backend is.
  EXPECT_EQ(launch(ok, {}, Stream{Backend::cuda, nullptr}),
            fp32_cuda::available() ? Status::invalid_argument : Status::unsupported);
  const AddParams<float> add{.n = 4, .a = a.data(), .b = a.data(), .out = a.data()};
  EXPECT_EQ(launch(add, {}, Stream{Backend::cuda, nullptr}), Status::unsupported) << "fp32 add is CPU only";
}

}  // namespace
}  // namespace weft::kernels::test
