// The tuner's per-knob corrections (tuner/surrogate.h) against effects
// planted in synthetic residuals: fresh random effects, layouts and noise on
// every run (the seed is printed), judged by the standard error each
// estimate has.
#include <cmath>
#include <cstdio>
#include <random>

#include <gtest/gtest.h>

#include "tuner/surrogate.h"

namespace weft::tuner {
namespace {

struct Planted {
  std::vector<int64_t> tp = {1, 2, 4}, mb = {1, 2, 4, 8};
  std::vector<AttentionKind> attn = {AttentionKind::flash, AttentionKind::materialized};
  std::vector<NormKind> norm = {NormKind::fused, NormKind::unfused};
  std::vector<double> e_tp, e_mb, e_attn, e_norm;
  double base = 0;

  explicit Planted(std::mt19937_64& rng) {
    std::normal_distribution<double> effect(0, 0.2);
    for (size_t i = 0; i < tp.size(); ++i) e_tp.push_back(effect(rng));
    for (size_t i = 0; i < mb.size(); ++i) e_mb.push_back(effect(rng));
    for (size_t i = 0; i < attn.size(); ++i) e_attn.push_back(effect(rng));
    for (size_t i = 0; i < norm.size(); ++i) e_norm.push_back(effect(rng));
    base = effect(rng);
  }
  // A random layout and its true log correction.
  std::pair<Layout, double> draw(std::mt19937_64& rng) const {
    const size_t a = rng() % tp.size(), b = rng() % mb.size(), c = rng() % attn.size(), d = rng() % norm.size();
    Layout l;
    l.tp = tp[a];
    l.dp = 8 / l.tp;
    l.mb = mb[b];
    l.attention = attn[c];
    l.norm = norm[d];
    return {l, base + e_tp[a] + e_mb[b] + e_attn[c] + e_norm[d]};
  }
};

uint64_t fresh_seed() {
  const uint64_t s = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(s));
  return s;
}

TEST(Surrogate, RecoversPlantedEffectsWithinTheirStandardError) {
  std::mt19937_64 rng(fresh_seed());
  const Planted truth(rng);
  const double noise = 0.03;
  std::normal_distribution<double> eps(0, noise);
  Surrogate s;
  std::vector<std::vector<int32_t>> rows;
  std::vector<double> y;
  int64_t materialized = 0;
  const int64_t n = 300;
  for (int64_t i = 0; i < n; ++i) {
    auto [l, t] = truth.draw(rng);
    materialized += l.attention == AttentionKind::materialized;
    rows.push_back(s.encode(l));
    y.push_back(t + eps(rng));
  }
  s.fit(rows, y);
  // Effects are known up to a constant per axis (the intercept takes the
  // rest): differences within an axis are what the fit must recover.
  const double diff = s.effect("attn=materialized") - s.effect("attn=flash");
  const double want = truth.e_attn[1] - truth.e_attn[0];
  const double se = noise * std::sqrt(1.0 / double(materialized) + 1.0 / double(n - materialized));
  EXPECT_NEAR(diff, want, 5 * se);
  // Predictions of fresh layouts, against their true corrections.
  double worst = 0;
  for (int i = 0; i < 50; ++i) {
    auto [l, t] = truth.draw(rng);
    worst = std::max(worst, std::abs(s.mean(s.encode(l)) - t));
  }
  // A prediction sums 4 effects and the intercept, each within a few
  // standard errors of sqrt(noise^2 / (n / values)).
  EXPECT_LT(worst, 5 * noise * std::sqrt(5 * 4.0 / double(n)) * 2);
  // The noise estimate, from 300 residuals: within 25% of the truth.
  EXPECT_NEAR(s.noise(), noise, 0.25 * noise);
}

TEST(Surrogate, AValueNeverMeasuredKeepsThePriorsSpreadAndNoEffect) {
  std::mt19937_64 rng(fresh_seed());
  const Planted truth(rng);
  const double prior_sd = 0.25;
  Surrogate s(prior_sd, 0.15, 0.01);
  std::vector<std::vector<int32_t>> rows;
  std::vector<double> y;
  for (int i = 0; i < 40; ++i) {
    auto [l, t] = truth.draw(rng);
    l.zero = 0;
    rows.push_back(s.encode(l));
    y.push_back(t);
  }
  s.fit(rows, y);
  Layout seen = truth.draw(rng).first;
  Layout unseen = seen;
  unseen.zero = 2;  // zero=2 is in no observation
  const auto r_seen = s.encode(seen);
  const auto r_unseen = s.encode(unseen);
  EXPECT_EQ(s.effect("zero=2"), 0.0);
  // It counts as its axis's measured value (zero=0, in every observation),
  // and its spread holds the prior's on top of that layout's.
  EXPECT_DOUBLE_EQ(s.mean(r_unseen), s.mean(r_seen));
  EXPECT_NEAR(s.spread(r_unseen) * s.spread(r_unseen), s.spread(r_seen) * s.spread(r_seen) + prior_sd * prior_sd,
              1e-12);
  // Noise-free residuals: the estimate sits at the floor's order, far below
  // the prior's 15%.
  EXPECT_LT(s.noise(), 0.05);
}

TEST(Surrogate, BeforeAnyFitThePredictionIsTheModelsAndTheSpreadThePriors) {
  Surrogate s(0.25, 0.15, 0.01);
  const auto row = s.encode(Layout{});
  EXPECT_EQ(s.mean(row), 0.0);
  EXPECT_NEAR(s.spread(row), std::sqrt(0.15 * 0.15 + 0.25 * 0.25 * double(row.size())), 1e-12);
}

TEST(Surrogate, KnobValuesNameEveryAxisOnce) {
  Layout l = Layout::parse("tp2-cp2-pp2-dp1-mb4-vpp2-sp-ckpt:full-attn:materialized-norm:unfused-zero1-cp:a2a");
  const auto v = knob_values(l);
  const std::vector<std::string> want = {"tp=2", "cp=2", "pp=2", "dp=1", "mb=4", "vpp=2", "sp=1", "cp_comm=a2a",
                                         "ckpt=full", "attn=materialized", "norm=unfused", "zero=1", "grad=fp32",
                                         "fp8=off"};
  EXPECT_EQ(v, want);
  // cp 1 has no transport.
  EXPECT_EQ(knob_values(Layout{}).size(), want.size() - 1);
}

}  // namespace
}  // namespace weft::tuner
