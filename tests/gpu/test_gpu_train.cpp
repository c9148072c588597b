// The trainer on the GPU: bf16 compute with fp32 main gradients, master
// weights and Adam state, against the CPU's fp32 run of the same model, data,
// seed and layout. Exits 77 (skipped) without a CUDA device (gpu_main.cpp).
//
// Tolerance rule: bf16 keeps 8 significant bits, so every stored activation
// and weight carries a relative rounding of up to 2^-9; the loss reads them
// through a few dozen ops whose errors are independent and partly cancel, and
// the optimizer feeds the difference back each step. A per-step loss within
// 4 * 2^-8 (1.6%) of the fp32 loss, and a mean over the 20 steps within
// 2^-8, is what a correct mixed-precision run gives; a wrong gradient, a
// missing master-weight update or a dropped micro-batch moves the loss by
// far more within 20 steps at this learning rate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "core/device_spec.h"
#include "core/model_spec.h"
#include "memory/estimate.h"
#include "trainer/data/prepare.h"
#include "tests/unit/test_util.h"
#include "trainer/loop.h"

namespace weft::trainer {
namespace {

// A corpus of its own (a GPU machine need not have the default one): text
// with enough variety for the loss to fall, prepared once per process.
const std::string& corpus() {
  static test::TempDir dir;
  static const std::string path = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i)
      text += "Sample " + std::to_string(i * 7919 % 1000) + " of the GPU run: bf16 " +
              std::to_string(i % 13) + " with fp32 master weights.\n%\n";
    data::PrepareOptions p;
    p.inputs = {dir.file("corpus.txt", text)};
    p.out = dir.path("data");
    p.val_fraction = 0.1;
    data::data_prepare(p);
    return dir.path("data");
  }();
  return path;
}

TrainConfig config(const std::string& out, bool gpu, const Layout& layout) {
  TrainConfig c;
  c.data = corpus();
  c.model = model_preset("tiny");
  c.run = RunSpec{128, 8, gpu ? Precision::bf16 : Precision::fp32};
  c.layout = layout;
  c.device = gpu ? *gpu_detect(0) : device_preset("cpu");
  c.steps = 20;
  c.log_every = 5;
  c.eval_every = 0;
  c.eval_samples = 8;
  c.optim.warmup_steps = 5;
  c.optim.total_steps = 20;
  c.out_dir = out;
  return c;
}

Layout layout_of(const std::string& text) { return Layout::parse(text); }

class GpuTrain : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuTrain, FirstTwentyLossesFollowTheFp32CpuRun) {
  test::TempDir dir;
  std::FILE* quiet = std::fopen("/dev/null", "w");
  const Layout l = layout_of(GetParam());
  const TrainReport cpu = train(config(dir.path("cpu"), false, l), quiet);
  const TrainReport gpu = train(config(dir.path("gpu"), true, l), quiet);
  std::fclose(quiet);
  ASSERT_EQ(cpu.losses.size(), 20u);
  ASSERT_EQ(gpu.losses.size(), 20u);
  double mean_rel = 0;
  for (size_t i = 0; i < 20; ++i) {
    const double rel = std::abs(gpu.losses[i] - cpu.losses[i]) / std::abs(cpu.losses[i]);
    EXPECT_LE(rel, 4.0 / 256) << "step " << i + 1 << ": gpu " << gpu.losses[i] << ", cpu " << cpu.losses[i];
    mean_rel += rel / 20;
  }
  EXPECT_LE(mean_rel, 1.0 / 256);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front()) << "the GPU run learns";
  // The arena allocates exactly the shape table, so every category but the
  // runtime's matches the memory model to the byte.
  for (auto cat : memory::kAllCategories) {
    if (cat == memory::Category::overhead) continue;
    EXPECT_EQ(gpu.measured[size_t(cat)], gpu.predicted[size_t(cat)]) << memory::to_string(cat);
  }
}

// A bf16 checkpoint holds the fp32 master weights and Adam state, so a run
// resumed at step 10 takes the same steps 11..20 as one that never stopped.
// The materialized attention keeps the run deterministic (the flash
// backward's dQ sums with atomics, whose order varies), so the losses must
// match exactly.
TEST(GpuTrainResume, ResumedRunMatchesTheUninterruptedOne) {
  test::TempDir dir;
  std::FILE* quiet = std::fopen("/dev/null", "w");
  const Layout l = layout_of("tp1-pp1-dp1-mb2-attn:materialized");
  const TrainReport whole = train(config(dir.path("whole"), true, l), quiet);
  TrainConfig first = config(dir.path("split"), true, l);
  first.steps = 10;
  train(first, quiet);
  TrainConfig second = config(dir.path("split"), true, l);
  second.resume = true;
  const TrainReport rest = train(second, quiet);
  std::fclose(quiet);
  ASSERT_EQ(whole.losses.size(), 20u);
  ASSERT_EQ(rest.first_step, 11);
  ASSERT_EQ(rest.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(rest.losses[i], whole.losses[10 + i]) << "step " << 11 + i;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuTrain,
                         ::testing::Values("tp1-pp1-dp1-mb1", "tp1-pp1-dp1-mb4-ckpt:full",
                                           "tp1-pp1-dp1-mb2-ckpt:selective-attn:materialized-norm:unfused"));

}  // namespace
}  // namespace weft::trainer
