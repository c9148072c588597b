// The learning-rate schedule, and the non-finite guard of the optimizer:
// a step with a NaN or infinite loss or gradient is skipped and counted, and
// too many in a row stop the run with a clear error.
#include <cmath>
#include <limits>

#include "trainer/optim/optimizer.h"
#include "../test_util.h"

namespace weft::trainer {
namespace {

TEST(Schedule, WarmupThenCosineToTheFloor) {
  OptimConfig c;
  c.lr = 1.0;
  c.warmup_steps = 4;
  c.total_steps = 104;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(c, 1), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(c, 4), 1.0);
  EXPECT_NEAR(lr_at(c, 54), 0.55, 1e-12);  // half way down the cosine
  EXPECT_NEAR(lr_at(c, 104), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(c, 500), 0.1, 1e-12);  // stays at the floor
  for (int64_t s = 5; s < 104; ++s) EXPECT_LT(lr_at(c, s + 1), lr_at(c, s));
  c.schedule = Schedule::constant;
  EXPECT_DOUBLE_EQ(lr_at(c, 50), 1.0);
}

TEST(Schedule, InvalidSettingsAreNamed) {
  OptimConfig c;
  c.lr = std::numeric_limits<double>::quiet_NaN();
  WEFT_EXPECT_THROW_MSG(c.validate(), InputError, "--lr", "nan");
  c.lr = std::numeric_limits<double>::infinity();
  WEFT_EXPECT_THROW_MSG(c.validate(), InputError, "--lr", "inf");
  c = OptimConfig{};
  c.beta2 = 1.0;
  WEFT_EXPECT_THROW_MSG(c.validate(), InputError, "--beta2");
  c = OptimConfig{};
  c.clip = -1;
  WEFT_EXPECT_THROW_MSG(c.validate(), InputError, "--clip");
}

TEST(Optimizer, NonFiniteStepsAreSkippedThenStop) {
  ModelSpec m = model_preset("tiny-test");
  m.layers = 1;
  const RunSpec run{4, 1, Precision::fp32};
  memory::Arena arena;
  auto groups = parallel::single_process_groups();
  LlamaStage<float> stage(m, run, Layout::parse("mb1"), 0, device_preset("cpu"), arena, groups);
  stage.init_weights(3);
  OptimConfig c;
  c.max_nonfinite = 3;
  Optimizer<float> opt(stage, c);
  std::vector<float> before(stage.weights(), stage.weights() + stage.param_elements());

  // A finite step moves the weights.
  for (int64_t i = 0; i < stage.param_elements(); ++i) stage.grads()[i] = 1e-3f;
  EXPECT_FALSE(opt.step(1, 2.0).skipped);
  EXPECT_EQ(opt.updates(), 1);
  std::vector<float> after(stage.weights(), stage.weights() + stage.param_elements());
  EXPECT_NE(before, after);

  // A NaN gradient or loss skips the update and leaves the weights alone.
  stage.grads()[5] = std::numeric_limits<float>::quiet_NaN();
  const auto s = opt.step(2, 2.0);
  EXPECT_TRUE(s.skipped);
  EXPECT_TRUE(std::isnan(s.grad_norm));
  stage.grads()[5] = 1e-3f;
  EXPECT_TRUE(opt.step(3, std::numeric_limits<double>::infinity()).skipped);
  EXPECT_EQ(std::vector<float>(stage.weights(), stage.weights() + stage.param_elements()), after);
  EXPECT_EQ(opt.updates(), 1);
  EXPECT_EQ(opt.nonfinite_in_a_row(), 2);
  // A good step resets the run of bad ones; three in a row stop.
  EXPECT_FALSE(opt.step(4, 2.0).skipped);
  EXPECT_EQ(opt.nonfinite_in_a_row(), 0);
  EXPECT_TRUE(opt.step(5, std::nan("")).skipped);
  EXPECT_TRUE(opt.step(6, std::nan("")).skipped);
  WEFT_EXPECT_THROW_MSG(opt.step(7, std::nan("")), NonFiniteError, "3 steps in a row", "step 7");
  EXPECT_EQ(opt.nonfinite_total(), 5);
}

}  // namespace
}  // namespace weft::trainer
