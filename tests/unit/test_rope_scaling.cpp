// Llama 3's RoPE scaling: the inverse-frequency table against a reference
// written here from the rule's other reading (turns of a pair within the
// original context rather than its wavelength), each of the three regions
// hit, continuity at their edges, and the validation of the values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rope_scaling.h"
#include "test_util.h"

namespace weft {
namespace {

enum class Region { kept, interpolated, slowed };

struct Expected {
  double inv_freq;
  Region region;
};

// The pair's turns within the original context: L0 / wavelength.
Expected reference(int64_t i, int64_t D, double theta, double factor, double low, double high,
                   double original) {
  const double f = 1.0 / std::pow(theta, double(2 * i) / double(D));
  const double turns = original * f / (2.0 * M_PI);
  if (turns > high) return {f, Region::kept};
  if (turns < low) return {f / factor, Region::slowed};
  const double w = (turns - low) / (high - low);
  return {f * (w + (1.0 - w) / factor), Region::interpolated};
}

void expect_table(int64_t D, double theta, double factor, double low, double high, int64_t original,
                  int kept, int interpolated, int slowed) {
  const auto s = rope_scaling_llama3(factor, low, high, original);
  const auto table = rope_inv_freq(D, theta, s);
  const auto plain = rope_inv_freq(D, theta, RopeScaling{});
  ASSERT_EQ(table.size(), size_t(D / 2));
  int count[3] = {0, 0, 0};
  for (int64_t i = 0; i < D / 2; ++i) {
    const Expected e = reference(i, D, theta, factor, low, high, double(original));
    ++count[int(e.region)];
    EXPECT_NEAR(table[size_t(i)], e.inv_freq, 1e-15 * e.inv_freq) << "pair " << i;
    EXPECT_NEAR(plain[size_t(i)], std::pow(theta, -double(2 * i) / double(D)), 1e-15 * plain[size_t(i)]);
    if (e.region == Region::kept) {
      EXPECT_EQ(table[size_t(i)], plain[size_t(i)]) << "pair " << i;
    } else if (e.region == Region::slowed) {
      EXPECT_EQ(table[size_t(i)], plain[size_t(i)] / factor) << "pair " << i;
    } else {
      EXPECT_LT(table[size_t(i)], plain[size_t(i)]) << "pair " << i;
      EXPECT_GT(table[size_t(i)], plain[size_t(i)] / factor) << "pair " << i;
    }
  }
  EXPECT_EQ(count[int(Region::kept)], kept);
  EXPECT_EQ(count[int(Region::interpolated)], interpolated);
  EXPECT_EQ(count[int(Region::slowed)], slowed);
}

TEST(RopeScaling, InvFreqTableMatchesTheReferenceInEveryRegion) {
  // The kernels' unit-test case: wavelengths 6.3, 20, 63 | 199, 628 | 1987, 6283, 19869.
  expect_table(16, 1e4, 8.0, 1.0, 8.0, 1024, 3, 2, 3);
  // Llama 3.1 8B / 70B (D = 128, theta 5e5, factor 8, 1, 4, 8192).
  expect_table(128, 5e5, 8.0, 1.0, 4.0, 8192, 29, 6, 29);
  // Llama 3.2 1B (D = 64): factor 32.
  expect_table(64, 5e5, 32.0, 1.0, 4.0, 8192, 15, 3, 14);
}

TEST(RopeScaling, PlainRopeIsUntouchedAndTheRuleIsContinuous) {
  const RopeScaling none;
  EXPECT_FALSE(none.enabled());
  EXPECT_EQ(rope_scaled_inv_freq(0.125, none), 0.125);
  const auto s = rope_scaling_llama3(8.0, 1.0, 4.0, 8192);
  // At wavelength L0 / high the pair is kept, at L0 / low it is slowed, from
  // both sides.
  const double at_high = 2 * M_PI / (8192.0 / 4.0), at_low = 2 * M_PI / 8192.0;
  for (double eps : {0.0, 1e-12, -1e-12}) {
    const double f = at_high * (1 + eps), g = at_low * (1 + eps);
    EXPECT_NEAR(rope_scaled_inv_freq(f, s), f, 1e-10 * f) << eps;
    EXPECT_NEAR(rope_scaled_inv_freq(g, s), g / 8.0, 1e-10 * g) << eps;
  }
  // Monotone: a faster pair never ends up slower.
  double previous = 0;
  for (double f = 1e-7; f < 1; f *= 1.01) {
    const double scaled = rope_scaled_inv_freq(f, s);
    EXPECT_GT(scaled, previous);
    previous = scaled;
  }
}

TEST(RopeScaling, ProblemsNameTheFieldAndTheRange) {
  EXPECT_TRUE(rope_scaling_problems(RopeScaling{}).empty());
  EXPECT_TRUE(rope_scaling_problems(rope_scaling_llama3(1.0, 1.0, 4.0, 8192)).empty());
  const auto one = [](const RopeScaling& s) {
    const auto p = rope_scaling_problems(s);
    EXPECT_EQ(p.size(), 1u);
    return p.empty() ? std::string() : p[0];
  };
  EXPECT_NE(one(rope_scaling_llama3(0.5, 1.0, 4.0, 8192)).find("rope_scaling.factor=0.5 must be a finite number >= 1"),
            std::string::npos);
  EXPECT_NE(one(rope_scaling_llama3(NAN, 1.0, 4.0, 8192)).find("factor=nan"), std::string::npos);
  EXPECT_NE(one(rope_scaling_llama3(INFINITY, 1.0, 4.0, 8192)).find("factor=inf"), std::string::npos);
  EXPECT_NE(one(rope_scaling_llama3(8.0, 4.0, 4.0, 8192)).find("low_freq_factor=4 must be less than high_freq_factor=4"),
            std::string::npos);
  EXPECT_NE(one(rope_scaling_llama3(8.0, 0.0, 4.0, 8192)).find("low_freq_factor=0 must be a finite number > 0"),
            std::string::npos);
  EXPECT_NE(one(rope_scaling_llama3(8.0, 1.0, NAN, 8192)).find("high_freq_factor=nan"), std::string::npos);
  EXPECT_NE(one(rope_scaling_llama3(8.0, 1.0, 4.0, 0)).find("original_max_position_embeddings=0 must be positive"),
            std::string::npos);
  EXPECT_EQ(rope_scaling_problems(rope_scaling_llama3(0.0, 5.0, 4.0, -1)).size(), 3u);
  EXPECT_NE(rope_scaling_problems(rope_scaling_llama3(0.0, 1.0, 4.0, 1), "rope_parameters")[0].find(
                "rope_parameters.factor"),
            std::string::npos);
}

}  // namespace
}  // namespace weft
