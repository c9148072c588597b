#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "test_util.h"
#include "tuner/calibrate.h"
#include "tuner/space.h"

namespace weft::tuner {
namespace {

// The tiny model on 4 CPU ranks, two per node so that some groups cross
// nodes; inputs are drawn fresh each run and the seed is printed on failure
// (WEFT_TEST_SEED=<seed> replays it).
struct Calibrate : ::testing::Test {
  ModelSpec m = model_preset("tiny");
  RunSpec run{256, 16, Precision::fp32};
  ClusterSpec c{device_preset("cpu"), 4, 2};
  CostConstants start = cost_defaults(c.device);
  uint32_t seed = initial_seed();
  std::mt19937 rng{seed};

  static uint32_t initial_seed() {
    if (const char* s = std::getenv("WEFT_TEST_SEED")) return uint32_t(std::strtoul(s, nullptr, 10));
    return std::random_device{}();
  }
  // Every layout of the space that fits in memory, shuffled.
  std::vector<Layout> fitting_layouts() {
    const auto report = evaluate(m, run, c, enumerate(m, run, c.gpus, {}), start);
    std::vector<Layout> out;
    for (const auto& cand : report.candidates)
      if (cand.verdict == Verdict::fits) out.push_back(cand.layout);
    std::shuffle(out.begin(), out.end(), rng);
    return out;
  }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
  // A factor 0.6-0.8 or 1.25-1.6: far enough from 1 that the start is wrong.
  double off_by() { return uniform(0, 1) < 0.5 ? uniform(0.6, 0.8) : uniform(1.25, 1.6); }
  double step(const Layout& l, const CostConstants& k) { return predict(m, run, l, c, k).step; }
  double rms_error(const std::vector<Layout>& ls, const std::vector<double>& measured,
                   const CostConstants& k) {
    double s = 0;
    for (size_t i = 0; i < ls.size(); ++i) {
      const double e = step(ls[i], k) / measured[i] - 1;
      s += e * e;
    }
    return std::sqrt(s / double(ls.size()));
  }
};

TEST_F(Calibrate, RecoversSyntheticConstantsFromNoisyMeasurements) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay: WEFT_TEST_SEED=" + std::to_string(seed) + ")");
  CostConstants truth = start;
  for (double CostConstants::*f :
       {&CostConstants::gemm_efficiency, &CostConstants::flash_efficiency,
        &CostConstants::memory_efficiency, &CostConstants::intra_efficiency,
        &CostConstants::inter_efficiency})
    truth.*f = std::min(0.95, truth.*f * off_by());
  truth.launch_overhead *= uniform(2, 5);
  truth.dp_overlap = uniform(0.5, 0.9);
  truth.overlap_cost = uniform(0.05, 0.3);

  // 24 measured layouts, as many as a tuning's refit takes, for the 9
  // constants tiny's space moves; the rest of the space is held out.
  constexpr size_t kFitted = 24;
  const auto layouts = fitting_layouts();
  ASSERT_GE(layouts.size(), 2 * kFitted);
  const std::vector<Layout> fit(layouts.begin(), layouts.begin() + kFitted);
  const std::vector<Layout> held(layouts.begin() + kFitted, layouts.end());
  auto measure = [&](const std::vector<Layout>& ls) {
    std::vector<double> t;
    for (const auto& l : ls) t.push_back(step(l, truth) * (1 + uniform(-0.01, 0.01)));
    return t;
  };
  const auto fit_t = measure(fit), held_t = measure(held);
  std::vector<Observation> obs;
  for (size_t i = 0; i < fit.size(); ++i) obs.push_back({fit[i], fit_t[i]});

  const auto r = calibrate(m, run, c, obs, start);
  EXPECT_TRUE(r.accepted);
  EXPECT_LT(r.rms_error_after, 0.03);
  EXPECT_LT(r.rms_error_after, r.rms_error_before);
  EXPECT_NEAR(r.rms_error_before, rms_error(fit, fit_t, start), 1e-12);
  EXPECT_NEAR(r.rms_error_after, rms_error(fit, fit_t, r.constants), 1e-12);
  ASSERT_EQ(r.error_before.size(), obs.size());
  ASSERT_EQ(r.error_after.size(), obs.size());
  EXPECT_FALSE(r.fitted.empty());
  EXPECT_LE(r.fitted.size(), obs.size());
  EXPECT_EQ(r.fitted.front(), "gemm_efficiency");
  EXPECT_GT(r.evaluations, 0);
  EXPECT_LE(r.evaluations, 100 + 100 * int(r.fitted.size()));
  // The fitted constants also predict layouts they were not fitted to.
  const double held_before = rms_error(held, held_t, start);
  const double held_after = rms_error(held, held_t, r.constants);
  EXPECT_LT(held_after, held_before);
  EXPECT_LT(held_after, 0.1);
  // Constants outside the fit keep their start values.
  EXPECT_EQ(r.constants.gemm_tile_m, start.gemm_tile_m);
  EXPECT_EQ(r.constants.gemm_k_half, start.gemm_k_half);
  std::cout << fmt::format(
      "[ calibrate ] fit rms {:.4f} -> {:.5f}, held-out ({}) rms {:.4f} -> {:.5f}, "
      "{} evaluations, fitted {}\n",
      r.rms_error_before, r.rms_error_after, held.size(), held_before, held_after, r.evaluations,
      fmt::join(r.fitted, " "));
}

TEST_F(Calibrate, OneObservationFitsOneConstantExactly) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay: WEFT_TEST_SEED=" + std::to_string(seed) + ")");
  const Layout l = fitting_layouts().front();
  const double measured = step(l, start) * uniform(1.1, 1.5);
  const auto r = calibrate(m, run, c, {{l, measured}}, start);
  ASSERT_EQ(r.fitted, std::vector<std::string>{"gemm_efficiency"});
  EXPECT_TRUE(r.accepted);
  EXPECT_LT(std::abs(r.error_after.at(0)), 1e-3) << l.to_string();
  EXPECT_LT(r.constants.gemm_efficiency, start.gemm_efficiency);
  CostConstants others = r.constants;
  others.gemm_efficiency = start.gemm_efficiency;
  EXPECT_EQ(others, start);
}

TEST_F(Calibrate, FitsNoMoreConstantsThanObservations) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay: WEFT_TEST_SEED=" + std::to_string(seed) + ")");
  const auto layouts = fitting_layouts();
  std::vector<Observation> obs;
  for (int i = 0; i < 3; ++i) obs.push_back({layouts[i], step(layouts[i], start) * uniform(0.7, 1.4)});
  const auto r = calibrate(m, run, c, obs, start);
  EXPECT_EQ(r.fitted.size(), 3u);
  EXPECT_LE(r.rms_error_after, r.rms_error_before);
}

TEST_F(Calibrate, KeepsAStartThatAlreadyFits) {
  const auto layouts = fitting_layouts();
  std::vector<Observation> obs;
  for (size_t i = 0; i < 20; ++i) obs.push_back({layouts[i], step(layouts[i], start)});
  const auto r = calibrate(m, run, c, obs, start);
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.constants, start);
  EXPECT_EQ(r.rms_error_after, r.rms_error_before);
}

TEST_F(Calibrate, BadInputNamesTheValue) {
  const Layout l = Layout::parse("tp2-pp1-dp2-mb1");
  auto with = [&](std::vector<Observation> obs) { return calibrate(m, run, c, obs, start); };
  WEFT_EXPECT_THROW_MSG(with({}), InputError, "0 observations");
  const std::string text = l.to_string();
  WEFT_EXPECT_THROW_MSG(with({{l, 0.5}, {l, -1.5}}), InputError, "observation 1", "-1.5",
                        text.c_str());
  WEFT_EXPECT_THROW_MSG(with({{l, 0.0}}), InputError, "step time 0 s");
  WEFT_EXPECT_THROW_MSG(with({{l, std::nan("")}}), InputError, "nan");
  WEFT_EXPECT_THROW_MSG(with({{l, std::numeric_limits<double>::infinity()}}), InputError, "inf");
  const Layout bad = Layout::parse("tp3-pp1-dp1");
  WEFT_EXPECT_THROW_MSG(with({{bad, 0.5}}), InputError, "observation 0", "tp3");
}

}  // namespace
}  // namespace weft::tuner
