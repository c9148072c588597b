#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "report/report.h"
#include "tuner/space.h"
#include "tuner/space_bounds.h"
#include "tuner/space_scan.h"

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
    EXPECT_TRUE(l.uneven() || m.layers % (l.pp * l.vpp) == 0) << l.to_string();
    for (const auto& v : l.violations(m, run, 32)) EXPECT_EQ(v.find("split:"), std::string::npos) << v;
    EXPECT_EQ(run.seq % (2 * l.cp), 0);
    if (l.cp == 1) { EXPECT_EQ(l.cp_comm, CpComm::ring); }
    if (l.tp == 1) { EXPECT_FALSE(l.sp); }
    if (l.shard_ways() == 1) { EXPECT_EQ(l.zero, 0); }
    if (l.pp == 1) { EXPECT_EQ(l.vpp, 1); }
  }
  // Every knob value appears.
  auto has = [&](auto pred) { return std::any_of(all.begin(), all.end(), pred); };
  EXPECT_TRUE(has([](const Layout& l) { return l.tp == 8 && l.sp; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.pp == 4 && l.vpp == 5; }));
  // L = 40 over pp 16 only unevenly; the vocabulary's table (32,000 x 5,120)
  // is half a block, so where L divides only the even split is searched.
  EXPECT_TRUE(has([](const Layout& l) { return l.pp == 16 && l.uneven(); }));
  EXPECT_FALSE(has([](const Layout& l) { return l.pp == 4 && l.uneven(); }));
  EXPECT_TRUE(has([](const Layout& l) { return l.ckpt == Checkpointing::full && l.ckpt_layers > 0; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.attention == AttentionKind::materialized; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.attention == AttentionKind::cudnn; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.norm == NormKind::unfused; }));
  EXPECT_TRUE(has([](const Layout& l) { return l.zero == 3 && l.mb == 16; }));
  // cp over the divisors of what tp leaves, each with every transport; ZeRO
  // over the dp x cp ranks even at dp 1.
  for (int64_t cp : {1, 2, 4, 8, 16, 32}) {
    EXPECT_TRUE(has([&](const Layout& l) { return l.cp == cp; })) << cp;
    if (cp > 1) {
      for (CpComm t : {CpComm::ring, CpComm::allgather, CpComm::a2a})
        EXPECT_TRUE(has([&](const Layout& l) { return l.cp == cp && l.cp_comm == t; })) << cp;
    }
  }
  EXPECT_TRUE(has([](const Layout& l) { return l.tp == 4 && l.cp == 8 && l.dp == 1 && l.zero == 3; }));
  // T = 2048 cuts into 2*cp chunks for every cp up to 1024; T = 96 only for
  // cp 1, 2, 3, 4, 6, 8, 12, 16, 24, 48 (those dividing 48) and a world of 32
  // allows 1, 2, 4, 8 and 16 of them.
  std::set<int64_t> cps;
  for (const auto& l : enumerate(m, RunSpec{96, 512, Precision::bf16}, 32, {})) cps.insert(l.cp);
  EXPECT_EQ(cps, (std::set<int64_t>{1, 2, 4, 8, 16}));
}

// The space as subspaces of one parallel shape: enumerate() is them, in order.
TEST_F(Space, SubspacesAreTheSpaceInOrder) {
  SpaceLimits lim;
  lim.mb = {1, 2};
  const auto all = enumerate(m, run, 32, lim);
  const auto subs = enumerate_subspaces(m, run, 32, lim);
  int64_t at = 0;
  for (const auto& s : subs) {
    EXPECT_EQ(s.first, at);
    for (int64_t i = 0; i < s.size(); ++i, ++at) {
      ASSERT_LT(at, int64_t(all.size()));
      EXPECT_EQ(s.at(i), all[size_t(at)]);
      const Layout l = s.at(i);
      EXPECT_TRUE(l.tp == s.shape.tp && l.cp == s.shape.cp && l.cp_comm == s.shape.cp_comm && l.pp == s.shape.pp &&
                  l.mb == s.shape.mb && l.vpp == s.shape.vpp && l.sp == s.shape.sp);
    }
  }
  EXPECT_EQ(at, int64_t(all.size()));
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

// --cp and --cp-comm: the transports apply at cp > 1 (cp 1 has none); a
// pinned cp the sequence does not cut into is kept and pruned with the rule,
// as is a transport the heads do not allow.
TEST_F(Space, ContextParallelPins) {
  SpaceLimits lim;
  lim.cp = {1, 4};
  lim.cp_comm = {CpComm::a2a};
  lim.mb = {1};
  const auto pinned = enumerate(m, run, 32, lim);
  ASSERT_FALSE(pinned.empty());
  std::set<std::pair<int64_t, CpComm>> seen;
  for (const auto& l : pinned) seen.insert({l.cp, l.cp_comm});
  EXPECT_EQ(seen, (std::set<std::pair<int64_t, CpComm>>{{1, CpComm::ring}, {4, CpComm::a2a}}));

  const RunSpec odd{2052, 512, Precision::bf16};  // 2052 = 2 * 2 * 513: cp 2 cuts it, cp 4 does not
  lim.cp = {4};
  lim.cp_comm = {CpComm::ring};
  lim.tp = {1};
  lim.attention = {AttentionKind::flash};
  const auto r = evaluate(m, odd, c, enumerate(m, odd, 32, lim), k);
  ASSERT_GT(r.evaluated, 0);
  EXPECT_EQ(r.pruned.at("invalid: context parallelism cuts seq T"), r.evaluated);
  // llama-13b's 40 heads over cp 16 do not split: a2a is pruned, ring is not.
  lim = {};
  lim.tp = {1};
  lim.cp = {16};
  lim.mb = {1};
  lim.attention = {AttentionKind::flash};
  const auto heads = evaluate(m, run, c, enumerate(m, run, 32, lim), k);
  int64_t a2a = 0;
  for (const auto& x : heads.candidates) {
    if (x.layout.cp_comm != CpComm::a2a) {
      EXPECT_NE(x.verdict, Verdict::invalid) << x.layout.to_string() << ": " << x.reason;
      continue;
    }
    ++a2a;
    EXPECT_EQ(x.prune_class, "invalid: cp:a2a splits each rank's heads over cp") << x.reason;
  }
  EXPECT_GT(a2a, 0);
}

// cuDNN has no CPU kernels: a CPU's space leaves cudnn out, and a pinned one
// is pruned with the reason.
TEST_F(Space, CudnnAttentionOnlyOnGpus) {
  SpaceLimits lim;
  lim.tp = {1};
  lim.cp = {1};
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
  // Every kind of row (fits, several prune reasons, uneven splits at pp 16)
  // in a space of 11,412: the reports' size is the dry-run tests' concern.
  SpaceLimits lim;
  lim.tp = {2, 4};
  lim.mb = {1, 2};
  lim.pp = {1, 2, 16};
  lim.cp = {1, 2};
  lim.norm = {NormKind::fused};
  lim.zero = {0, 1, 3};
  lim.grad = {GradPrecision::fp32};
  const auto r = evaluate(m, run, c, enumerate(m, run, 32, lim), k);
  std::set<std::string> reasons;
  for (const auto& cand : r.candidates)
    if (cand.verdict != Verdict::fits) reasons.insert(cand.reason.substr(0, cand.reason.find(':')));
  EXPECT_GE(reasons.size(), 2u);
  EXPECT_TRUE(std::any_of(r.candidates.begin(), r.candidates.end(),
                          [](const Candidate& cand) { return cand.layout.uneven() && cand.verdict == Verdict::fits; }));
  std::printf("%lld layouts, %lld fit\n", (long long)r.evaluated, (long long)r.fitting);
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


namespace search_test {

struct Case {
  const char* model;
  const char* gpu;
  int64_t gpus, seq, batch, top;
  SpaceLimits limits;
  DeviceKind device = DeviceKind::gpu;
};

// What a report lists: its rows (evaluate()'s are the whole space, in order).
void expect_same_rows(const SpaceReport& ex, const SpaceReport& se, int64_t top, const std::string& what) {
  const size_t rows = size_t(std::min<int64_t>(top, int64_t(ex.candidates.size())));
  ASSERT_GE(se.candidates.size(), rows) << what;
  for (size_t i = 0; i < rows; ++i) {
    const Candidate& a = ex.candidates[i];
    const Candidate& b = se.candidates[i];
    EXPECT_EQ(a.layout.to_string(), b.layout.to_string()) << what << " row " << i;
    EXPECT_EQ(a.verdict, b.verdict) << what << " row " << i;
    EXPECT_EQ(a.reason, b.reason) << what << " row " << i;
    EXPECT_EQ(a.cost.step, b.cost.step) << what << " row " << i;
    if (a.verdict != Verdict::invalid) { EXPECT_EQ(a.memory.peak(), b.memory.peak()) << what << " row " << i; }
  }
}

}  // namespace search_test

// The search lists exactly the rows evaluate() ranks first, whatever fits:
// many layouts, fewer than the rows, none (then the nearest follows), or
// none valid; with tied embeddings, on a CPU, and under context parallelism.
// Its counts cover the space, and the rules' counts are evaluate()'s.
TEST(SpaceSearch, ListsTheExhaustiveRows) {
  using search_test::Case;
  std::vector<Case> cases;
  {
    Case c{"llama-13b", "a100-80gb", 32, 2048, 512, 10, {}};
    c.limits.mb = {1, 2, 4};
    cases.push_back(c);
    c.top = 40;
    cases.push_back(c);
  }
  cases.push_back({"llama-65b", "a100-40gb", 8, 2048, 8, 4, {}});  // nothing fits
  {
    Case c{"llama-13b", "a100-40gb", 8, 2048, 2048, 6, {}};  // fewer than the rows fit
    c.limits.tp = {8};
    c.limits.mb = {4};
    c.limits.ckpt = {Checkpointing::none};
    c.limits.zero = {0};
    c.limits.sp = {true};
    c.limits.grad = {GradPrecision::fp32};
    cases.push_back(c);
  }
  {
    Case c{"tiny-test", "cpu", 8, 256, 64, 12, {}, DeviceKind::cpu};
    cases.push_back(c);
    c.limits.attention = {AttentionKind::cudnn, AttentionKind::flash};  // cudnn pinned on a CPU
    cases.push_back(c);
  }
  {
    // The even split only: uneven ones have a case of their own below, and
    // would multiply this space's pipelined shapes by three.
    Case c{"llama3.1-8b", "h100", 64, 32768, 64, 10, {}};
    c.limits.split = {{}};
    cases.push_back(c);
  }
  {
    // Uneven splits searched (the 128k table weighs 2.4 blocks), and L + 2
    // over vpp where pp does not divide L.
    Case c{"llama3.1-8b", "h100", 16, 8192, 32, 10, {}};
    c.limits.mb = {1};
    c.limits.fp8 = {{Fp8Recipe::off, 0}};
    cases.push_back(c);
  }
  cases.push_back({"llama3.2-1b", "h100", 16, 4096, 64, 10, {}});  // tied embeddings over stages
  {
    Case c{"llama-13b", "a100-80gb", 32, 2048, 512, 5, {}};  // none valid: 40 heads over cp 16 by a2a
    c.limits.tp = {1};
    c.limits.cp = {16};
    c.limits.cp_comm = {CpComm::a2a};
    cases.push_back(c);
  }
  {
    // FP8 pinned: every recipe, bf16 end blocks over pipeline stages; and on
    // an A100, where every FP8 layout breaks the device's rule first.
    Case c{"llama3.1-8b", "h100", 32, 8192, 64, 10, {}};
    c.limits.fp8 = {{Fp8Recipe::off, 0}, {Fp8Recipe::tensorwise, 0}, {Fp8Recipe::delayed, 2}};
    c.limits.mb = {1, 2};
    c.limits.split = {{}};
    cases.push_back(c);
    c.gpu = "a100-80gb";
    c.limits.fp8 = {{Fp8Recipe::tensorwise, 1}, {Fp8Recipe::off, 0}};
    cases.push_back(c);
    c.limits.fp8 = {{Fp8Recipe::tensorwise, 1}};
    c.top = 3;
    cases.push_back(c);
  }
  for (const auto& c : cases) {
    SpaceContext ctx;
    ctx.model = model_preset(c.model);
    ctx.run = RunSpec{c.seq, c.batch, c.device == DeviceKind::cpu ? Precision::fp32 : Precision::bf16};
    ctx.cluster = cluster_resolve(c.gpu, c.gpus, c.device == DeviceKind::cpu ? c.gpus : 8);
    ctx.constants = cost_defaults(ctx.cluster.device);
    const std::string what = fmt::format("{} on {} x {}, seq {}, top {}", c.model, c.gpus, c.gpu, c.seq, c.top);
    // The device as the CLI passes it: FP8 searched on the H100s.
    const auto all = enumerate(ctx.model, ctx.run, c.gpus, c.limits, ctx.cluster.device);
    const auto ex = evaluate(ctx.model, ctx.run, ctx.cluster, all, ctx.constants, ctx.memory, ctx.tie);
    const auto se = search(ctx, c.limits, c.top, ctx.cluster.device);
    search_test::expect_same_rows(ex, se, c.top, what);
    EXPECT_FALSE(se.exhaustive);
    EXPECT_EQ(se.evaluated, ex.evaluated) << what;
    EXPECT_LE(se.visited, se.evaluated) << what;
    EXPECT_LE(se.fitting, ex.fitting) << what;
    if (ex.fitting < c.top) { EXPECT_EQ(se.fitting, ex.fitting) << what; }
    int64_t counted = se.fitting;
    for (const auto& [why, n] : se.pruned) {
      counted += n;
      EXPECT_GT(n, 0) << what << ": " << why;
      if (why.rfind("invalid: ", 0) == 0 || why == "size") {
        EXPECT_EQ(n, ex.pruned.count(why) ? ex.pruned.at(why) : 0) << what << ": " << why;
      }
    }
    EXPECT_EQ(counted, se.evaluated) << what;
    // When nothing fits, the layout nearest to fitting follows the rows.
    if (ex.fitting == 0 && ex.pruned.size() > 0) {
      const Candidate* near_ex = nullptr;
      for (const auto& x : ex.candidates)
        if (x.verdict == Verdict::out_of_memory && (!near_ex || x.memory.peak() < near_ex->memory.peak())) near_ex = &x;
      const Candidate* near_se = nullptr;
      for (const auto& x : se.candidates)
        if (x.verdict == Verdict::out_of_memory && (!near_se || x.memory.peak() < near_se->memory.peak())) near_se = &x;
      ASSERT_EQ(near_ex == nullptr, near_se == nullptr) << what;
      if (near_ex) { EXPECT_EQ(near_ex->layout, near_se->layout) << what; }
    }
  }
}

// Every bound the search rules layouts out by lies at or under the layout's
// own value: the step bound under predict()'s step, the memory bound under
// the memory model's worst stage.
// The splits searched: the even one where L divides, the rest spread where
// it does not, and lighter ends where the vocabulary's table weighs a block
// or more.
TEST(SpaceSplit, LighterEndsWhereTheTablesAreHeavyOrLDoesNotDivide) {
  const auto tiny = model_preset("tiny");  // 256 x 128 table against a 184,576-parameter block
  EXPECT_NEAR(vocab_table_blocks(tiny, 1), 0.18, 0.01);
  EXPECT_EQ(pipeline_splits(tiny, 1, 4), (std::vector<std::vector<int64_t>>{{}}));
  EXPECT_EQ(pipeline_vpps(tiny, 1, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(pipeline_vpps(tiny, 1, 8).empty());  // L + 2 < pp
  const auto l8b = model_preset("llama3.1-8b");    // 128,256 x 4,096: 2.4 blocks
  EXPECT_NEAR(vocab_table_blocks(l8b, 8), 2.4, 0.1);
  const auto splits = pipeline_splits(l8b, 8, 4);
  EXPECT_EQ(splits, (std::vector<std::vector<int64_t>>{{}, {8, 9, 9, 6}, {7, 9, 10, 6}}));
  EXPECT_EQ(pipeline_vpps(l8b, 8, 2), (std::vector<int64_t>{1, 2, 4, 8, 16}));  // not 17: L divides by pp
  // 405B: L = 126 over pp 8 x vpp 8 only with the embedding and the loss
  // counted as layers, the published split among them.
  const auto big = model_preset("llama3.1-405b");
  const auto vpps = pipeline_vpps(big, 8, 8);
  EXPECT_NE(std::find(vpps.begin(), vpps.end(), 8), vpps.end());
  const auto s405 = pipeline_splits(big, 8, 64);
  EXPECT_NE(std::find(s405.begin(), s405.end(), *edge_split(126, 64, 1, 1)), s405.end());
  // A prime L: pp 2 splits it every way near the middle.
  ModelSpec prime = model_preset("tiny-test");
  prime.layers = 7;
  EXPECT_EQ(pipeline_splits(prime, 1, 2), (std::vector<std::vector<int64_t>>{{3, 4}, {4, 3}}));
  EXPECT_EQ(pipeline_vpps(prime, 1, 2), (std::vector<int64_t>{1}));
}

TEST(SpaceSearch, BoundsNeverExceedTheLayouts) {
  struct Where {
    const char* model;
    const char* gpu;
    int64_t gpus, seq, batch;
    DeviceKind device;
    std::vector<std::pair<Fp8Recipe, int64_t>> fp8 = {};  // free: FP8 searched on the H100s
  };
  for (const Where& w : {Where{"llama-13b", "a100-80gb", 32, 2048, 512, DeviceKind::gpu},
                         Where{"tiny-test", "cpu", 8, 256, 64, DeviceKind::cpu},
                         Where{"llama3.1-8b", "h100", 16, 32768, 16, DeviceKind::gpu},
                         Where{"llama3.2-1b", "h100", 16, 4096, 64, DeviceKind::gpu},
                         // bf16 end blocks make the first and last stage differ.
                         Where{"llama3.1-8b", "h100", 16, 8192, 32, DeviceKind::gpu,
                               {{Fp8Recipe::delayed, 3}, {Fp8Recipe::tensorwise, 1}}},
                         // FP8 emulated on the CPU, pinned.
                         Where{"tiny-test", "cpu", 8, 256, 64, DeviceKind::cpu, {{Fp8Recipe::tensorwise, 1}}}}) {
    SpaceContext ctx;
    ctx.model = model_preset(w.model);
    ctx.run = RunSpec{w.seq, w.batch, w.device == DeviceKind::cpu ? Precision::fp32 : Precision::bf16};
    ctx.cluster = cluster_resolve(w.gpu, w.gpus, w.device == DeviceKind::cpu ? w.gpus : 8);
    ctx.constants = cost_defaults(ctx.cluster.device);
    SpaceLimits lim;
    lim.mb = {1, 2};
    lim.fp8 = w.fp8;
    const auto subs = enumerate_subspaces(ctx.model, ctx.run, w.gpus, lim, ctx.cluster.device);
    int64_t checked = 0;
    for (size_t s = 0; s < subs.size(); s += 3) {
      const Subspace& sub = subs[s];
      const auto steps = step_bounds(ctx.model, ctx.run, sub.shape, ctx.cluster, ctx.constants, sub.ckpts,
                                     sub.attentions, sub.norms, sub.zeros, sub.grads);
      MemoryBounds memory(ctx, sub);
      for (int64_t i = 0; i < sub.size(); ++i) {
        const Layout l = sub.at(i);
        if (!l.violations(ctx.model, ctx.run, w.gpus).empty()) continue;
        const Member x = member_of(sub, i);
        const auto est = memory::estimate(ctx.model, ctx.run, l, ctx.cluster.device, ctx.memory);
        EXPECT_LE(memory.of(x), est.peak()) << l.to_string();
        EXPECT_LE(steps.of(x.c, x.a, x.n, x.z, x.g), predict(ctx.model, ctx.run, l, ctx.cluster, ctx.constants).step)
            << l.to_string();
        ++checked;
      }
    }
    EXPECT_GT(checked, 100) << w.model;
    if (!w.fp8.empty() || ctx.cluster.device.has_fp8()) {
      bool fp8_seen = false;
      for (const auto& sub : subs) fp8_seen = fp8_seen || sub.shape.fp8 != Fp8Recipe::off;
      EXPECT_TRUE(fp8_seen) << w.model << " on " << w.gpu;
    }
  }
}

// FP8 is searched (off and tensorwise) on devices with FP8 tensor cores
// only; pins replace the list, and pinned FP8 on a GPU without it is
// pruned under the device's rule.
TEST(SpaceFp8, SearchedWhereTheDeviceHasIt) {
  const auto m = model_preset("llama3.1-8b");
  const RunSpec run{8192, 64, Precision::bf16};
  SpaceLimits lim;
  lim.tp = {1, 2};
  lim.mb = {1};
  const auto precisions = [](const std::vector<Layout>& v) {
    std::set<std::string> s;
    for (const auto& l : v) s.insert(gemm_precision_text(l));
    return s;
  };
  EXPECT_EQ(precisions(enumerate(m, run, 8, lim, device_preset("h100"))),
            (std::set<std::string>{"bf16", "fp8:tensorwise"}));
  EXPECT_EQ(precisions(enumerate(m, run, 8, lim, device_preset("h200"))),
            (std::set<std::string>{"bf16", "fp8:tensorwise"}));
  EXPECT_EQ(precisions(enumerate(m, run, 8, lim, device_preset("a100-80gb"))), (std::set<std::string>{"bf16"}));
  EXPECT_EQ(precisions(enumerate(m, run, 8, lim, device_preset("cpu"))), (std::set<std::string>{"bf16"}));
  EXPECT_EQ(precisions(enumerate(m, run, 8, lim, DeviceKind::gpu)), (std::set<std::string>{"bf16"}));
  lim.fp8 = {{Fp8Recipe::delayed, 1}};
  EXPECT_EQ(precisions(enumerate(m, run, 8, lim, device_preset("cpu"))), (std::set<std::string>{"fp8:delayed@1"}));
  const auto a100 = cluster_resolve("a100-80gb", 8, 8);
  const auto r = evaluate(m, run, a100, enumerate(m, run, 8, lim, a100.device), cost_defaults(a100.device));
  ASSERT_FALSE(r.candidates.empty());
  EXPECT_EQ(r.fitting, 0);
  EXPECT_NE(r.candidates.front().reason.find("fp8:delayed@1: a100-80gb (sm_80) has no FP8 tensor cores"),
            std::string::npos)
      << r.candidates.front().reason;
  // The best of an H100 space with FP8 free is an FP8 layout (Llama 3.1 8B).
  const auto h100 = cluster_resolve("h100", 8, 8);
  lim.fp8 = {};
  const auto best = evaluate(m, run, h100, enumerate(m, run, 8, lim, h100.device), cost_defaults(h100.device));
  ASSERT_GT(best.fitting, 0);
  EXPECT_EQ(best.candidates.front().layout.fp8, Fp8Recipe::tensorwise) << best.candidates.front().layout.to_string();
}

// The search predicts a sliver of a large space: Llama 3.1 8B at 128k
// tokens on 64 H100s (the full product of the knobs is over a million).
TEST(SpaceSearch, VisitsFewOfALargeSpace) {
  SpaceContext ctx;
  ctx.model = model_preset("llama3.1-8b");
  ctx.run = RunSpec{131072, 64, Precision::bf16};
  ctx.cluster = cluster_resolve("h100", 64, 8);
  ctx.constants = cost_defaults(ctx.cluster.device);
  const auto r = search(ctx, {}, 10);
  EXPECT_GT(r.evaluated, 1'000'000);
  EXPECT_LT(r.visited * 50, r.evaluated) << r.visited << " of " << r.evaluated;
  ASSERT_GT(r.fitting, 0);
  // The best splits the sequence, and among the layouts within 1% of the
  // fastest (ties the model cannot tell apart; the ranking orders them by
  // memory) one splits it at least 8 ways, by cp and sequence-parallel tp
  // (NeMo's llama3_8b_128k recipe splits it 32 ways: tp4 with sp, cp8; the
  // model's fastest 4-way and 8-way splits are 0.1% apart).
  EXPECT_GE(r.candidates.front().layout.cp, 2) << r.candidates.front().layout.to_string();
  double fastest = r.candidates.front().cost.step;
  for (const auto& c : r.candidates)
    if (c.verdict == Verdict::fits) fastest = std::min(fastest, c.cost.step);
  int64_t widest = 0;
  for (const auto& c : r.candidates)
    if (c.verdict == Verdict::fits && c.cost.step <= 1.01 * fastest)
      widest = std::max(widest, c.layout.cp * (c.layout.sp ? c.layout.tp : 1));
  EXPECT_GE(widest, 8);
}

}  // namespace
}  // namespace weft::tuner

namespace weft::tuner {
namespace {

// LoRA on Llama 3.1 70B at T = 4096 on 8 H100s: the frozen base (bf16, whole
// on every dp rank) with adapters alone trainable fits, recomputing less
// than full fine-tuning, which fits on no layout of 8 GPUs and first fits on
// 16 with every block recomputed. (Not the ZeRO stage: at dp 1 the stages
// cost the same, and the tie goes to the least memory.) The search, which prunes with bounds, finds the same best LoRA layout
// as predicting every layout.
TEST(SpaceSearch, LoraFitsWhereFullFineTuningDoesNot) {
  SpaceContext ctx;
  ctx.model = model_preset("llama3.1-70b");
  ctx.run = RunSpec{.seq = 4096, .global_batch = 64, .precision = Precision::bf16, .lora = LoraSpec::with_rank(16)};
  ctx.cluster = cluster_resolve("h100", 8, 8);
  ctx.constants = cost_defaults(ctx.cluster.device);
  SpaceLimits limits;
  limits.fp8 = {{Fp8Recipe::off, 0}};
  const auto lora = search(ctx, limits, 1);
  ASSERT_GT(lora.fitting, 0);
  const Layout best = lora.candidates.front().layout;
  const auto all = evaluate(ctx.model, ctx.run, ctx.cluster,
                            enumerate(ctx.model, ctx.run, 8, limits, ctx.cluster.device), ctx.constants, ctx.memory);
  EXPECT_EQ(all.candidates.front().layout.to_string(), best.to_string());
  SpaceContext full = ctx;
  full.run.lora = {};
  EXPECT_EQ(search(full, limits, 1).fitting, 0);
  full.cluster = cluster_resolve("h100", 16, 8);
  const auto sixteen = search(full, limits, 1);
  ASSERT_GT(sixteen.fitting, 0);
  const Layout f = sixteen.candidates.front().layout;
  // (Full checkpointing with the even split; a split one layer lighter on
  // the first stage frees it enough for ffn's.)
  EXPECT_NE(f.ckpt, Checkpointing::none) << f.to_string();
  EXPECT_LT(int(best.ckpt), int(f.ckpt)) << best.to_string() << " against " << f.to_string();
  std::printf("LoRA r16 on 8 H100: %s; full fine-tuning on 16: %s\n", best.to_string().c_str(), f.to_string().c_str());
}

// The bounded-memory ranking of a whole space (what --all and --exhaustive
// use past the rows held in memory) lists the same layouts in the same order
// with the same numbers as evaluate(), and counts the same prunes.
TEST(SpaceScan, RanksAsEvaluateDoes) {
  for (const auto& [model, gpu, gpus, seq] : std::vector<std::tuple<std::string, std::string, int64_t, int64_t>>{
           {"llama-13b", "a100-80gb", 8, 2048}, {"llama3.1-8b", "h100", 4, 8192}, {"tiny", "h100", 4, 256}}) {
    SpaceContext ctx;
    ctx.model = model_preset(model);
    ctx.run = RunSpec{seq, 64, Precision::bf16};
    ctx.cluster = cluster_resolve(gpu, gpus, 8);
    ctx.constants = cost_defaults(ctx.cluster.device);
    SpaceLimits limits;
    limits.mb = {1, 2};
    const SpaceReport whole = evaluate(ctx.model, ctx.run, ctx.cluster,
                                       enumerate(ctx.model, ctx.run, gpus, limits, ctx.cluster.device), ctx.constants,
                                       ctx.memory);
    const SpaceScan scan = space_scan(ctx, limits, ctx.cluster.device);
    const std::string what = fmt::format("{} on {} x {}", model, gpus, gpu);
    ASSERT_EQ(scan.size(), int64_t(whole.candidates.size())) << what;
    EXPECT_EQ(space_size(ctx, limits, ctx.cluster.device), scan.size()) << what;
    EXPECT_EQ(scan.summary.fitting, whole.fitting) << what;
    EXPECT_EQ(scan.summary.pruned, whole.pruned) << what;
    EXPECT_GT(whole.fitting, 0) << what;
    for (int64_t i = 0; i < scan.size(); ++i) {
      const Candidate c = scan.candidate(ctx, i);
      const Candidate& w = whole.candidates[size_t(i)];
      ASSERT_EQ(c.layout.to_string(), w.layout.to_string()) << what << " row " << i;
      ASSERT_EQ(c.verdict, w.verdict) << what << " row " << i;
      if (c.verdict == Verdict::invalid) continue;  // no prediction
      ASSERT_EQ(c.cost.step, w.cost.step) << what << " row " << i;
      ASSERT_EQ(c.memory.peak(), w.memory.peak()) << what << " row " << i;
    }
  }
}

}  // namespace
}  // namespace weft::tuner
