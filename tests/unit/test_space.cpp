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


// Every bound the search rules layouts out by lies at or under the layout's
// own value: the step bound under predict()'s step, the memory bound under
// the memory model's worst stage.
// The splits searched: the even one where L divides, the rest spread where
// it does not, and lighter ends where the vocabulary's table weighs a block
// or more.
// An MoE model's space folds ep over the dp x cp ranks: each degree that
// divides them and the experts, its tp x ep ranks within one NVLink domain
// unless pinned; and at tp > 1 (sp, etp1) over the tp ranks too (epfold),
// ep = tp x d for d of dp x cp, its ep ranks within the domain. ZeRO then
// over the expert data-parallel group, without a shard group of its own,
// and ZeRO-1 where that group is one rank (the dense state split over ep).
// Dense models keep ep 1; a pinned degree that does not divide is pruned
// with its rule.
TEST(SpaceExperts, EpIsSearchedWhereItDividesAndPrunedWithItsRule) {
  const ModelSpec m = model_preset("mixtral-8x7b");  // 8 experts
  const RunSpec run{4096, 256, Precision::bf16};
  const ClusterSpec c = cluster_resolve("h100", 64, 8);
  const auto all = enumerate(m, run, 64, {}, SpaceDevice(c));
  std::set<int64_t> eps;
  std::set<std::pair<int64_t, MoeDispatch>> dispatchers;
  bool split_experts = false, split_with_sp = false, zero1_one_edp = false;
  std::set<std::pair<int64_t, int64_t>> folds;  // (tp, ep)
  for (const auto& l : all) {
    if (l.ep_fold) {
      folds.insert({l.tp, l.ep});
      EXPECT_TRUE(l.sp && l.etp == 1 && l.tp > 1 && l.ep % l.tp == 0) << l.to_string();
    }
    EXPECT_TRUE(l.etp == 1 || l.etp == l.tp) << l.to_string();
    split_experts = split_experts || (l.etp > 1 && l.ep > 1);
    split_with_sp = split_with_sp || (l.etp > 1 && l.sp);
    eps.insert(l.ep);
    dispatchers.insert({std::min<int64_t>(l.ep, 3), l.dispatch});
    EXPECT_EQ((l.dp * l.cp) % l.ep_dpcp(), 0) << l.to_string();
    EXPECT_EQ(m.moe.experts % l.ep, 0) << l.to_string();
    EXPECT_LE(l.ep_fold ? l.ep : l.tp * l.ep, 8) << l.to_string();  // the ep group within a node
    if (l.ep > 1) {
      EXPECT_EQ(l.zero_group, 0) << l.to_string();
      // One rank holding each expert: ZeRO-1 still splits the dense state
      // over the ep replicas (memory/dense_split.h); ZeRO-2 and -3 add nothing.
      if (l.expert_dp() == 1) {
        EXPECT_LE(l.zero, l.zero_replicas() > 1 ? 1 : 0) << l.to_string();
      }
      zero1_one_edp = zero1_one_edp || (l.expert_dp() == 1 && l.zero == 1);
    }
  }
  EXPECT_EQ(eps, (std::set<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(folds, (std::set<std::pair<int64_t, int64_t>>{{2, 2}, {2, 4}, {2, 8}, {4, 4}, {4, 8}, {8, 8}}));
  EXPECT_TRUE(split_experts);
  EXPECT_TRUE(split_with_sp);
  EXPECT_TRUE(zero1_one_edp);
  // Both dispatchers at ep 2, all-to-all past it (the all-gather pinned only),
  // none to choose at ep 1.
  EXPECT_EQ(dispatchers, (std::set<std::pair<int64_t, MoeDispatch>>{{1, MoeDispatch::a2a},
                                                                    {2, MoeDispatch::a2a},
                                                                    {2, MoeDispatch::allgather},
                                                                    {3, MoeDispatch::a2a}}));
  for (const auto& l : enumerate(model_preset("llama3.1-8b"), run, 64, {}, SpaceDevice(c))) ASSERT_EQ(l.ep, 1);

  SpaceLimits pinned;
  pinned.ep = {16};
  pinned.tp = {1};
  pinned.cp = {1};
  pinned.pp = {1};
  const auto r = evaluate(m, run, c, enumerate(m, run, 64, pinned, SpaceDevice(c)), cost_defaults(c.device));
  ASSERT_GT(r.evaluated, 0);
  EXPECT_EQ(r.fitting, 0);
  EXPECT_EQ(r.pruned.begin()->first, "invalid: ep") << r.candidates.front().reason;
  EXPECT_NE(r.candidates.front().reason.find("ep=16 must divide the 8 routed experts"), std::string::npos)
      << r.candidates.front().reason;
}

TEST(SpaceSplit, LighterEndsWhereTheTablesAreHeavyOrLDoesNotDivide) {
  const auto tiny = model_preset("tiny");  // 256 x 128 table against a 184,576-parameter block
  EXPECT_NEAR(vocab_table_blocks(tiny, 1), 0.18, 0.01);
  EXPECT_EQ(pipeline_splits(tiny, 1, 4), (std::vector<std::vector<int64_t>>{{}}));
  EXPECT_EQ(pipeline_vpps(tiny, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(pipeline_vpps(tiny, 8).empty());  // L + 2 < pp
  const auto l8b = model_preset("llama3.1-8b");    // 128,256 x 4,096: 2.4 blocks
  EXPECT_NEAR(vocab_table_blocks(l8b, 8), 2.4, 0.1);
  const auto splits = pipeline_splits(l8b, 8, 4);
  EXPECT_EQ(splits, (std::vector<std::vector<int64_t>>{{}, {8, 9, 9, 6}, {7, 9, 10, 6}}));
  EXPECT_EQ(pipeline_vpps(l8b, 2), (std::vector<int64_t>{1, 2, 4, 8, 16}));  // not 17: L divides by pp
  // 405B: L = 126 over pp 8 x vpp 8 only with the embedding and the loss
  // counted as layers, the published split among them.
  const auto big = model_preset("llama3.1-405b");
  const auto vpps = pipeline_vpps(big, 8);
  EXPECT_NE(std::find(vpps.begin(), vpps.end(), 8), vpps.end());
  const auto s405 = pipeline_splits(big, 8, 64);
  EXPECT_NE(std::find(s405.begin(), s405.end(), *edge_split(126, 64, 1, 1)), s405.end());
  // A prime L: pp 2 splits it every way near the middle.
  ModelSpec prime = model_preset("tiny-test");
  prime.layers = 7;
  EXPECT_EQ(pipeline_splits(prime, 1, 2), (std::vector<std::vector<int64_t>>{{3, 4}, {4, 3}}));
  EXPECT_EQ(pipeline_vpps(prime, 2), (std::vector<int64_t>{1}));
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

}  // namespace
}  // namespace weft::tuner
