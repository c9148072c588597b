// An MoE model started from a Hugging Face folder computes what transformers
// computes with the same weights: tools/moe_fixtures.py recorded, for tiny
// Mixtral models (4 experts top-2 in fp32; 8 experts top-3 in bf16, sharded)
// a Qwen3-MoE model (top-2 without renormalisation, a dense layer among
// the MoE ones, RMS norms of each head's queries and keys) and a Llama 4
// text model (fused experts converted on loading, sigmoid top-1 on the
// input, a shared expert, dense layers between, a NoPE layer with the
// attention temperature, the QK L2 norm, Meta's rotary pairs; and the same
// attending within chunks of 4 positions, two chunk boundaries inside each
// 10-token window), the fp32
// loss of one forward over every window, the logits of the first, the
// load-balancing loss over that forward's routers pooled (Llama 4's model
// computes none), and each layer's per-expert token counts.
//
// Tolerances: the loss and the balancing loss within a relative 1e-5 (fp32
// on both sides, different summation orders); the logits by
// test_init_weights.cpp's rule, a relative L2 error of 64 fp32 epsilons per
// operation depth step, four per block; the counts exactly (the fixture's
// router scores are far from ties).
#include <cmath>

#include <fmt/format.h>

#include "golden/golden_file.h"
#include "trainer/loop.h"
#include "trainer/model/llama.h"
#include "trainer/optim/optimizer.h"
#include "trainer/state_io.h"
#include "../test_util.h"

namespace weft::trainer {
namespace {

constexpr double kEps32 = 1.1920928955078125e-07;

std::string fixture(const std::string& name) { return fmt::format("{}/hf_moe/{}", WEFT_FIXTURES_DIR, name); }

const test::GoldenFile& reference() {
  static const test::GoldenFile f = test::golden_file_read(fixture("reference.bin"));
  return f;
}

TEST(MoeTransformers, LossLogitsBalancingLossAndCountsMatch) {
  const auto& scalars = reference().header["scalars"];
  const int64_t T = scalars["seq"].get<int64_t>(), W = scalars["windows"].get<int64_t>();
  const auto& tokens = reference().at("tokens").i32();
  // The windows side by side: one micro-batch of W sequences, as the
  // reference's one forward (the balancing loss is over a micro-batch).
  std::vector<int32_t> inputs, targets;
  for (int64_t w = 0; w < W; ++w) {
    inputs.insert(inputs.end(), tokens.begin() + w * T, tokens.begin() + w * T + T);
    targets.insert(targets.end(), tokens.begin() + w * T + 1, tokens.begin() + w * T + T + 1);
  }
  std::string table = fmt::format("{:<14} {:>11} {:>11} {:>9} {:>11} {:>11} {:>9} {:>10}\n", "folder", "weft loss",
                                  "transformers", "rel dev", "weft aux", "transformers", "rel dev", "logits rel");
  for (const char* folder : {"mixtral", "mixtral_wide", "qwen3_moe", "llama4", "llama4_chunk"}) {
    SCOPED_TRACE(folder);
    const auto src = checkpoint::pretrained_open(fixture(folder));
    const ModelSpec& m = src.model;
    ASSERT_TRUE(m.moe.enabled());
    memory::Arena arena;
    parallel::ProcessGroups groups = parallel::single_process_groups();
    LlamaStage<float> stage(m, RunSpec{T, W, Precision::fp32}, Layout::parse(fmt::format("mb{}", W)), 0,
                            device_preset("cpu"), arena, groups);
    Optimizer<float> optim(stage, OptimConfig{});
    state_init(src, stage, optim);
    std::vector<float> logits;
    stage.capture_logits(&logits);
    const double scale = 1.0 / double(W * T);
    stage.forward(0, inputs.data(), targets.data(), scale);
    const double loss = stage.take_loss() * scale, aux = stage.take_aux_loss() * scale;
    const double want = reference().at(std::string(folder) + ".loss").f32()[0];
    const double want_aux = m.moe.aux_loss_coef * reference().at(std::string(folder) + ".aux").f32()[0];
    EXPECT_LE(std::fabs(loss - want) / want, 1e-5) << loss << " vs " << want;
    if (std::isnan(want_aux))  // transformers' Llama 4 has no balancing loss to compare
      EXPECT_GT(aux, 0);
    else
      EXPECT_LE(std::fabs(aux - want_aux) / want_aux, 1e-5) << aux << " vs " << want_aux;
    // Window 0's logits: the first T rows.
    const auto& want_logits = reference().at(std::string(folder) + ".logits0").f32();
    double num = 0, den = 0;
    for (size_t i = 0; i < want_logits.size(); ++i) {
      num += std::pow(double(logits[i]) - want_logits[i], 2);
      den += std::pow(double(want_logits[i]), 2);
    }
    const double e = std::sqrt(num / den);
    EXPECT_LT(e, 64 * kEps32 * 4 * double(m.layers));
    // Each MoE layer's counts, from its saved router statistics (the MoE
    // layers' are the stats' instances in order).
    const auto& counts = reference().at(std::string(folder) + ".counts").i32();
    ASSERT_EQ(int64_t(counts.size()), m.moe_layers() * m.moe.experts);
    for (int64_t i = 0; i < m.moe_layers(); ++i) {
      const int64_t* stats = stage.tensors().get<int64_t>("layer.moe.stats", i);
      for (int64_t j = 0; j < m.moe.experts; ++j)
        EXPECT_EQ(stats[j], counts[size_t(i * m.moe.experts + j)]) << "MoE layer " << i << " expert " << j;
    }
    table += fmt::format("{:<14} {:>11.7f} {:>11.7f} {:>9.2e} {:>11.7f} {:>11.7f} {:>9.2e} {:>10.2e}\n", folder, loss,
                         want, std::fabs(loss - want) / want, aux, want_aux, std::fabs(aux - want_aux) / want_aux, e);
  }
  std::printf("%s", table.c_str());
}

// The GPU's attention kernels do not attend within chunks: a GPU run past
// the chunk is refused by name, the CPU's is not.
TEST(MoeTransformers, GpuRunPastTheChunkIsRefused) {
  TrainConfig c;
  c.model = model_preset("llama4-scout");
  c.run = RunSpec{16384, 8, Precision::bf16};
  c.device = device_preset("h100");
  WEFT_EXPECT_THROW_MSG(validate_config(c), InputError, "--seq 16384 is past llama4-scout's attention chunk of 8192",
                        "--device cpu");
  c.run.seq = 8192;
  EXPECT_NO_THROW(validate_config(c));
  c.run = RunSpec{16384, 8, Precision::fp32};
  c.device = device_preset("cpu");
  EXPECT_NO_THROW(validate_config(c));
}

}  // namespace
}  // namespace weft::trainer
