#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "memory/shapes.h"
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
  EXPECT_EQ(b.cp_comm, 0);
  const auto c = p("tp2-cp2-pp2-dp8-mb1-zero1-cp:allgather");
  EXPECT_GT(c.cp_comm, 0);
  EXPECT_NEAR(c.step,
              c.compute + c.recompute + c.tp_comm + c.cp_comm + c.pp_bubble + c.pp_p2p + c.dp_comm + c.optimizer,
              1e-12 * c.step);
  EXPECT_EQ(nlohmann::json(c)["cp_comm_s"].get<double>(), c.cp_comm);
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
  // No cuDNN attention measured on an A100: priced as flash.
  EXPECT_EQ(k.cudnn_efficiency, k.flash_efficiency);
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

// The backward's collectives that the trainer runs beside its GEMMs
// (block_backward): hidden where the GEMMs outlast them, at the overlap
// cost's share. Per block with sp, the forward's 2 all-gathers and 2
// reduce-scatters and the backward's 2 gathers of the output gradient wait
// for their GEMMs, and the 2 re-gathers and 2 reduce-scatters run beside
// GEMMs: 6 of 10 like transfers shown. Without sp the forward's 2
// all-reduces are shown and the backward's 2 run beside the weight
// gradients: 2 of 4. (The embedding's and head's collectives, a few more
// shown, move it a little.)
TEST_F(Cost, TheBackwardHidesItsTensorParallelCollectivesBehindItsGemms) {
  for (auto [layout, shown] : {std::pair{"tp2-pp1-dp32-mb1-sp", 0.6}, std::pair{"tp2-pp1-dp32-mb1", 0.5}}) {
    k.overlap_cost = 1;  // each hidden second costs a second: nothing gained
    const double all = p(layout).tp_comm;
    k.overlap_cost = 0;
    const double part = p(layout).tp_comm;
    EXPECT_NEAR(part / all, shown, 0.02) << layout;
  }
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

// Context parallelism: each rank computes on T/cp tokens and 1/cp of the
// causal attention, and its exchanges are priced per transport on the link
// its tp * cp consecutive ranks span.
struct ContextParallel : ::testing::Test {
  ModelSpec m = model_preset("llama3.1-8b");
  RunSpec run{32768, 64, Precision::bf16};
  ClusterSpec c = cluster_resolve("h100", 64, 8);
  CostConstants k = cost_defaults(c.device);
  CostBreakdown p(const std::string& layout) { return predict(m, run, Layout::parse(layout), c, k); }
  // NVLink's bus bandwidth, as cost.cpp prices collectives inside a node.
  double intra_bw() const { return c.device.intra_node_bandwidth * k.intra_efficiency; }
};

TEST_F(ContextParallel, EachRankComputesItsShareOfTheSequence) {
  // The same dp x cp ranks share the batch: cp 4 makes each micro-batch a
  // quarter of the tokens per rank and 4x as many micro-batches, so the
  // compute per step stays within the GEMMs' efficiency of cp 1's.
  const auto one = p("tp1-pp1-dp64-mb1");
  const auto four = p("tp1-cp4-pp1-dp16-mb1-cp:allgather");
  EXPECT_NEAR(four.compute / one.compute, 1.0, 0.1);
  EXPECT_EQ(one.cp_comm, 0);
  // Gradients sum and ZeRO shards over dp x cp: cp 8 with dp 1 still reduces.
  EXPECT_GT(p("tp1-cp8-pp1-dp8-mb1-zero1-cp:allgather").dp_comm, 0);
  EXPECT_LT(p("tp1-cp8-pp1-dp8-mb1-zero1-cp:allgather").optimizer, p("tp1-pp1-dp64-mb1-zero1").optimizer * 1.01);
  EXPECT_GT(p("tp8-cp8-pp1-dp1-mb1-zero1-cp:ring").dp_comm, 0);
}

TEST_F(ContextParallel, AllGatherAndAllToAllArePricedByTheirVolumes) {
  // Inside one node (tp1 x cp8 = 8 ranks) over NVLink: per layer and
  // micro-batch, all-gather moves K and V of the whole sequence forward,
  // again in the backward, and reduce-scatters dK and dV; all-to-all moves
  // q, k, v, out forward and q, k, v, out, dout, dq, dk, dv backward.
  const double n = 8, B = 1, T = double(run.seq), a = 2, D = double(m.head_dim);
  const double Hl = double(m.heads), Kl = double(m.kv_heads), layers = double(m.layers);
  const double mbs = double(run.global_batch) / 8;  // dp 8, mb 1
  const double lat = c.device.intra_node_latency;
  const double full = 2 * B * T * Kl * D * a;
  const double gather = (n - 1) / n * full / intra_bw() + (n - 1) * lat;
  EXPECT_NEAR(p("tp1-cp8-pp1-dp8-mb1-cp:allgather").cp_comm, mbs * layers * 3 * gather, 1e-9);
  const auto a2a = [&](double bytes) { return (n - 1) / n * bytes / intra_bw() + (n - 1) * lat; };
  const double q = B * T / n * Hl * D * a, kv = B * T / n * Kl * D * a;
  EXPECT_NEAR(p("tp1-cp8-pp1-dp8-mb1-cp:a2a").cp_comm, mbs * layers * 3 * (2 * a2a(q) + 2 * a2a(kv)), 1e-9);
  // Recomputing the attention redoes no all-gather: the backward gathers anyway.
  EXPECT_EQ(p("tp1-cp8-pp1-dp8-mb1-ckpt:selective-cp:allgather").cp_comm,
            p("tp1-cp8-pp1-dp8-mb1-cp:allgather").cp_comm);
}

TEST_F(ContextParallel, TheRingHidesWhatTheAttentionOutlasts) {
  // At 32k tokens a block's attention outlasts its K/V transfer over
  // NVLink: nothing exposed but the overlap's cost and the last hop of each
  // block's dK and dV home, which no attention is left to hide.
  k.overlap_cost = 0;
  {
    const double B = 1, a = 2, D = double(m.head_dim), Kl = double(m.kv_heads), cp = 8;
    const double block = 2 * B * double(run.seq) / cp * Kl * D * a;  // K and V of a rank's chunks
    const double hop = block / intra_bw() + c.device.intra_node_latency;
    const double mbs = double(run.global_batch) / 8;  // dp 8, mb 1
    EXPECT_NEAR(p("tp1-cp8-pp1-dp8-mb1-cp:ring").cp_comm, mbs * double(m.layers) * hop, 1e-9);
  }
  // At 2k tokens over the network (cp 16 spans two nodes) it does not: the
  // transfer past the compute is exposed, forward and (twice the volume)
  // backward, and recomputing the attention passes K and V around again.
  run = RunSpec{2048, 64, Precision::bf16};
  const auto ring = p("tp1-cp16-pp1-dp4-mb1-cp:ring");
  EXPECT_GT(ring.cp_comm, 0);
  EXPECT_GT(p("tp1-cp16-pp1-dp4-mb1-ckpt:selective-cp:ring").cp_comm, ring.cp_comm);
  // The same ring inside a 16-GPU NVLink domain is cheaper.
  c.nvlink_domain = 16;
  EXPECT_LT(p("tp1-cp16-pp1-dp4-mb1-cp:ring").cp_comm, ring.cp_comm);
}

TEST_F(ContextParallel, TheGroupSpansTpTimesCpConsecutiveRanks) {
  // tp1 x cp8 fits a node's NVLink; tp2 x cp8 spans two nodes, so its
  // exchanges cross the network.
  const double inside = p("tp1-cp8-pp1-dp8-mb1-cp:allgather").cp_comm;
  const double across = p("tp2-cp8-pp1-dp4-mb1-cp:allgather").cp_comm;
  // The same bytes per step (half the kv heads per rank, twice the
  // micro-batches), over the network.
  EXPECT_GT(across, 1.2 * inside);
  c.nvlink_domain = 16;
  EXPECT_LT(p("tp2-cp8-pp1-dp4-mb1-cp:allgather").cp_comm, across);
}

TEST(CostModel, GemmEfficiencyGrowsWithSize) {
  const auto dev = device_preset("h100");
  const auto k = cost_defaults(dev);
  EXPECT_LT(gemm_efficiency(128, 128, 64, dev, k), gemm_efficiency(8192, 8192, 8192, dev, k));
  EXPECT_LE(gemm_efficiency(8192, 8192, 8192, dev, k), k.gemm_efficiency);
  EXPECT_GT(gemm_efficiency(8192, 8192, 8192, dev, k), 0.9 * k.gemm_efficiency);
}

// FP8 GEMMs: the blocks' linear layers at the FP8 peak, their operands'
// casts as memory-bound passes, and MFU still against the bf16 peak.
struct Fp8 : ::testing::Test {
  ModelSpec m = model_preset("llama3.1-8b");
  RunSpec run{8192, 64, Precision::bf16};
  ClusterSpec c = cluster_resolve("h100", 8, 8);
  CostConstants k = cost_defaults(c.device);
  CostBreakdown p(const std::string& layout) { return predict(m, run, Layout::parse(layout), c, k); }
};

TEST_F(Fp8, FasterOnLargeGemmsAndMfuStaysAgainstTheBf16Peak) {
  const auto bf16 = p("tp1-pp1-dp8-mb1-ckpt:selective-zero1");
  const auto f8 = p("tp1-pp1-dp8-mb1-ckpt:selective-zero1-fp8:tensorwise");
  EXPECT_LT(f8.compute, bf16.compute);
  EXPECT_LT(f8.step, bf16.step);
  // Not twice as fast: attention, norms, the loss and the casts stay.
  EXPECT_GT(f8.step, 0.5 * bf16.step);
  EXPECT_DOUBLE_EQ(f8.peak_flops, 989.4e12);
  EXPECT_NEAR(f8.mfu, model_flops_per_step(m, run) / (f8.step * 8 * 989.4e12), 1e-12);
  EXPECT_DOUBLE_EQ(f8.fp8_peak_flops, 1978.9e12);
  EXPECT_NEAR(f8.fp8_peak_utilization, f8.mfu * 989.4 / 1978.9, 1e-12);
  EXPECT_EQ(bf16.fp8_peak_flops, 0);
  const nlohmann::json j = f8;
  EXPECT_DOUBLE_EQ(j.at("fp8_peak_utilization").get<double>(), f8.fp8_peak_utilization);
  EXPECT_FALSE(nlohmann::json(bf16).contains("fp8_peak_flops"));
}

TEST_F(Fp8, SmallGemmsGainLittleOrLose) {
  // The FP8 efficiency falls faster with a short K than bf16's.
  const auto& d = c.device;
  const double fp8_small = fp8_gemm_efficiency(1024, 1024, 256, d, k) / fp8_gemm_efficiency(8192, 8192, 8192, d, k);
  const double bf16_small = gemm_efficiency(1024, 1024, 256, d, k) / gemm_efficiency(8192, 8192, 8192, d, k);
  EXPECT_LT(fp8_small, bf16_small);
  // A small model at a short sequence: the casts cost what the GEMMs save.
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 8;
  m.head_dim = 64;
  m.intermediate = 1408;
  m.layers = 8;
  run = RunSpec{512, 64, Precision::bf16};
  const auto bf16 = p("tp1-pp1-dp8-mb1");
  const auto f8 = p("tp1-pp1-dp8-mb1-fp8:tensorwise");
  EXPECT_GT(f8.step, 0.97 * bf16.step) << f8.step << " vs " << bf16.step;
}

TEST_F(Fp8, CastsAreMemoryBoundPassesAndTensorwiseReducesEachAmax) {
  // Delayed scaling casts in one pass, tensorwise reads each operand once
  // more for its amax and all-reduces it over tp * cp.
  const auto tw = p("tp2-pp1-dp4-mb1-sp-fp8:tensorwise");
  const auto dl = p("tp2-pp1-dp4-mb1-sp-fp8:delayed");
  EXPECT_GT(tw.compute, dl.compute);
  EXPECT_GT(tw.tp_comm, dl.tp_comm);
  EXPECT_GT(dl.dp_comm, p("tp2-pp1-dp4-mb1-sp-fp8:tensorwise").dp_comm);  // one world all-reduce a step
  // Without tp or cp there is no group to reduce the amax over.
  EXPECT_EQ(p("tp1-pp1-dp8-mb1-fp8:tensorwise").tp_comm, 0);
  // Slower memory makes the casts dearer, and leaves bf16 alone.
  const auto before = p("tp1-pp1-dp8-mb1-fp8:tensorwise"), bf16 = p("tp1-pp1-dp8-mb1");
  c.device.memory_bandwidth /= 4;
  EXPECT_GT(p("tp1-pp1-dp8-mb1-fp8:tensorwise").compute - before.compute,
            p("tp1-pp1-dp8-mb1").compute - bf16.compute);
  // The weights' FP8 copies are cast once a step, with the optimizer.
  c.device.memory_bandwidth *= 4;
  EXPECT_GT(p("tp1-pp1-dp8-mb1-fp8:delayed").optimizer, bf16.optimizer);
}

TEST_F(Fp8, GemmsWhoseDimsAreNotMultiplesOf16StayBf16) {
  EXPECT_TRUE(fp8_gemm_shape(8192, 4096, 14336));
  EXPECT_FALSE(fp8_gemm_shape(8192, 4096, 100));
  EXPECT_FALSE(fp8_gemm_shape(8200 / 2 + 4, 4096, 4096));
  // 1000 tokens per micro-batch: no GEMM of the blocks runs in FP8, so the
  // recipe costs nothing and gains nothing.
  run = RunSpec{1000, 64, Precision::bf16};
  const auto bf16 = p("tp1-pp1-dp8-mb1"), f8 = p("tp1-pp1-dp8-mb1-fp8:tensorwise");
  EXPECT_DOUBLE_EQ(f8.step, bf16.step);
}

// Block scaling: GEMMs whose K, N and runs of tokens are multiples of 128;
// no amax pass or reduction, a slower GEMM (kFp8BlockGemmRate).
// Under sequence parallelism FP8 blocks gather the norms' outputs as codes,
// one byte an element, in the forward and in the backward's re-gather (the
// trainer casts first); the output gradients' gathers and the
// reduce-scatters stay bf16. Delayed scaling reduces no amax in the block,
// so with nothing hidden its tp time is bf16's less those four gathers'
// halves; without sp it is bf16's.
TEST_F(Fp8, SequenceParallelGathersCodes) {
  k.overlap_cost = 1;
  const double bf16 = p("tp4-pp1-dp2-mb1-sp").tp_comm, f8 = p("tp4-pp1-dp2-mb1-sp-fp8:delayed").tp_comm;
  // Per block 10 like transfers, 4 of them at half the bytes: 8 of 10.
  EXPECT_NEAR(f8 / bf16, 0.8, 0.03);
  EXPECT_DOUBLE_EQ(p("tp4-pp1-dp2-mb1-fp8:delayed").tp_comm, p("tp4-pp1-dp2-mb1").tp_comm);
}

TEST_F(Fp8, BlockScalingNeedsMultiplesOf128AndReducesNoAmax) {
  const Layout tw = Layout::parse("tp2-pp1-dp4-mb1-fp8:tensorwise"), bw = Layout::parse("tp2-pp1-dp4-mb1-fp8:blockwise");
  for (const auto& s : memory::fp8_gemm_shapes(m, run, bw)) EXPECT_TRUE(s.fp8) << s.K << " x " << s.N;
  // cp 32 leaves chunks of 128 tokens, cp 64 of 64: then nothing is blockwise
  // (tensorwise takes any multiple of 16).
  EXPECT_TRUE(memory::fp8_gemm_shapes(m, run, Layout::parse("tp1-cp32-pp1-dp1-fp8:blockwise"))[0].fp8);
  EXPECT_FALSE(memory::fp8_gemm_shapes(m, run, Layout::parse("tp1-cp64-pp1-dp1-fp8:blockwise"))[0].fp8);
  EXPECT_TRUE(memory::fp8_gemm_shapes(m, run, Layout::parse("tp1-cp64-pp1-dp1-fp8:tensorwise"))[0].fp8);
  // tp 8 splits 8 kv heads of 128 into one head a rank: N 128 for k and v.
  const auto tp8 = memory::fp8_gemm_shapes(m, run, Layout::parse("tp8-pp1-dp1-fp8:blockwise"));
  EXPECT_TRUE(tp8[1].fp8);
  // No amax pass (delayed has none either) and no amax all-reduce over tp
  // (tensorwise reduces each one); GEMMs at 0.9 of the per-tensor rate.
  const auto bf16 = p("tp2-pp1-dp4-mb1"), t = predict(m, run, tw, c, k), b = predict(m, run, bw, c, k);
  const auto d = p("tp2-pp1-dp4-mb1-fp8:delayed");
  EXPECT_LT(b.step, bf16.step);
  EXPECT_GT(b.compute, d.compute);
  EXPECT_LT(b.compute, bf16.compute);
  EXPECT_LT(b.tp_comm, t.tp_comm);
  // The same collectives as bf16's; FP8's shorter GEMMs hide less of the
  // backward's.
  EXPECT_GE(b.tp_comm, bf16.tp_comm);
  EXPECT_LT(b.tp_comm, 1.5 * bf16.tp_comm);
}

TEST_F(Fp8, BlocksKeptInBf16AtEachEnd) {
  // Stage s holds virtual stages s, s + pp, ...: at L 32, pp 4, vpp 2 and
  // fp8@1, stage 0 holds blocks 0-3 and 16-19 (block 0 in bf16), stage 3
  // blocks 12-15 and 28-31 (block 31 in bf16).
  const Layout l = Layout::parse("tp1-pp4-dp2-mb1-vpp2-fp8:delayed@1");
  EXPECT_EQ(fp8_stage_blocks(m, l, 0), 7);
  EXPECT_EQ(fp8_stage_blocks(m, l, 1), 8);
  EXPECT_EQ(fp8_stage_blocks(m, l, 3), 7);
  EXPECT_EQ(fp8_stage_blocks(m, Layout::parse("tp1-pp4-dp2-mb1-vpp2"), 0), 0);
  EXPECT_EQ(fp8_stage_blocks(m, Layout::parse("tp1-pp1-dp8-mb1-fp8:delayed@2"), 0), 28);
  // More bf16 blocks, a slower step, between all-FP8 and none.
  const double all = p("tp1-pp1-dp8-mb1-fp8:delayed").step, some = p("tp1-pp1-dp8-mb1-fp8:delayed@4").step,
               none = p("tp1-pp1-dp8-mb1").step;
  EXPECT_LT(all, some);
  EXPECT_LT(some, none);
}

TEST_F(Fp8, EmulatedOnTheCpuItOnlyCosts) {
  c = cluster_resolve("cpu", 2, 2);
  k = cost_defaults(c.device);
  m = model_preset("tiny");
  run = RunSpec{256, 16, Precision::fp32};
  const auto f8 = p("tp1-pp1-dp2-mb1-fp8:tensorwise");
  EXPECT_GT(f8.step, p("tp1-pp1-dp2-mb1").step);
  EXPECT_EQ(f8.fp8_peak_flops, 0);
}

TEST_F(Cost, CudnnAttentionHasAnEfficiencyOfItsOwn) {
  // Twice flash's efficiency halves the attention's time and nothing else.
  const auto flash = p("tp2-pp2-dp16-mb1-zero1"), same = p("tp2-pp2-dp16-mb1-zero1-attn:cudnn");
  k.cudnn_efficiency = 2 * k.flash_efficiency;
  const auto faster = p("tp2-pp2-dp16-mb1-zero1-attn:cudnn");
  const auto& l = Layout::parse("tp2-pp2-dp16-mb1-zero1");
  // Per block and micro-batch: 4 B H T^2 D / 2 FLOPs, 3.5x with the backward,
  // on tp's share of the heads; m micro-batches of L / pp blocks per stage.
  const double flops = 3.5 * 4.0 * 1 * (m.heads / l.tp) * double(run.seq) * run.seq * m.head_dim * 0.5;
  const double mbs = double(run.global_batch) / l.dp, blocks = double(m.layers) / l.pp;
  const double T = double(run.seq), at_length = T / (T + k.attention_t_half);
  const double attention = mbs * blocks * flops / (c.device.peak_flops("bf16") * k.flash_efficiency * at_length);
  EXPECT_NEAR(same.compute - faster.compute, attention / 2, 1e-6 * same.compute);
  EXPECT_EQ(same.compute, flash.compute);
  EXPECT_EQ(faster.tp_comm, flash.tp_comm);
  // On Hopper, measured: cuDNN's kernel beats the flash kernels.
  const auto h = cost_defaults(device_preset("h100"));
  EXPECT_GT(h.cudnn_efficiency, h.flash_efficiency);
  // And its efficiency at T 2048 and 8192 is what the H200 measured (0.42
  // and 0.53 of the bf16 peak, benchmarks/RESULTS.md) within 2%.
  const auto at = [&](double t) { return h.cudnn_efficiency * t / (t + h.attention_t_half); };
  EXPECT_NEAR(at(2048), 416.0 / 989.4, 0.02 * 416.0 / 989.4);
  EXPECT_NEAR(at(8192), 522.0 / 989.4, 0.02 * 522.0 / 989.4);
  // A profile written before the length term prices every length alike.
  CostConstants before;
  from_json(nlohmann::json{{"flash_efficiency", 0.3}}, before);
  EXPECT_EQ(before.attention_t_half, 0);
  // A profile written before the constant existed prices cuDNN as flash.
  nlohmann::json old = h;
  old.erase("cudnn_efficiency");
  EXPECT_EQ(old.get<CostConstants>().cudnn_efficiency, h.flash_efficiency);
}

// Uneven pipeline splits: the slowest stage sets the pace. With a 128k
// vocabulary the last stage's head weighs over two blocks, so moving
// layers off it shortens the step; moving them onto it lengthens it, and a
// middle stage holding more blocks is priced too.
TEST(CostModel, TheSlowestStageOfAnUnevenSplitSetsThePace) {
  const auto m = model_preset("llama3.1-8b");
  const RunSpec run{8192, 64, Precision::bf16};
  const auto c = cluster_resolve("h100", 32, 8);
  const auto k = cost_defaults(c.device);
  const auto step = [&](const std::string& l) { return predict(m, run, Layout::parse(l), c, k).step; };
  const double even = step("tp8-pp4-dp1-mb1");
  EXPECT_LT(step("tp8-pp4-dp1-mb1-split:8.9.9.6"), even);
  EXPECT_GT(step("tp8-pp4-dp1-mb1-split:7.7.7.11"), even);
  EXPECT_GT(step("tp8-pp4-dp1-mb1-split:2.14.14.2"), step("tp8-pp4-dp1-mb1-split:8.9.9.6"));
  // Parts still sum to the step.
  const auto b = predict(m, run, Layout::parse("tp8-pp4-dp1-mb1-vpp2-split:3.4x2.5x4.1"), c, k);
  EXPECT_NEAR(b.step, b.compute + b.recompute + b.tp_comm + b.cp_comm + b.pp_bubble + b.pp_p2p + b.dp_comm + b.optimizer,
              1e-12 * b.step);
}

// Hybrid sharding: ZeRO-3's gathers and reduce-scatters inside a node's
// NVLink, and only each shard's all-reduce over the network, beat sharding
// over every node on a model whose state is large against its compute;
// each rank then keeps 8 times the optimizer state of ZeRO-3 over 64, and
// updates as much.
TEST_F(Cost, HybridShardingKeepsZero3sTrafficOnNvlink) {
  c = cluster_resolve("a100-80gb", 64, 8);
  const auto plain = p("tp1-pp1-dp64-mb1-zero3"), hybrid = p("tp1-pp1-dp64-mb1-zero3@8");
  EXPECT_LT(hybrid.dp_comm, 0.5 * plain.dp_comm) << hybrid.dp_comm << " vs " << plain.dp_comm;
  EXPECT_NEAR(hybrid.optimizer, 8 * plain.optimizer, 0.05 * hybrid.optimizer);
  EXPECT_EQ(hybrid.compute, plain.compute);
  // The two levels cost more than one where the group already fits a node.
  c = cluster_resolve("a100-80gb", 8, 8);
  EXPECT_GT(p("tp1-pp1-dp8-mb1-zero1@4").dp_comm, p("tp1-pp1-dp8-mb1-zero1").dp_comm);
  // Parts still sum to the step.
  const auto b = p("tp1-pp1-dp8-mb1-zero2@2");
  EXPECT_NEAR(b.step, b.compute + b.recompute + b.tp_comm + b.cp_comm + b.pp_bubble + b.pp_p2p + b.dp_comm + b.optimizer,
              1e-12 * b.step);
}

TEST(CostModel, ConstantsRoundTripJson) {
  auto k = cost_defaults(device_preset("a100-80gb"));
  k.overlap_cost = 0.3;
  const nlohmann::json j = k;
  EXPECT_EQ(j.get<CostConstants>(), k);
}

// Under expert parallelism the busiest ep rank sets the step: the stated
// imbalance prices its experts' GEMMs, SwiGLU and the all-to-all's bytes at
// f times balanced routing's, at most what a capacity lets through; without
// ep every rank computes all its own rows' choices, however they route.
TEST(CostMoe, TheBusiestExpertRankSetsTheStep) {
  const RunSpec run{4096, 256, Precision::bf16};
  const ClusterSpec c = cluster_resolve("h100", 64, 8);
  const CostConstants k = cost_defaults(c.device);
  const auto at = [&](double imbalance, double capacity, const char* layout) {
    ModelSpec m = model_preset("mixtral-8x7b");
    m.moe.imbalance = imbalance;
    m.moe.capacity_factor = capacity;
    return predict(m, run, Layout::parse(layout), c, k);
  };
  const char* ep8 = "tp1-pp4-dp16-ep8-mb1-vpp8";
  const auto worst = at(0, 0, ep8), balanced = at(1, 0, ep8), skewed = at(1.5, 0, ep8), more = at(2, 0, ep8);
  EXPECT_DOUBLE_EQ(worst.step, balanced.step);  // 0 (worst-case buffers) prices balanced routing
  EXPECT_GT(skewed.compute, balanced.compute);
  EXPECT_GT(skewed.step, balanced.step);
  EXPECT_GT(more.step, skewed.step);
  // The experts' part grows by about the factor: not more than half again
  // of the whole step at 1.5 (the attention and the rest stay).
  EXPECT_LT(skewed.step, 1.5 * balanced.step);
  // A capacity of the balanced share caps what the busiest rank takes.
  EXPECT_NEAR(at(1.5, 1.0, ep8).step, at(1, 1.0, ep8).step, 1e-3 * balanced.step);
  EXPECT_LT(at(1.5, 1.25, ep8).step, skewed.step);
  // Without ep the imbalance costs nothing here.
  const char* ep1 = "tp1-pp4-dp16-mb1-vpp8";
  EXPECT_DOUBLE_EQ(at(1.5, 0, ep1).step, at(1, 0, ep1).step);
}

// An expert tp degree under sp dispatches each tp rank's own rows over ep
// (Megatron-Core's order) and gathers what arrives over tp: the ep group's
// all-to-alls move 1 / tp of the bytes they move without sp, where every tp
// rank routes all rows. The ep group here spans 4 nodes, so the network's
// bandwidth prices those bytes alone in the compute part (tp is in a node,
// and the gradients' reductions are dp_comm's): its share of the step falls
// by exactly tp.
// Mixtral 8x7B on 64 H100 (T 4096, GBS 256) under `layout`, on a network
// `nic_scale` times as fast as the preset's.
CostBreakdown mixtral_on_64(const char* layout, double nic_scale) {
  ClusterSpec c = cluster_resolve("h100", 64, 8);
  c.nic_bandwidth = c.nic_bytes_per_s() * nic_scale;
  return predict(model_preset("mixtral-8x7b"), RunSpec{4096, 256, Precision::bf16}, Layout::parse(layout), c,
                 cost_defaults(c.device));
}

TEST(CostMoe, TheExpertTpDegreeUnderSpDispatchesItsOwnRows) {
  const auto compute = [](const char* layout, double nic_scale) { return mixtral_on_64(layout, nic_scale).compute; };
  const char* sp = "tp4-pp1-dp16-ep8-etp4-mb1-sp";
  const char* nosp = "tp4-pp1-dp16-ep8-etp4-mb1-nosp";
  const double network_sp = compute(sp, 1) - compute(sp, 1000);
  const double network_nosp = compute(nosp, 1) - compute(nosp, 1000);
  EXPECT_GT(network_sp, 0);
  EXPECT_NEAR(4 * network_sp, network_nosp, 1e-9 * network_nosp);
}

// Folded over the tp ranks (epfold), Mixtral's ep8 at tp4 is 8 consecutive
// ranks, one node: its all-to-alls never touch the network, where ep8 over
// dp spans 4 nodes. The folded layout is the faster one, and its experts'
// state shards over 8 ranks of dp (16 / (8 / 4)) where the other's over 2.
TEST(CostMoe, TheFoldedEpGroupStaysInANode) {
  const auto at = mixtral_on_64;
  const char* fold = "tp4-pp1-dp16-ep8-epfold-mb1-sp-zero1";
  const char* over_dp = "tp4-pp1-dp16-ep8-mb1-sp-zero1";
  EXPECT_DOUBLE_EQ(at(fold, 1).compute, at(fold, 1000).compute);
  EXPECT_GT(at(over_dp, 1).compute, at(over_dp, 1000).compute);
  EXPECT_LT(at(fold, 1).step, at(over_dp, 1).step);
  EXPECT_EQ(Layout::parse(fold).zero_shards(), 8);
  EXPECT_EQ(Layout::parse(over_dp).zero_shards(), 2);
}

// Emulated on the CPU, FP8 in MoE blocks takes the routed rows' scales as
// one rank computing the micro-batch would, from tables reduced over tp and
// dp x cp (trainer/model/llama_moe_fp8.cpp): under tensorwise scaling before
// every routed cast, under block scaling for the weight gradients' tiles
// down the tokens, and only where a micro-batch's rows lie apart (sp, cp).
// Delayed scaling past its first step exchanges nothing, and a GPU's casts
// take each rank's own amax.
TEST(CostMoe, TheCpuEmulationReducesItsScaleTables) {
  const RunSpec run{256, 16, Precision::fp32};
  ModelSpec m = model_preset("tiny-moe");
  m.moe.expert_intermediate = 128;  // (block scaling's experts: multiples of 128)
  const auto tp_comm = [&](const char* layout, const char* device = "cpu") {
    const ClusterSpec c = cluster_resolve(device, 8, 8);
    return predict(m, run, Layout::parse(layout), c, cost_defaults(c.device)).tp_comm;
  };
  EXPECT_GT(tp_comm("tp1-pp1-dp4-ep2-mb1-fp8:tensorwise"), 0);  // over dp alone
  EXPECT_EQ(tp_comm("tp1-pp1-dp4-ep2-mb1-fp8:tensorwise", "h100"), 0);
  EXPECT_EQ(tp_comm("tp1-pp1-dp4-ep2-mb1-fp8:delayed"), 0);
  EXPECT_EQ(tp_comm("tp1-pp1-dp4-ep2-mb1-fp8:blockwise"), 0);  // each run's own tiles
  // More micro-batches to a table, more to reduce.
  EXPECT_GT(tp_comm("tp1-pp1-dp8-ep2-mb1-fp8:tensorwise"), tp_comm("tp1-pp1-dp4-ep2-mb1-fp8:tensorwise"));
  // Block scaling's tiles apart: under cp, and under sp.
  EXPECT_GT(tp_comm("tp1-cp2-pp1-dp2-ep2-mb1-fp8:blockwise"), tp_comm("tp1-cp2-pp1-dp2-ep2-mb1-fp8:delayed"));
  // Under sp, against experts too narrow for block scaling (which then run
  // in the compute type, as a GPU's tile casts would cost no exchange).
  const auto narrow = [&](const char* layout) {
    ModelSpec n = m;
    n.moe.expert_intermediate = 96;
    const ClusterSpec c = cluster_resolve("cpu", 8, 8);
    return predict(n, run, Layout::parse(layout), c, cost_defaults(c.device)).tp_comm;
  };
  EXPECT_GT(tp_comm("tp2-pp1-dp2-ep2-mb1-sp-fp8:blockwise"), narrow("tp2-pp1-dp2-ep2-mb1-sp-fp8:blockwise"));
  EXPECT_DOUBLE_EQ(tp_comm("tp2-pp1-dp2-ep2-mb1-nosp-fp8:blockwise"), narrow("tp2-pp1-dp2-ep2-mb1-nosp-fp8:blockwise"));
}

}  // namespace
}  // namespace weft::tuner
