// The CPU kernels' vectorizable e^x and sigmoid (kernels/cpu_math.h) against
// fp64 std::exp: over a sweep of every float exponent and fresh random
// arguments, and at the edges (the underflow cut, zeros, infinities, NaN).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu_math.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace weft::kernels::test {
namespace {

using cpu::exp_fast;
using cpu::sigmoid_fast;

// The rule: within 4 units in the last place of fp32 (2^-21 relative) of the
// fp64 value, which is what a correctly rounded fp32 result (0.5 ulp) plus
// the Horner steps' roundings can reach; and, where the fp64 value is below
// e^-87 (1.6e-38, just above fp32's smallest normal), an absolute error
// under e^-87: the fast forms flush arguments below -87 to zero.
constexpr double kRelative = 4.0 * 0x1.0p-23;
const double kTiny = std::exp(-87.0);

::testing::AssertionResult close(double got, double want, float x) {
  const double err = std::abs(got - want);
  if (want < kTiny ? err < kTiny : err <= kRelative * want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "at x = " << x << " (bits " << std::bit_cast<uint32_t>(x) << "): got " << got
                                       << ", fp64 " << want << ", relative error " << err / want;
}

// Arguments from every binade that matters: the float bit patterns of
// [-88, 0] (exp) and [-100, 100] (sigmoid) in steps of 2^13 patterns, whose
// low bits also vary.
template <typename F>
int64_t sweep(float lo, float hi, F&& check) {
  int64_t n = 0;
  for (uint32_t b = 0; b < 0x7f800000u; b += 8191) {
    for (const float x : {std::bit_cast<float>(b), -std::bit_cast<float>(b)}) {
      if (!(x >= lo && x <= hi)) continue;
      check(x);
      ++n;
    }
  }
  return n;
}

TEST(CpuMath, ExpWithinFourUlpOverTheNonPositiveRange) {
  int64_t failures = 0;
  const int64_t n = sweep(-88.0f, 0.0f, [&](float x) {
    if (failures < 5 && !close(exp_fast(x), std::exp(double(x)), x)) {
      ++failures;
      ADD_FAILURE() << close(exp_fast(x), std::exp(double(x)), x).message();
    }
  });
  EXPECT_GT(n, 100000);
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const float x : rng.uniform<float>(100000, -90, 0)) ASSERT_TRUE(close(exp_fast(x), std::exp(double(x)), x));
  // Softmax arguments a little above 0 (rounding of x - max), and up to the
  // stated limit.
  for (const float x : rng.uniform<float>(10000, 0, 88)) ASSERT_TRUE(close(exp_fast(x), std::exp(double(x)), x));
}

TEST(CpuMath, ExpEdges) {
  EXPECT_EQ(exp_fast(0.0f), 1.0f);
  EXPECT_EQ(exp_fast(-0.0f), 1.0f);
  EXPECT_EQ(exp_fast(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_fast(-1e30f), 0.0f);
  EXPECT_EQ(exp_fast(-87.5f), 0.0f);  // below the cut: flushed
  EXPECT_GT(exp_fast(-86.9f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_fast(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp_fast(-std::numeric_limits<float>::quiet_NaN())));
}

double sigmoid64(float x) { return 1.0 / (1.0 + std::exp(-double(x))); }

TEST(CpuMath, SigmoidWithinFourUlpAcrossBothTails) {
  int64_t failures = 0;
  const int64_t n = sweep(-100.0f, 100.0f, [&](float x) {
    if (failures < 5 && !close(sigmoid_fast(x), sigmoid64(x), x)) {
      ++failures;
      ADD_FAILURE() << close(sigmoid_fast(x), sigmoid64(x), x).message();
    }
  });
  EXPECT_GT(n, 200000);
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const float x : rng.uniform<float>(100000, -30, 30)) ASSERT_TRUE(close(sigmoid_fast(x), sigmoid64(x), x));
}

TEST(CpuMath, SigmoidEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sigmoid_fast(0.0f), 0.5f);
  EXPECT_EQ(sigmoid_fast(-0.0f), 0.5f);
  EXPECT_EQ(sigmoid_fast(inf), 1.0f);
  EXPECT_EQ(sigmoid_fast(1e30f), 1.0f);
  EXPECT_EQ(sigmoid_fast(-inf), 0.0f);
  EXPECT_EQ(sigmoid_fast(-1e30f), 0.0f);
  EXPECT_TRUE(std::isnan(sigmoid_fast(std::numeric_limits<float>::quiet_NaN())));
  // The two branches meet: sigmoid(x) + sigmoid(-x) = 1 within rounding.
  for (const float x : {1e-6f, 0.3f, 2.0f, 15.0f})
    EXPECT_NEAR(double(sigmoid_fast(x)) + double(sigmoid_fast(-x)), 1.0, 2 * kRelative) << x;
}

// The accumulator-typed forms the kernels call: fp32 takes the fast form,
// fp64 the library's.
TEST(CpuMath, DoubleTakesTheLibraryForms) {
  EXPECT_EQ(cpu::exp_nonpositive(-1.25), std::exp(-1.25));
  EXPECT_EQ(cpu::sigmoid(-3.5), 1.0 / (1.0 + std::exp(3.5)));
  EXPECT_EQ(cpu::exp_nonpositive(-1.25f), exp_fast(-1.25f));
  EXPECT_EQ(cpu::sigmoid(-3.5f), sigmoid_fast(-3.5f));
}

}  // namespace
}  // namespace weft::kernels::test
