// The single-rank MoE stage's memory: the arena's peaks against the memory
// model per category, under balanced and one-sided routing, capacities,
// LoRA on the experts and FP8 in the blocks (tensorwise under LoRA, block
// scaling), and what FP8 under LoRA leaves the adapters to read.
#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "memory/estimate.h"
#include "memory/shapes.h"
#include "trainer/model/llama.h"
#include "../test_util.h"
#include "moe_stage_util.h"
#include "stage_test_util.h"

namespace weft::trainer {
namespace {

using test_moe::Harness;
using test_moe::moe_model;
using test_stage::Batch;
using test_stage::cpu;
using test_stage::random_batch;

// The arena's peaks are the memory model's, per category, under balanced
// routing and when every token goes to the same experts (a router of zeros
// ties every score: each token takes experts 0 .. k-1).
TEST(MoeStage, ArenaPeaksEqualTheMemoryModel) {
  for (const char* family : {"mixtral", "qwen3", "llama4"})
    for (const double capacity : {0.0, 0.5})  // dropless, and each expert's rows capped below rows x k / E
    for (const bool one_sided : {false, true}) {
      ModelSpec m = moe_model(family, 2);
      m.moe.capacity_factor = capacity;
      const RunSpec run{7, 4, Precision::fp32};
      for (const char* layout : {"mb1", "mb2-ckpt:full", "mb2-ckpt:selective-attn:materialized",
                                 "mb1-norm:unfused-ckpt:ffn", "mb2-ckpt:ffn@2"}) {
        const Layout l = Layout::parse(layout);
        Harness<float> h(m, run, l, 1);
        if (one_sided) {
          const auto& params = h.stage.params();
          for (int64_t layer = 0; layer < params.layers; ++layer)
            if (params.block_moe[size_t(layer)]) {
              const auto& r = params.model(checkpoint::ParamKind::router, layer);
              std::fill(h.stage.weights() + r.offset, h.stage.weights() + r.offset + r.local_elements(), 0.0f);
            }
        }
        h.step(random_batch(4 * 7, m.vocab, 2), 4 / l.mb);
        if (one_sided) {  // expert 0 took every token, or as many as it keeps
          const int64_t rows = l.mb * 7;
          const int64_t* offsets = h.stage.tensors().get<int64_t>("layer.moe.routing", 0) + rows * m.moe.top_k;
          EXPECT_EQ(offsets[1] - offsets[0], capacity > 0 ? std::min(rows, m.moe.capacity(rows)) : rows) << family;
        }
        memory::MemoryOptions o;
        const auto e = memory::estimate(m, run, l, cpu(), o);
        for (auto c : memory::kAllCategories)
          EXPECT_EQ(h.arena.peak(c), e.stages[0].bytes[size_t(c)])
              << family << " " << layout << " capacity " << capacity << " " << memory::to_string(c);
        EXPECT_EQ(h.arena.peak_total(), e.peak()) << family << " " << layout << " capacity " << capacity;
      }
    }
}

// Under LoRA on the experts too: the adapters, their gradients and
// optimizer state the flat buffers, the base frozen, the experts' h and g
// in scratch.moe_lora.
TEST(MoeStage, LoraArenaPeaksEqualTheMemoryModel) {
  LoraSpec lora{.rank = 4, .alpha = 8, .dropout = 0, .targets = LoraSpec::kAllTargets};
  for (const char* family : {"mixtral", "qwen3", "llama4"})
    for (const char* layout : {"mb1", "mb2-ckpt:full", "mb1-ckpt:ffn"}) {
      // (The experts' gate_up at a rank of its own, its scratch the larger.)
      lora.gate_up_rank = std::string(layout) == "mb1-ckpt:ffn" ? 8 : 0;
      const ModelSpec m = moe_model(family, 2);
      RunSpec run{7, 4, Precision::fp32};
      run.lora = lora;
      const Layout l = Layout::parse(layout);
      Harness<float> h(m, run, l, 1);
      h.step(random_batch(4 * 7, m.vocab, 2), 4 / l.mb);
      const auto e = memory::estimate(m, run, l, cpu(), memory::MemoryOptions{});
      for (auto c : memory::kAllCategories)
        EXPECT_EQ(h.arena.peak(c), e.stages[0].bytes[size_t(c)]) << family << " " << layout << " "
                                                                 << memory::to_string(c);
      EXPECT_EQ(h.arena.peak_total(), e.peak()) << family << " " << layout;
    }
}

// FP8 under LoRA on the FFNs: the base's GEMMs read the quantised rows, the
// adapters (forward and backward) the compute-type ones, as a dense FFN's
// do. So what the block saves for them after a forward is what the compute
// type gave: every expert row is a norm output row as it was (Mixtral's
// gate on the output), and the experts' and the shared expert's SwiGLU
// outputs are silu(gate) x up of their saved gate and up. Without LoRA on
// the FFN the same rows are quantised in place (the weight gradients read
// them), and the same checks fail, by about the FP8 rounding. The arena
// equals the memory model, the scratch of the copies included.
TEST(MoeStage, Fp8UnderLoraTheAdaptersReadTheComputeType) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  const auto silu = [](double g) { return g / (1 + std::exp(-g)); };
  // The largest relative difference of a saved SwiGLU output from its
  // inputs' silu(gate) x up, over n values (times each row's weight where
  // the experts apply the gate on the output: row_weights, rows F wide).
  const auto swiglu_dev = [&](const float* gate, const float* up, const float* act, int64_t n,
                              const float* row_weights = nullptr, int64_t F = 1) {
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = silu(gate[i]) * up[i] * (row_weights ? row_weights[i / F] : 1.0);
      worst = std::max(worst, std::fabs(act[i] - want) / (std::fabs(want) + 1e-3));
    }
    return worst;
  };
  for (const char* family : {"mixtral", "llama4"})
    for (const char* recipe : {"fp8:tensorwise", "fp8:delayed"})
      for (const bool on_ffn : {true, false}) {
        ModelSpec m = moe_model(family);
        m.moe.expert_intermediate = 32;  // C 32 and F 32: FP8 GEMMs (multiples of 16)
        ASSERT_TRUE(memory::moe_fp8_experts(m, Layout::parse(recipe)));
        RunSpec run{16, 2, Precision::fp32};
        run.lora = {.rank = 4, .alpha = 8, .dropout = 0,
                    .targets = on_ffn ? LoraSpec::kAllTargets : LoraSpec::parse_targets("q,k,v,o")};
        const Layout l = Layout::parse(fmt::format("mb1-norm:unfused-{}", recipe));
        Harness<float> h(m, run, l, seed);
        const std::string what = fmt::format("{} {} LoRA on the FFN {}", family, recipe, on_ffn);
        h.step(random_batch(2 * 16, m.vocab, seed + 1), 2);
        auto& t = h.stage.tensors();
        const int64_t C = m.hidden, F = m.moe.expert_intermediate, k = m.moe.top_k, E = m.moe.experts;
        double rows_dev = 0, act_dev = 0, shared_dev = 0;
        for (int64_t layer = 0; layer < m.layers; ++layer) {
          const int64_t* offsets = t.get<int64_t>("layer.moe.routing", layer) + 16 * k;
          const int64_t rows = offsets[E];
          ASSERT_EQ(rows, 16 * k) << what;
          const float* row_weights =
              m.moe.gate_on == GateOn::output ? t.get<float>("layer.moe.row_weights", layer) : nullptr;
          act_dev = std::max(act_dev, swiglu_dev(t.get<float>("layer.moe.gate", layer), t.get<float>("layer.moe.up", layer),
                                                 t.get<float>("layer.moe.act", layer), rows * F, row_weights, F));
          if (m.moe.shared_intermediate > 0)
            shared_dev = std::max(shared_dev, swiglu_dev(t.get<float>("layer.moe.shared_gate", layer),
                                                         t.get<float>("layer.moe.shared_up", layer),
                                                         t.get<float>("layer.moe.shared_act", layer),
                                                         16 * m.moe.shared_intermediate));
          if (m.moe.gate_on != GateOn::output) continue;
          // Each expert row against the nearest norm output row.
          const float* in = t.get<float>("layer.moe.input", layer);
          const float* normed = t.get<float>("layer.mlp_norm.output", layer);
          for (int64_t r = 0; r < rows; ++r) {
            double best = 1e300;
            for (int64_t s = 0; s < 16; ++s) {
              double d = 0;
              for (int64_t c = 0; c < C; ++c)
                d = std::max(d, std::fabs(double(in[r * C + c]) - normed[s * C + c]) / (std::fabs(normed[s * C + c]) + 1e-3));
              best = std::min(best, d);
            }
            rows_dev = std::max(rows_dev, best);
          }
        }
        if (on_ffn) {
          EXPECT_EQ(rows_dev, 0.0) << what;
          EXPECT_LT(act_dev, 1e-6) << what;
          EXPECT_LT(shared_dev, 1e-6) << what;
        } else {  // quantised in place: E4M3's 3-bit mantissa is 1/16 relative at most
          if (m.moe.gate_on == GateOn::output) {
            EXPECT_GT(rows_dev, 1e-3) << what;
          }
          EXPECT_GT(act_dev, 1e-3) << what;
          if (m.moe.shared_intermediate > 0) {
            EXPECT_GT(shared_dev, 1e-3) << what;
          }
        }
        const auto e = memory::estimate(m, run, l, cpu(), memory::MemoryOptions{});
        for (auto c : memory::kAllCategories)
          EXPECT_EQ(h.arena.peak(c), e.stages[0].bytes[size_t(c)]) << what << " " << memory::to_string(c);
        EXPECT_EQ(h.stage.tensors().has("scratch.moe_fp8_rows"), on_ffn) << what;
      }
}

// Block scaling in the MoE blocks (C, the experts' and the shared expert's
// widths multiples of 128): the arena equals the memory model, the rows'
// two scratches included (along the rows, and down the tokens for the
// weight gradients; the second not under LoRA, whose base has none), and
// the experts are quantised: the losses move off fp32's, and every step
// counts at least their rows' and weights' values.
TEST(MoeStage, Fp8BlockScalingArenaEqualsTheMemoryModel) {
  for (const char* family : {"mixtral", "llama4"})
    for (const bool lora : {false, true}) {
      ModelSpec m = moe_model(family, 2);
      m.hidden = 128;
      m.heads = 2;
      m.kv_heads = 2;
      m.head_dim = 64;
      m.intermediate = 128;
      m.moe.expert_intermediate = 128;
      if (m.moe.shared_intermediate > 0) m.moe.shared_intermediate = 128;
      m.validate();
      RunSpec run{16, 2, Precision::fp32};
      if (lora) run.lora = {.rank = 4, .alpha = 8, .dropout = 0, .targets = LoraSpec::kAllTargets};
      const Layout l = Layout::parse("mb1-fp8:blockwise");
      ASSERT_TRUE(memory::moe_fp8_experts(m, l));
      const std::string what = fmt::format("{} LoRA {}", family, lora);
      Harness<float> h(m, run, l, 3);
      Harness<float> off(m, run, Layout::parse("mb1"), 3);
      const Batch b = random_batch(2 * 16, m.vocab, 4);
      const double loss = h.step(b, 2), plain = off.step(b, 2);
      EXPECT_GT(std::fabs(loss - plain), 1e-6 * std::fabs(plain)) << what;
      EXPECT_LT(std::fabs(loss - plain), 0.02 * std::fabs(plain)) << what;
      const auto e = memory::estimate(m, run, l, cpu(), memory::MemoryOptions{});
      for (auto c : memory::kAllCategories)
        EXPECT_EQ(h.arena.peak(c), e.stages[0].bytes[size_t(c)]) << what << " " << memory::to_string(c);
      EXPECT_TRUE(h.stage.tensors().has("scratch.moe_fp8_rows")) << what;
      EXPECT_EQ(h.stage.tensors().has("scratch.moe_fp8_wgrad"), !lora) << what;
    }
}

}  // namespace
}  // namespace weft::trainer
