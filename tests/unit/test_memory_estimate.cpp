#include <fmt/format.h>
#include <tuple>

#include "core/error.h"
#include "core/units.h"
#include "kernels/fp8/fp8_ops.h"
#include "memory/estimate.h"
#include "test_util.h"

namespace weft::memory {
namespace {

DeviceSpec cpu_device(int64_t bytes = GiB) {
  DeviceSpec d;
  d.name = "test-cpu";
  d.kind = DeviceKind::cpu;
  d.memory_bytes = bytes;
  return d;
}

int64_t cat(const StageMemory& s, Category c) { return s.bytes[static_cast<size_t>(c)]; }

// The tensor of a shape table by name, or null.
const TensorShape* shape_named(const std::vector<TensorShape>& t, const char* name) {
  for (const auto& s : t)
    if (std::string(s.name) == name) return &s;
  return nullptr;
}

// The runtime beyond the arena: none on the CPU, the measured single-process
// share on a GPU, and NCCL's stated share on a GPU of several ranks.
TEST(MemoryEstimate, RuntimeOverheadByDeviceAndRanks) {
  const auto m = model_preset("tiny-test");
  const RunSpec run{16, 8, Precision::bf16};
  const DeviceSpec gpu = device_preset("h100");
  EXPECT_EQ(gpu.runtime_overhead_bytes, kGpuRuntimeBytes);
  const auto overhead = [&](const Layout& l, const DeviceSpec& d) {
    return cat(estimate(m, run, l, d).stages[0], Category::overhead);
  };
  Layout one;
  EXPECT_EQ(overhead(one, cpu_device()), 0);
  EXPECT_EQ(overhead(one, gpu), kGpuRuntimeBytes);
  for (const char* text : {"tp2-pp1-dp1-mb1", "tp1-pp1-dp2-mb1", "tp1-pp2-dp1-mb1", "tp1-cp2-pp1-dp1-mb1"}) {
    const Layout l = Layout::parse(text);
    EXPECT_EQ(overhead(l, gpu), kGpuRuntimeBytes + kNcclRuntimeBytes) << text;
    EXPECT_EQ(overhead(l, cpu_device()), 0) << text;
    // Ranks that share a GPU run no NCCL: their messages go through pinned
    // host memory (host_staging_bytes), not the device's.
    DeviceSpec shared = gpu;
    shared.shared_by = l.world();
    EXPECT_EQ(overhead(l, shared), kGpuRuntimeBytes) << text;
  }
}

// The MPI device communicator's pinned staging, where ranks share a GPU:
// twice the stage's largest message, none otherwise.
TEST(MemoryEstimate, HostStagingIsTwiceTheLargestMessageOnASharedGpu) {
  const auto m = model_preset("tiny-test");
  const RunSpec run{16, 8, Precision::bf16};
  DeviceSpec gpu = device_preset("h100");
  const Layout dp2 = Layout::parse("tp1-pp1-dp2-mb1");
  EXPECT_EQ(host_staging_bytes(m, run, dp2, gpu, 0), 0);  // a GPU each: NCCL
  gpu.shared_by = 2;
  EXPECT_EQ(host_staging_bytes(m, run, Layout{}, gpu, 0), 0);  // one rank: no messages
  // dp2, ZeRO-0, fp32 gradients: the all-reduce of every gradient.
  EXPECT_EQ(host_staging_bytes(m, run, dp2, gpu, 0), 2 * 4 * m.param_count());
  // bf16 gradients halve it; ZeRO-3 reduces the same full gradient.
  EXPECT_EQ(host_staging_bytes(m, run, Layout::parse("tp1-pp1-dp2-mb1-grad:bf16"), gpu, 0), 2 * 2 * m.param_count());
  EXPECT_GE(host_staging_bytes(m, run, Layout::parse("tp1-pp1-dp2-mb1-zero3"), gpu, 0), 2 * 4 * (m.param_count() - 1));
  // tp2 alone: an activation sum of mb x T x C in bf16, or a larger buffer.
  EXPECT_GE(host_staging_bytes(m, run, Layout::parse("tp2-pp1-dp1-mb2"), gpu, 0), 2 * 2 * 16 * m.hidden * 2);
  // pp2: the stage boundary's activations, and no gradient reduction.
  const int64_t pp = host_staging_bytes(m, run, Layout::parse("tp1-pp2-dp1-mb1"), gpu, 1);
  EXPECT_GT(pp, 0);
  EXPECT_LT(pp, 2 * 4 * m.param_count());
}

// tiny-test: V=96 C=32 F=80 L=8 H=4 H_kv=2 D=8, fp32, T=16, one rank, mb 1.
TEST(MemoryEstimate, HandComputedSingleRank) {
  const auto m = model_preset("tiny-test");
  const RunSpec run{16, 4, Precision::fp32};
  const Layout l;
  const auto e = estimate(m, run, l, cpu_device());
  ASSERT_EQ(e.stages.size(), 1u);
  const auto& s = e.stages[0];
  const int64_t params = 92'704;  // 8 blocks of 10'816 + 2 x 96 x 32 + 32
  ASSERT_EQ(m.param_count(), params);
  EXPECT_EQ(cat(s, Category::weights), 4 * params);
  EXPECT_EQ(cat(s, Category::grads), 4 * params);
  EXPECT_EQ(cat(s, Category::optimizer), 8 * params);  // Adam m and v; fp32 weights are the master
  // Per block: norm input 512, rstd 16, norm out 512, q 512, k 256, v 256,
  // attn out 512, lse 64, mlp norm in 512, rstd 16, out 512, gate/up/act 3 x 1280.
  const int64_t block = 4 * 7'520;
  EXPECT_EQ(cat(s, Category::activations), 8 * block + 4 * 16 /*tokens*/ + 4 * 1'040 /*final norm*/);
  EXPECT_EQ(cat(s, Category::logits), 4 * (16 * 96 + 3 * 16 + 16));
  EXPECT_EQ(cat(s, Category::workspace),
            4 * (512 + 512 + 512 + 16 * 8 * 8 + 512 + 3 * 1'280) +
                4 * 1 * 2 * 2 * 16 * 16 /*attention tiles: B x H_kv x 2 (flash) x min(32, T) x T*/ +
                4 * 2 * 16 * 4 /*rope cos, sin*/ + 64 /*grad-norm partials: 6 doubles for 92'704 / 2^14, one 64-byte piece*/);
  EXPECT_EQ(cat(s, Category::comm), 0);
  EXPECT_EQ(cat(s, Category::overhead), 0);
  EXPECT_TRUE(e.fits);

  // Full checkpointing keeps each block's input and rebuilds one block at a time.
  Layout full = l;
  full.ckpt = Checkpointing::full;
  const auto f = estimate(m, run, full, cpu_device());
  EXPECT_EQ(cat(f.stages[0], Category::activations),
            8 * 4 * 512 + (block - 4 * 512) + 4 * 16 + 4 * 1'040);
}

// FP8 GEMMs, hand-computed for tiny-test (C=32, F=80, H=4, H_kv=2, D=8, L=8,
// T=16): q and o are 32 x 32, k and v 32 x 16, gate, up and down 32 x 80 (80
// is a multiple of 16), so every GEMM of an FP8 block is FP8 at tp 1.
TEST(MemoryEstimate, Fp8KeepsQuantisedWeightsAndOperandBuffers) {
  const auto m = model_preset("tiny-test");
  const RunSpec run{16, 4, Precision::fp32};
  const auto shapes_of = [&](const std::string& text, const DeviceSpec& dev, int64_t stage = 0) {
    const Layout l = Layout::parse(text);
    return stage_shapes(m, run, l, dev, stage_plan(m, run, l, stage));
  };
  const auto find = &shape_named;
  const int64_t block_weights = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 80;
  auto t = shapes_of("fp8:tensorwise", cpu_device());
  ASSERT_NE(find(t, "fp8.weights"), nullptr);
  EXPECT_EQ(find(t, "fp8.weights")->bytes(), 8 * block_weights * 4);  // the CPU keeps dequantised fp32
  EXPECT_EQ(find(t, "scratch.fp8_input")->bytes(), 16 * 80 * 4);      // widest K: down's F
  EXPECT_EQ(find(t, "scratch.fp8_grad")->bytes(), 16 * 80 * 4);       // widest N: gate's F
  EXPECT_EQ(find(t, "fp8.scaling"), nullptr);                         // tensorwise keeps no state
  EXPECT_EQ(find(shapes_of("tp1", cpu_device()), "fp8.weights"), nullptr);
  // @2: blocks 2..5 only; delayed adds its per-operand history.
  t = shapes_of("fp8:delayed@2", cpu_device());
  EXPECT_EQ(find(t, "fp8.weights")->bytes(), 4 * block_weights * 4);
  EXPECT_EQ(find(t, "fp8.scaling")->bytes(), 8 * 7 * 3 * (kFp8DelayedHistory + 2) * 4);
  // pp 2 with @3: stage 0 holds blocks 0-3 (FP8: 3), stage 1 blocks 4-7 (FP8: 4).
  EXPECT_EQ(find(shapes_of("pp2-fp8:tensorwise@3", cpu_device(), 0), "fp8.weights")->bytes(), 1 * block_weights * 4);
  EXPECT_EQ(find(shapes_of("pp2-fp8:tensorwise@3", cpu_device(), 1), "fp8.weights")->bytes(), 1 * block_weights * 4);
  EXPECT_EQ(fp8_stage_blocks(m, Layout::parse("pp2-vpp2-fp8:tensorwise@1"), stage_plan(m, run, Layout::parse("pp2-vpp2-fp8:tensorwise@1"), 0)), 3);
  // ZeRO-3 over dp 2: one weight quantised at a time instead of a copy of all.
  t = stage_shapes(m, RunSpec{16, 4, Precision::fp32}, Layout::parse("dp2-zero3-fp8:tensorwise"), cpu_device(),
                   stage_plan(m, run, Layout::parse("dp2-zero3-fp8:tensorwise"), 0));
  EXPECT_EQ(find(t, "fp8.weights"), nullptr);
  EXPECT_EQ(find(t, "scratch.fp8_weight")->bytes(), 32 * 80 * 4);
  // A GPU keeps FP8 codes, each with its transpose; tp 2 makes k and v 32 x 8
  // and the MLP's F/tp 40, not multiples of 16, so only q and o are FP8.
  DeviceSpec gpu = device_preset("h100");
  const RunSpec grun{16, 4, Precision::bf16};
  const Layout l2 = Layout::parse("tp2-fp8:tensorwise");
  const auto g = fp8_gemm_shapes(m, grun, l2);
  EXPECT_FALSE(g[size_t(Fp8Gemm::k)].fp8);
  EXPECT_TRUE(g[size_t(Fp8Gemm::q)].fp8);
  t = stage_shapes(m, grun, l2, gpu, stage_plan(m, grun, l2, 0));
  EXPECT_FALSE(g[size_t(Fp8Gemm::gate)].fp8);
  EXPECT_EQ(find(t, "fp8.weights")->bytes(), 8 * (2 * 32 * 16) * 1 * 2);
  // On a GPU the scales live on the device for both recipes: per block,
  // GEMM and operand the amax history (1 deep for tensorwise), the amax, the
  // scale, and its inverse 16 bytes from the next (cuBLASLt reads FP8 scales
  // only from 16-byte boundaries); and the step's two health counts.
  EXPECT_EQ(find(t, "fp8.scaling")->bytes(), (8 * 7 * 3 * (1 + 2) + 8 * 7 * 3 * 4) * 4);
  EXPECT_EQ(fp8_scale_inv_offset(7 * 3, 1), 64);  // 63 floats rounded up to a 16-byte boundary
  EXPECT_EQ(fp8_scaling_elements(7 * 3, 1), 64 + 84);
  EXPECT_EQ(find(t, "fp8.scaling")->category, Category::workspace);
  EXPECT_EQ(find(t, "fp8.health")->bytes(), 2 * 8);
  const Layout d2 = Layout::parse("tp2-fp8:delayed@2");
  t = stage_shapes(m, grun, d2, gpu, stage_plan(m, grun, d2, 0));
  EXPECT_EQ(find(t, "fp8.scaling")->bytes(), (8 * 7 * 3 * (kFp8DelayedHistory + 2) + 8 * 7 * 3 * 4) * 4);
  EXPECT_EQ(find(t, "fp8.scaling")->category, Category::optimizer);
  EXPECT_EQ(find(shapes_of("fp8:tensorwise", cpu_device()), "fp8.health"), nullptr);
}

TEST(MemoryEstimate, Bf16KeepsAnFp32MasterAndZeroShardsIt) {
  const auto m = model_preset("llama-13b");
  const RunSpec run{2048, 2048, Precision::bf16};
  const auto dev = device_preset("a100-80gb");
  Layout l = Layout::parse("tp1-pp1-dp64");
  const double psi = double(m.param_count());
  auto e0 = estimate(m, run, l, dev);
  EXPECT_EQ(cat(e0.stages[0], Category::weights), int64_t(2 * psi));
  EXPECT_EQ(cat(e0.stages[0], Category::grads), int64_t(4 * psi));
  EXPECT_EQ(cat(e0.stages[0], Category::optimizer), int64_t(12 * psi));
  EXPECT_FALSE(e0.fits);
  EXPECT_NE(e0.reason.find("optimizer"), std::string::npos) << e0.reason;
  l.zero = 1;
  auto e1 = estimate(m, run, l, dev);
  const int64_t shard = (m.param_count() + 63) / 64;
  EXPECT_EQ(cat(e1.stages[0], Category::optimizer), 12 * shard);
  EXPECT_EQ(cat(e1.stages[0], Category::grads), int64_t(4 * psi));
  l.zero = 2;
  auto e2 = estimate(m, run, l, dev);
  EXPECT_EQ(cat(e2.stages[0], Category::grads), 4 * shard);
  l.zero = 3;
  auto e3 = estimate(m, run, l, dev);
  EXPECT_EQ(cat(e3.stages[0], Category::weights), 2 * shard);
  EXPECT_LT(e3.peak(), e2.peak());
  EXPECT_LT(e2.peak(), e1.peak());
  EXPECT_LT(e1.peak(), e0.peak());
}

// Hybrid sharding shards the state over its group alone: over dp 64 in
// groups of 8, each rank holds what ZeRO over dp 8 holds, stage by stage.
TEST(MemoryEstimate, HybridShardingShardsOverItsGroup) {
  const auto m = model_preset("llama-13b");
  const RunSpec run{2048, 2048, Precision::bf16};
  const auto dev = device_preset("a100-80gb");
  for (int zero = 1; zero <= 3; ++zero) {
    const auto hybrid = estimate(m, run, Layout::parse(fmt::format("tp1-pp1-dp64-mb1-zero{}@8", zero)), dev);
    const auto dp8 = estimate(m, run, Layout::parse(fmt::format("tp1-pp1-dp8-mb1-zero{}", zero)), dev);
    const auto dp64 = estimate(m, run, Layout::parse(fmt::format("tp1-pp1-dp64-mb1-zero{}", zero)), dev);
    for (Category c : {Category::weights, Category::grads, Category::optimizer, Category::comm})
      EXPECT_EQ(cat(hybrid.stages[0], c), cat(dp8.stages[0], c)) << "zero" << zero << " " << to_string(c);
    EXPECT_GT(hybrid.peak(), dp64.peak()) << zero;
  }
  const int64_t shard = (m.param_count() + 7) / 8;
  EXPECT_EQ(cat(estimate(m, run, Layout::parse("tp1-pp1-dp64-mb1-zero1@8"), dev).stages[0], Category::optimizer),
            12 * shard);
}

// grad:bf16 halves the gradients and every buffer they are reduced through:
// 2 + 2 + 12 / dp bytes per parameter under ZeRO-1, the rest unchanged.
TEST(MemoryEstimate, Bf16GradientsHalveGradientsAndTheirBuffers) {
  const auto m = model_preset("llama-13b");
  const RunSpec run{2048, 2048, Precision::bf16};
  const auto dev = device_preset("a100-80gb");
  for (const char* base : {"tp1-pp1-dp64-zero1", "tp2-pp2-dp16-zero2", "tp1-pp4-dp16-zero1"}) {
    MemoryOptions o;
    o.all_stages = true;
    const auto f = estimate(m, run, Layout::parse(base), dev, o);
    const auto b = estimate(m, run, Layout::parse(std::string(base) + "-grad:bf16"), dev, o);
    for (size_t s = 0; s < f.stages.size(); ++s) {
      EXPECT_EQ(2 * cat(b.stages[s], Category::grads), cat(f.stages[s], Category::grads)) << base;
      // ZeRO-2's gradient buckets halve too (the pipeline's activation
      // buffers are unchanged); ZeRO-1 reduce-scatters in place, with no
      // buffer of its own.
      if (Layout::parse(base).zero >= 2)
        EXPECT_LT(cat(b.stages[s], Category::comm), cat(f.stages[s], Category::comm)) << base;
      else
        EXPECT_EQ(cat(b.stages[s], Category::comm), cat(f.stages[s], Category::comm)) << base;
      for (auto c : {Category::weights, Category::optimizer, Category::activations, Category::logits,
                     Category::workspace, Category::overhead})
        EXPECT_EQ(cat(b.stages[s], c), cat(f.stages[s], c)) << base << " " << to_string(c);
    }
  }
  // The public 13B run at tp1-pp1-dp64-mb1 (70.6% MFU) trained: it fits only with bf16 gradients.
  EXPECT_FALSE(estimate(m, run, Layout::parse("tp1-pp1-dp64-mb1-zero1"), dev).fits);
  EXPECT_TRUE(estimate(m, run, Layout::parse("tp1-pp1-dp64-mb1-zero1-grad:bf16"), dev).fits);
}

// FP8 inputs kept for the weight gradients (memory::fp8_saved_inputs): the
// two norm outputs and the SwiGLU output of every keeping layer as one byte
// an element, then the scale_inv (fp8_saved_bytes), the same instances as the
// compute-type tensors they replace, and one compute-type scratch each. The
// published Llama 3 70B FP8 recipe on 64 H100s (Megatron-Bridge 25.11, FP8-CS:
// tp4 pp8 vpp5, sp, no recomputation; it trained) fits only with them.
TEST(MemoryEstimate, Fp8KeepsGemmInputsInOneByte) {
  const auto m = model_preset("llama3-70b");
  const RunSpec run{8192, 128, Precision::bf16};
  const auto dev = device_preset("h100");
  const std::string base = "tp4-pp8-dp2-mb1-vpp5-sp-zero1";
  const auto table = [&](const std::string& layout, int64_t stage) {
    const Layout l = Layout::parse(layout);
    return stage_shapes(m, run, l, dev, stage_plan(m, run, l, stage));
  };
  const auto find = &shape_named;
  const auto bf16 = table(base, 3), fp8 = table(base + "-fp8:tensorwise", 3);
  int64_t saved = 0;
  for (const auto& [from, to, scratch] : {std::tuple{"layer.attn_norm.output", "layer.attn_norm.output_fp8",
                                                     "scratch.attn_norm_out"},
                                          {"layer.mlp_norm.output", "layer.mlp_norm.output_fp8", "scratch.mlp_norm_out"},
                                          {"layer.mlp.act", "layer.mlp.act_fp8", "scratch.mlp_act"}}) {
    const TensorShape* a = find(bf16, from);
    const TensorShape* b = find(fp8, to);
    ASSERT_TRUE(a && b) << to;
    EXPECT_EQ(find(fp8, from), nullptr) << from;
    EXPECT_EQ(b->element_bytes, 1) << to;
    EXPECT_EQ(b->elements, fp8_saved_bytes(a->elements)) << to;
    EXPECT_EQ(b->count, a->count) << to;
    ASSERT_NE(find(fp8, scratch), nullptr) << scratch;
    EXPECT_EQ(find(fp8, scratch)->bytes(), a->elements * a->element_bytes) << scratch;
    saved += a->bytes() - b->bytes();
  }
  MemoryOptions o;
  o.all_stages = true;
  const auto e16 = estimate(m, run, Layout::parse(base), dev, o);
  const auto e8 = estimate(m, run, Layout::parse(base + "-fp8:tensorwise"), dev, o);
  EXPECT_EQ(cat(e16.stages[3], Category::activations) - cat(e8.stages[3], Category::activations), saved);
  // 47 of stage 0's 2-layer chunks in flight: 8.1 GiB less at 8,192 tokens.
  EXPECT_GT(cat(e16.stages[0], Category::activations) - cat(e8.stages[0], Category::activations), 8 * GiB);
  EXPECT_TRUE(e8.fits) << e8.reason;
  // Delayed scaling keeps them too; block scaling, LoRA and a stage holding
  // compute-precision edge blocks (@1: stages 0 and 7 here) keep none.
  EXPECT_NE(find(table(base + "-fp8:delayed", 3), "layer.mlp.act_fp8"), nullptr);
  EXPECT_EQ(find(table(base + "-fp8:blockwise", 3), "layer.mlp.act_fp8"), nullptr);
  EXPECT_EQ(find(table(base + "-fp8:tensorwise@1", 0), "layer.mlp.act_fp8"), nullptr);
  EXPECT_NE(find(table(base + "-fp8:tensorwise@1", 3), "layer.mlp.act_fp8"), nullptr);
  RunSpec lora = run;
  lora.lora = LoraSpec::with_rank(8);
  const Layout l8 = Layout::parse(base + "-fp8:tensorwise");
  EXPECT_FALSE(fp8_saved_inputs(m, lora, l8, stage_plan(m, lora, l8, 3)).any());
}

// Block scaling on a GPU: the codes as the other recipes keep them, and a
// float per tile in cuBLASLt's layouts (kernels::Fp8Tiles) beside them: the
// input's and output gradient's 1 x 128 tiles with their transposes' at the
// widest K and N, each FP8 weight's 128 x 128 blocks for both of its
// layouts (Llama 3 8B's seven GEMMs, every one a multiple of 128), and
// under ZeRO-3 one weight's at a time.
TEST(MemoryEstimate, Fp8BlockScalingKeepsATileScaleInCublasLtsLayouts) {
  using kernels::Fp8Tiles;
  const auto m = model_preset("llama3-8b");
  const RunSpec run{8192, 64, Precision::bf16};
  const auto dev = device_preset("h100");
  const auto table = [&](const std::string& layout) {
    const Layout l = Layout::parse(layout);
    return stage_shapes(m, run, l, dev, stage_plan(m, run, l, 0));
  };
  const auto t = table("tp2-pp2-dp2-mb1-fp8:blockwise");
  const auto find = [&](const char* name) { return shape_named(t, name); };
  const int64_t M = 8192, C = 4096, F = 14336 / 2, Q = 4096 / 2, KV = 1024 / 2;
  const auto both = [](Fp8Tiles tiles, int64_t rows, int64_t k) {
    return kernels::fp8_tile_scales(tiles, rows, k) + kernels::fp8_tile_scales(tiles, k, rows);
  };
  ASSERT_NE(find("fp8.input_scales"), nullptr);
  EXPECT_EQ(find("fp8.input_scales")->elements, 2 * (M / 128) * F);  // widest K: down's F
  EXPECT_EQ(find("fp8.grad_scales")->elements, 2 * (M / 128) * F);   // widest N: gate's F
  // q, k, v, o, gate, up, down as (N, K): 16 layers on stage 0.
  const int64_t per_block = both(Fp8Tiles::block128, Q, C) + 2 * both(Fp8Tiles::block128, KV, C) +
                            both(Fp8Tiles::block128, C, Q) + 2 * both(Fp8Tiles::block128, F, C) +
                            both(Fp8Tiles::block128, C, F);
  EXPECT_EQ(find("fp8.weight_scales")->elements, 16 * per_block);
  EXPECT_EQ(find("fp8.weight_scales")->category, Category::weights);
  // k and v: 512 x 4096 is 4 x 32 blocks, laid out for the transpose 32 x 4.
  EXPECT_EQ(both(Fp8Tiles::block128, KV, C), 4 * 32 + 32 * 4);
  EXPECT_NE(find("fp8.health"), nullptr);
  EXPECT_EQ(find("fp8.scaling"), nullptr);  // nothing carries over between steps
  EXPECT_EQ(find("fp8.weights")->elements, 16 * (Q * C + 2 * KV * C + C * Q + 3 * F * C));
  const auto z3 = table("tp2-pp2-dp2-mb1-zero3-fp8:blockwise");
  EXPECT_EQ(shape_named(z3, "fp8.weight_scales"), nullptr);
  // The widest weight's blocks in each layout: gate's (F, C) and down's (C, F).
  EXPECT_EQ(shape_named(z3, "scratch.fp8_weight_scales")->elements,
            kernels::fp8_tile_scales(Fp8Tiles::block128, F, C) + kernels::fp8_tile_scales(Fp8Tiles::block128, F, C));
}

struct Mono : ::testing::Test {
  ModelSpec m = model_preset("llama-30b");
  RunSpec run{2048, 1024, Precision::bf16};
  DeviceSpec dev = device_preset("a100-80gb");
  int64_t total(const std::string& layout, int64_t stage = 0) {
    MemoryOptions o;
    o.all_stages = true;
    return estimate(m, run, Layout::parse(layout), dev, o).stages[size_t(stage)].total;
  }
  int64_t part(const std::string& layout, Category c, int64_t stage = 0) {
    MemoryOptions o;
    o.all_stages = true;
    return cat(estimate(m, run, Layout::parse(layout), dev, o).stages[size_t(stage)], c);
  }
};

TEST_F(Mono, MoreTensorParallelismLessWeightMemory) {
  int64_t prev = INT64_MAX;
  for (int tp : {1, 2, 4}) {
    const int64_t w = part(fmt::format("tp{}-pp1-dp{}", tp, 64 / tp), Category::weights);
    EXPECT_LT(w, prev) << "tp" << tp;
    prev = w;
  }
}

TEST_F(Mono, CheckpointingLowersActivations) {
  const auto none = part("tp4-pp2-dp8", Category::activations);
  const auto sel = part("tp4-pp2-dp8-ckpt:selective", Category::activations);
  const auto ffn = part("tp4-pp2-dp8-ckpt:ffn", Category::activations);
  const auto full = part("tp4-pp2-dp8-ckpt:full", Category::activations);
  const auto half = part("tp4-pp2-dp8-ckpt:full@15", Category::activations);
  EXPECT_LT(sel, none);
  EXPECT_LT(ffn, none);
  EXPECT_LT(full, sel);
  EXPECT_LT(full, ffn);
  EXPECT_LT(full, half);
  EXPECT_LT(half, none);
}

TEST_F(Mono, HigherZeroStageLessOptimizerMemory) {
  EXPECT_LT(part("tp4-pp2-dp8-zero1", Category::optimizer), part("tp4-pp2-dp8-zero0", Category::optimizer));
  EXPECT_EQ(part("tp4-pp2-dp8-zero2", Category::optimizer), part("tp4-pp2-dp8-zero1", Category::optimizer));
  EXPECT_LT(part("tp4-pp2-dp8-zero2", Category::grads), part("tp4-pp2-dp8-zero1", Category::grads));
  EXPECT_LT(part("tp4-pp2-dp8-zero3", Category::weights), part("tp4-pp2-dp8-zero2", Category::weights));
  // ZeRO-1 reduce-scatters the gradients in place: it saves 3/4 of the
  // optimizer's 12 bytes per parameter at dp 8 and costs no buffer, so the
  // stage's total falls by exactly that.
  EXPECT_EQ(part("tp4-pp2-dp8-zero1", Category::comm), part("tp4-pp2-dp8-zero0", Category::comm));
  EXPECT_EQ(total("tp4-pp2-dp8-zero0") - total("tp4-pp2-dp8-zero1"),
            part("tp4-pp2-dp8-zero0", Category::optimizer) - part("tp4-pp2-dp8-zero1", Category::optimizer));
}

TEST_F(Mono, SequenceParallelShardsNormRegions) {
  EXPECT_LT(part("tp4-pp2-dp8-sp", Category::activations), part("tp4-pp2-dp8", Category::activations));
}

TEST_F(Mono, MaterializedAttentionAddsTheSquareTerm) {
  const auto flash = part("tp4-pp2-dp8", Category::activations);
  const auto mat = part("tp4-pp2-dp8-attn:materialized", Category::activations);
  // probs (B, H/t, T, T) bf16 per block and micro-batch in flight, less the lse it replaces.
  const int64_t per_block = 1 * (52 / 4) * 2048 * 2048 * 2 - 1 * (52 / 4) * 2048 * 4;
  EXPECT_EQ(mat - flash, per_block * 30 /*layers*/ * 2 /*in flight on stage 0*/);
  run.seq = 4096;
  const auto mat4 = part("tp4-pp2-dp8-attn:materialized", Category::activations);
  const auto flash4 = part("tp4-pp2-dp8", Category::activations);
  EXPECT_NEAR(double(mat4 - flash4) / double(mat - flash), 4.0, 0.01);
}

TEST_F(Mono, CudnnAttentionSavesWhatFlashSaves) {
  // out and cuDNN's softmax stats (the lse), as flash keeps out and lse.
  EXPECT_EQ(part("tp4-pp2-dp8-attn:cudnn", Category::activations), part("tp4-pp2-dp8", Category::activations));
}

TEST_F(Mono, UnfusedNormKeepsFp32Intermediates) {
  const auto fused = part("tp4-pp2-dp8", Category::activations);
  const auto unfused = part("tp4-pp2-dp8-norm:unfused", Category::activations);
  // Two norms per block, each keeping x_hat in fp32 (the backward reads the
  // bf16 input itself: no fp32 copy of it).
  EXPECT_EQ(unfused - fused, int64_t{2} * (4 * 2048 * 6656) * 30 * 2);
}

TEST_F(Mono, PipelineStagesHoldTheirInFlightMicroBatches) {
  MemoryOptions o;
  o.all_stages = true;
  const auto e = estimate(m, run, Layout::parse("tp4-pp4-dp4"), dev, o);
  ASSERT_EQ(e.stages.size(), 4u);
  for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(e.stages[size_t(s)].in_flight_chunks, 4 - s);
  EXPECT_GT(cat(e.stages[0], Category::activations), cat(e.stages[1], Category::activations));
  EXPECT_GT(cat(e.stages[3], Category::logits), 0);
  EXPECT_EQ(cat(e.stages[1], Category::logits), 0);
  // The fast path (first and last stage) finds the same worst stage.
  const auto fast = estimate(m, run, Layout::parse("tp4-pp4-dp4"), dev);
  EXPECT_EQ(fast.peak(), e.peak());
}

// An uneven split: each stage's table holds its own blocks, the activation
// slots the stage's largest chunk, and the fast path (the first, second and
// last stage where only the ends differ) finds the worst stage of all.
TEST_F(Mono, UnevenSplitsPriceEachStage) {
  MemoryOptions o;
  o.all_stages = true;
  // llama-30b: L = 60.
  for (const char* text : {"tp4-pp4-dp4-split:14.16.16.14", "tp4-pp4-dp4-vpp2-split:6.8x6.6",
                           "tp4-pp4-dp4-split:15.14.16.15", "tp4-pp4-dp4-split:0.20.20.20"}) {
    const Layout l = Layout::parse(text);
    ASSERT_TRUE(l.violations(m, run, 64).empty()) << text;
    const auto e = estimate(m, run, l, dev, o);
    ASSERT_EQ(e.stages.size(), 4u);
    for (int64_t s = 0; s < 4; ++s) EXPECT_EQ(e.stages[size_t(s)].layers, l.stage_layers(m, s)) << text;
    EXPECT_EQ(estimate(m, run, l, dev).peak(), e.peak()) << text;
  }
  // The weights follow the blocks: stage 1 of 14.16.16.14 holds 16 of the
  // even split's 15 blocks.
  const int64_t even = part("tp4-pp4-dp4", Category::weights, 1);
  const int64_t more = part("tp4-pp4-dp4-split:14.16.16.14", Category::weights, 1);
  EXPECT_NEAR(double(more) * 15, double(even) * 16, 1e-6 * double(even) * 16);
  // Slots for the largest chunk: stage 0 of 6.8x6.6 (chunks of 6 and 8)
  // keeps activations as an even split of 8 per chunk would.
  EXPECT_EQ(part("tp4-pp4-dp4-vpp2-split:6.8x6.6", Category::activations, 0),
            part("tp4-pp4-dp4-vpp2-split:8x7.4", Category::activations, 0));
  // A first stage with only the embedding keeps no block's activations.
  EXPECT_LT(part("tp4-pp4-dp4-split:0.20.20.20", Category::activations, 0),
            part("tp4-pp4-dp4", Category::activations, 0) / 10);
}

TEST_F(Mono, MoreMicroBatchMoreActivations) {
  EXPECT_LT(part("tp4-pp2-dp8-mb1", Category::activations), part("tp4-pp2-dp8-mb2", Category::activations));
}

TEST(MemoryEstimate, ReasonNamesStageAndCategory) {
  const auto m = model_preset("llama-65b");
  const RunSpec run{2048, 512, Precision::bf16};
  const auto e = estimate(m, run, Layout::parse("tp8-pp1-dp8-mb4-zero1"), device_preset("a100-80gb"));
  EXPECT_FALSE(e.fits);
  EXPECT_EQ(e.binding, Category::activations);
  EXPECT_NE(e.reason.find("stage 0"), std::string::npos);
  EXPECT_NE(e.reason.find("activations"), std::string::npos);
  EXPECT_NE(e.reason.find("usable"), std::string::npos);
}

}  // namespace
}  // namespace weft::memory

namespace weft::memory {
namespace {

// A chosen layout the device cannot hold is refused before anything is
// allocated, naming the predicted and available bytes and the layout; a
// vocabulary of 2^31 - 1 counts without overflow.
TEST(MemoryEstimate, RequireFitsRefusesALayoutPastTheDevice) {
  auto m = model_preset("tiny");
  const RunSpec run{32, 4, Precision::fp32};
  Layout l;
  l.mb = 2;
  EXPECT_NO_THROW(require_fits(m, run, l, cpu_device(GiB)));
  m.vocab = 2147483647;
  const auto e = estimate(m, run, l, cpu_device(GiB));
  EXPECT_GT(e.peak(), 2 * m.vocab * m.hidden * 4);  // the weights alone, with no overflow
  const std::string layout = l.to_string(), predicted = fmt::format("{} bytes", e.peak()),
                    available = fmt::format("{} bytes", GiB);
  WEFT_EXPECT_THROW_MSG(require_fits(m, run, l, cpu_device(GiB)), InputError, layout.c_str(), predicted.c_str(),
                        available.c_str(), "test-cpu", "does not fit");
}

}  // namespace
}  // namespace weft::memory
