#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "report/report.h"
#include "tuner/space.h"

namespace weft::tuner {
namespace {

struct Space : ::testing::Test {
  ModelSpec m = model_preset("llama-13b");
  RunSpec run{2048, 512, Precision::bf16};
  ClusterSpec c = cluster_resolve("a100-80gb", 32, 8);
  CostConstants k = cost_defaults(c.device);
};

TEST_F(Space, EnumerationFollowsTheRules) {
  const auto all = enumerate(m, run, 32, {});
  std::set<std::string> seen;
  for (const auto& l : all) {
    EXPECT_TRUE(seen.insert(l.to_string()).second) << "duplicate " << l.to_string();
    EXPECT_EQ(l.world(), 32);
    EXPECT_EQ(m.heads % l.tp, 0);
    EXPECT_EQ(m.layers % l.pp, 0);
    if (l.tp == 1) { EXPECT_FALSE(l.sp); }
    if (l.dp == 1) { EXPECT_EQ(l.zero, 0); }
    if (l.pp == 1) { EXPECT_EQ(l.vpp, 1); }
  }
  // Every knob value appears.
  auto has = [&](auto pred) { return std::any_of(all.begin(), all.end(), pred); };
  EXPECT_TRUE(has([](const Layout& l) { return l.tp == 8 && l.sp; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.pp == 4 && l.vpp == 5; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.ckpt == Checkpointing::full && l.ckpt_layers > 0; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.attention == AttentionKind::materialized; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.attention == AttentionKind::cudnn; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.norm == NormKind::unfused; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.zero == 3 && l.mb == 16; }));
}

TEST_F(Space, Bf16GradientsOnlyWithBf16Compute) {
  auto grads = [](const std::vector<Layout>& v) {
    std::set<GradPrecision> g;
    for (const auto& l : v) g.insert(l.grad);
    return g;
  };
  EXPECT_EQ(grads(enumerate(m, run, 32, {})), (std::set{GradPrecision::fp32, GradPrecision::bf16}));
  const RunSpec fp32{2048, 512, Precision::fp32};
  EXPECT_EQ(grads(enumerate(m, fp32, 32, {}, DeviceKind::cpu)), (std::set{GradPrecision::fp32}));
  SpaceLimits lim;
  lim.grad = {GradPrecision::bf16};
  EXPECT_EQ(grads(enumerate(m, run, 32, lim)), (std::set{GradPrecision::bf16}));
}

TEST_F(Space, PinsRestrictTheSpace) {
  SpaceLimits lim;
  lim.tp = {2};
  lim.mb = {1};
  lim.ckpt = {Checkpointing::none, Checkpointing::full};
  lim.attention = {AttentionKind::flash};
  lim.sp = {true};
  const auto pinned = enumerate(m, run, 32, lim);
  ASSERT_FALSE(pinned.empty());
  for (const auto& l : pinned) {
    EXPECT_EQ(l.tp, 2);
    EXPECT_EQ(l.mb, 1);
    EXPECT_TRUE(l.sp);
    EXPECT_TRUE(l.ckpt == Checkpointing::none || l.ckpt == Checkpointing::full);
    EXPECT_EQ(l.attention, AttentionKind::flash);
  }
  // A pinned value the model does not allow is kept and pruned as invalid.
  SpaceLimits bad;
  bad.tp = {3};
  bad.pp = {1};
  bad.mb = {1};
  EXPECT_TRUE(enumerate(m, run, 32, bad).empty());  // 3 does not divide 32
}

// cuDNN has no CPU kernels: a CPU's space leaves cudnn out, and a pinned one
// is pruned with the reason.
TEST_F(Space, CudnnAttentionOnlyOnGpus) {
  SpaceLimits lim;
  lim.tp = {1};
  lim.pp = {1};
  lim.mb = {1};
  const auto gpu = enumerate(m, run, 32, lim, DeviceKind::gpu);
  const auto cpu = enumerate(m, run, 32, lim, DeviceKind::cpu);
  auto count = [](const std::vector<Layout>& ls, AttentionKind a) {
    return std::count_if(ls.begin(), ls.end(), [&](const Layout& l) { return l.attention == a; });
  };
  EXPECT_GT(count(gpu, AttentionKind::cudnn), 0);
  EXPECT_EQ(count(gpu, AttentionKind::cudnn), count(gpu, AttentionKind::flash));
  EXPECT_EQ(count(cpu, AttentionKind::cudnn), 0);
  EXPECT_EQ(count(cpu, AttentionKind::flash), count(gpu, AttentionKind::flash));

  lim.attention = {AttentionKind::cudnn};
  const ClusterSpec host = cluster_resolve("cpu", 32, 32);
  ASSERT_EQ(host.device.kind, DeviceKind::cpu);
  const auto r = evaluate(m, run, host, enumerate(m, run, 32, lim, DeviceKind::cpu), k);
  ASSERT_FALSE(r.candidates.empty());
  for (const auto& c : r.candidates) {
    EXPECT_EQ(c.verdict, Verdict::invalid);
    EXPECT_NE(c.reason.find("needs a GPU"), std::string::npos) << c.reason;
  }
}

TEST_F(Space, EvaluateRanksFittingLayoutsAndExplainsTheRest) {
  SpaceLimits lim;
  lim.mb = {1, 2, 4, 8};
  lim.vpp = {1, 2, 3};  // vpp 3 breaks L % (pp * vpp) for some pp
  auto layouts = enumerate(m, run, 32, lim);
  const auto r = evaluate(m, run, c, layouts, k);
  EXPECT_EQ(r.evaluated, int64_t(layouts.size()));
  ASSERT_GT(r.fitting, 0);
  int64_t pruned = 0;
  for (const auto& [why, n] : r.pruned) pruned += n;
  EXPECT_EQ(pruned + r.fitting, r.evaluated);
  EXPECT_TRUE(r.pruned.count("oom: activations"));
  bool invalid_seen = false;
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& x = r.candidates[i];
    if (i < size_t(r.fitting)) {
      EXPECT_EQ(x.verdict, Verdict::fits);
      EXPECT_TRUE(x.memory.fits);
      EXPECT_LE(x.memory.peak(), x.memory.usable);
      EXPECT_TRUE(x.reason.empty());
      if (i >= 2) { EXPECT_LE(r.candidates[i - 1].cost.step, x.cost.step); }
    } else {
      EXPECT_NE(x.verdict, Verdict::fits);
      EXPECT_FALSE(x.reason.empty());
      invalid_seen |= x.verdict == Verdict::invalid;
    }
  }
  EXPECT_TRUE(invalid_seen);
  // The first is the least-memory layout within 1% of the fastest.
  const auto& first = r.candidates.front();
  for (int64_t i = 1; i < r.fitting; ++i) {
    const auto& x = r.candidates[size_t(i)];
    if (x.cost.step <= first.cost.step) { EXPECT_GE(x.memory.peak(), first.memory.peak()); }
  }
}

TEST_F(Space, ReportsCoverEveryLayout) {
  SpaceLimits lim;
  lim.tp = {2, 4};
  lim.mb = {1, 2};
  const auto r = evaluate(m, run, c, enumerate(m, run, 32, lim), k);
  SpaceContext ctx{m, run, c, k, {}};
  const auto j = nlohmann::json::parse(report::report_json(r, ctx, INT64_MAX).dump());
  ASSERT_EQ(int64_t(j["layouts"].size()), r.evaluated);
  int64_t fits = 0;
  for (const auto& row : j["layouts"]) {
    const Layout l = Layout::parse(row["layout"].get<std::string>());
    EXPECT_EQ(l.to_string(), row["layout"]);
    if (row["verdict"] == "fits") {
      ++fits;
      EXPECT_GT(row["prediction"]["step_s"].get<double>(), 0);
    } else {
      EXPECT_FALSE(row["reason"].get<std::string>().empty());
    }
  }
  EXPECT_EQ(fits, r.fitting);
  EXPECT_EQ(j["model"]["hash"], m.hash());
  const auto csv = report::report_csv(r, ctx, INT64_MAX);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), r.evaluated + 1);
  const auto md = report::report_md(r, ctx, 5);
  EXPECT_NE(md.find("| 1 | `"), std::string::npos);
  const auto table = report::report_table(r, ctx, 5);
  EXPECT_NE(table.find("best layout: " + r.candidates.front().layout.to_string()), std::string::npos);
  EXPECT_NE(table.find("pruned by reason"), std::string::npos);
}

}  // namespace
}  // namespace weft::tuner
