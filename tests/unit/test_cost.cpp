#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "tuner/cost.h"
#include "test_util.h"

namespace weft::tuner {
namespace {

struct Cost : ::testing::Test {
  ModelSpec m = model_preset("llama-13b");
  RunSpec run{2048, 2048, Precision::bf16};
  ClusterSpec c = cluster_resolve("a100-80gb", 64, 8);
  CostConstants k = cost_defaults(c.device);
  CostBreakdown p(const std::string& layout) { return predict(m, run, Layout::parse(layout), c, k); }
};

TEST_F(Cost, PartsSumToStepAndMfuFollowsTheFormula) {
  const auto b = p("tp2-pp2-dp16-mb1-zero1");
  EXPECT_NEAR(b.step, b.compute + b.recompute + b.tp_comm + b.pp_bubble + b.pp_p2p + b.dp_comm + b.optimizer,
              1e-12 * b.step);
  EXPECT_DOUBLE_EQ(b.peak_flops, 312e12);
  EXPECT_NEAR(b.mfu, model_flops_per_step(m, run) / (b.step * 64 * 312e12), 1e-12);
  EXPECT_NEAR(b.tokens_per_second, 2048.0 * 2048 / b.step, 1e-6);
  EXPECT_GT(b.mfu, 0.3);
  EXPECT_LT(b.mfu, 0.9);
}

TEST_F(Cost, BubbleIsTheOneFOneBFraction) {
  // bubble / (ideal) = (pp - 1) / (m * vpp) for the slowest stage.
  for (auto [layout, pp, vpp, mbs] : {std::tuple{"tp1-pp4-dp16-mb1", 4, 1, 128},
                                      std::tuple{"tp1-pp4-dp16-mb8", 4, 1, 16},
                                      std::tuple{"tp1-pp4-dp16-mb8-vpp2", 4, 2, 16}}) {
    const auto b = p(layout);
    const double per_mb = (b.compute + b.recompute + b.tp_comm) / mbs;
    EXPECT_NEAR(b.pp_bubble, double(pp - 1) / vpp * per_mb, 1e-9 * b.step) << layout;
  }
  EXPECT_EQ(p("tp1-pp1-dp64").pp_bubble, 0);
}

TEST_F(Cost, KnobsCostWhatTheyShould) {
  const auto base = p("tp2-pp2-dp16-mb1-zero1");
  EXPECT_GT(p("tp2-pp2-dp16-mb1-zero1-attn:materialized").compute, base.compute);
  // cuDNN's fused attention is priced as flash; the profiler tells them apart.
  EXPECT_EQ(p("tp2-pp2-dp16-mb1-zero1-attn:cudnn").compute, base.compute);
  EXPECT_GT(p("tp2-pp2-dp16-mb1-zero1-norm:unfused").compute, base.compute);
  EXPECT_GT(p("tp2-pp2-dp16-mb1-zero1-ckpt:full").recompute, p("tp2-pp2-dp16-mb1-zero1-ckpt:selective").recompute);
  EXPECT_GT(p("tp2-pp2-dp16-mb1-zero1-ckpt:full").step, p("tp2-pp2-dp16-mb1-zero1-ckpt:full@5").step);
  EXPECT_EQ(base.recompute, 0);
  EXPECT_EQ(p("tp1-pp4-dp16").tp_comm, 0);
  EXPECT_EQ(p("tp8-pp8-dp1").dp_comm, 0);
  // TP across nodes is slower than inside one.
  EXPECT_GT(p("tp16-pp1-dp4-mb1").tp_comm / p("tp8-pp1-dp8-mb1").tp_comm, 2.0);
}

TEST_F(Cost, Bf16GradientsHalveTheDataParallelVolume) {
  // ZeRO-2 reduces every micro-batch, which no backward hides entirely.
  c = cluster_resolve("a100-80gb", 64, 1);  // every dp group crosses nodes
  const auto f = p("tp1-pp1-dp64-mb1-zero2");
  const auto b = p("tp1-pp1-dp64-mb1-zero2-grad:bf16");
  EXPECT_GT(f.dp_comm, 0);
  EXPECT_LT(b.dp_comm, f.dp_comm);
  EXPECT_LT(b.optimizer, f.optimizer);
  EXPECT_EQ(b.compute, f.compute);
  EXPECT_EQ(p("tp8-pp8-dp1-grad:bf16").dp_comm, 0);
}

TEST_F(Cost, GroupsArePricedAtTheSlowestLinkTheySpan) {
  // A data-parallel group inside a node crosses no network; one over nodes does.
  c = cluster_resolve("a100-80gb", 8, 8);
  const double inside = p("tp1-pp1-dp8-mb1-zero2").dp_comm;
  c = cluster_resolve("a100-80gb", 8, 1);
  const double across = p("tp1-pp1-dp8-mb1-zero2").dp_comm;
  EXPECT_GT(across, 3 * inside);
  // Fewer network ports per node: slower data-parallel reductions across nodes.
  c = cluster_resolve("a100-80gb", 64, 8);
  const double full = p("tp1-pp1-dp64-mb1-zero2").dp_comm;
  c.nics_per_node = 2;
  const double two_nics = p("tp1-pp1-dp64-mb1-zero2").dp_comm;
  EXPECT_GT(two_nics, 2 * full);
  // Tensor parallelism inside the NVLink domain is unaffected by the network.
  const double tp8_two_nics = p("tp8-pp1-dp8-mb1").tp_comm;
  c.nics_per_node = 8;
  EXPECT_DOUBLE_EQ(p("tp8-pp1-dp8-mb1").tp_comm, tp8_two_nics);
  // An NVLink domain of 16 (two nodes on one NVLink fabric) keeps tp16 off
  // the network: about half the time of tp16 over two nodes' ports.
  const double tp16_net = p("tp16-pp1-dp4-mb1").tp_comm;
  c.nvlink_domain = 16;
  EXPECT_LT(p("tp16-pp1-dp4-mb1").tp_comm, 0.6 * tp16_net);
}

TEST(CostModel, GemmEfficiencyGrowsWithSize) {
  const auto dev = device_preset("h100");
  const auto k = cost_defaults(dev);
  EXPECT_LT(gemm_efficiency(128, 128, 64, dev, k), gemm_efficiency(8192, 8192, 8192, dev, k));
  EXPECT_LE(gemm_efficiency(8192, 8192, 8192, dev, k), k.gemm_efficiency);
  EXPECT_GT(gemm_efficiency(8192, 8192, 8192, dev, k), 0.9 * k.gemm_efficiency);
}

TEST(CostModel, ConstantsRoundTripJson) {
  auto k = cost_defaults(device_preset("a100-80gb"));
  k.overlap_cost = 0.3;
  const nlohmann::json j = k;
  EXPECT_EQ(j.get<CostConstants>(), k);
}

}  // namespace
}  // namespace weft::tuner
