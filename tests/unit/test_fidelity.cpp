// The cost and memory models against public measured training runs
// (calibration/public_runs.csv): the presets' shipped profiles are what the
// fit gives today, and on the held-out sweeps (never fitted to) they predict
// MFU, rank layouts and tell fitting from out-of-memory within the bounds
// below. benchmarks/model_fidelity prints the tables behind these numbers.
#include <cmath>
#include <fstream>

#include "test_util.h"
#include "core/error.h"
#include "calibration/fidelity.h"

namespace weft::calibration {
namespace {

using namespace weft::tuner;

const PublicRunSet& runs() {
  static const PublicRunSet set = public_runs_load(calibration_dir() + "/public_runs.csv");
  return set;
}

TEST(Fidelity, RowsLoadWithTheirSplit) {
  const auto& set = runs();
  ASSERT_GT(set.runs.size(), 800u);
  int64_t held = 0, oom = 0;
  std::map<std::string, int64_t> sweeps_held;
  for (const auto& r : set.runs) {
    held += r.held_out;
    oom += r.oom;
    if (r.held_out) ++sweeps_held[r.sweep];
    if (!r.oom) {
      EXPECT_GT(r.measured_step_s, 0) << r.source << ":" << r.line;
      EXPECT_GT(r.measured_mfu, 0.05) << r.source << ":" << r.line;
      EXPECT_LT(r.measured_mfu, 0.85) << r.source << ":" << r.line;
    }
    EXPECT_TRUE(r.layout.violations(r.model, r.run, r.cluster.gpus).empty()) << r.source << ":" << r.line;
  }
  EXPECT_GT(held, int64_t(set.runs.size()) / 10);
  EXPECT_LT(held, int64_t(set.runs.size()) / 2);
  EXPECT_GT(oom, 300);
  // Rows weft cannot express are counted, not dropped silently.
  EXPECT_GT(set.skipped.at("attention 'flash1' (no weft kernel of its kind)"), 0);
}

// The shipped profiles are the fit of the current model to the current rows:
// a change to either without `weft calibrate --public` fails here.
TEST(Fidelity, ShippedProfilesAreTheFit) {
  for (const char* family : {"a100", "hopper"}) {
    const auto shipped = preset_profile(device_preset(family == std::string("a100") ? "a100-80gb" : "h100"));
    ASSERT_TRUE(shipped) << family;
    const auto fresh = fidelity_profile(runs(), family, "public_runs.csv");
    const nlohmann::json a = shipped->constants, b = fresh.constants;
    for (const auto& [name, v] : a.items())
      EXPECT_NEAR(v.get<double>(), b[name].get<double>(), 1e-6 * std::max(1.0, std::abs(v.get<double>())))
          << family << " " << name << ": run `weft calibrate --public` and commit calibration/profiles/";
  }
}

TEST(Fidelity, HeldOutSweepsWithinBounds) {
  const auto after = fidelity_evaluate(runs().runs, Split::held_out, [](const DeviceSpec& d) { return cost_defaults(d); });
  const auto before =
      fidelity_evaluate(runs().runs, Split::held_out, [](const DeviceSpec& d) { return datasheet_constants(d); });
  const auto& t = after.total;
  ASSERT_GT(t.measured, 100);
  ASSERT_GE(t.sweeps, 3);
  // MFU within 5 points on average (the datasheet constants: ~15 too high).
  EXPECT_LE(t.mae_points, 5.0);
  EXPECT_GT(before.total.mae_points, 10.0);
  EXPECT_LT(std::abs(t.bias_points), 2.5);
  // Layouts of one model on one cluster ranked as measured.
  EXPECT_GE(t.mean_spearman, 0.8);
  // The layout ranked first measured within 2 MFU points of the best in 90%
  // of the held-out sweeps.
  EXPECT_GE(double(t.best_within_2), 0.9 * double(t.sweeps));
  // Runs that trained are predicted to fit; most measured OOMs predicted OOM.
  EXPECT_GE(double(t.fit_predicted), 0.95 * double(t.measured));
  EXPECT_GE(double(t.oom_predicted), 0.5 * double(t.oom));
}

TEST(Fidelity, SpearmanHandlesTiesAndTooFewPoints) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  EXPECT_NEAR(spearman({1, 2, 2, 3}, {1, 2, 3, 4}), 0.9486832980505138, 1e-12);
  EXPECT_TRUE(std::isnan(spearman({1, 2}, {1, 2})));
  EXPECT_TRUE(std::isnan(spearman({1, 1, 1}, {1, 2, 3})));
}

TEST(PublicRuns, MalformedFilesAreRefusedWithTheLine) {
  const std::string path = ::testing::TempDir() + "/public_runs_bad.csv";
  std::ofstream(path) << "source,model\nx,\"unterminated\n";
  WEFT_EXPECT_THROW_MSG(public_runs_load(path), InputError, path.c_str(), "unterminated quote");
  std::ofstream(path) << "model,source\n";
  WEFT_EXPECT_THROW_MSG(public_runs_load(path), InputError, "header");
  WEFT_EXPECT_THROW_MSG(public_runs_load(path + ".missing"), InputError, "cannot read");
}

}  // namespace
}  // namespace weft::calibration
