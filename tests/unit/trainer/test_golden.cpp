// weft's Llama against Hugging Face transformers (tools/golden_llama.py): the
// same weights and batch must give the same logits, loss, every parameter
// gradient, and the same losses and weights over five AdamW steps with
// warm-up and clipping.
//
// Tolerance by rule: both sides compute in fp32 with different summation
// orders, so their difference is rounding noise. Each comparison is a relative
// L2 error, allowed 64 fp32 epsilons (7.6e-6) per operation depth step: the
// forward (logits, loss) passes ~4 matmul/norm stages per block, the backward
// twice that, and each optimizer step compounds the previous ones.
#include <cmath>

#include <fmt/format.h>

#include "golden/golden_file.h"
#include "trainer/model/llama.h"
#include "trainer/optim/optimizer.h"
#include "../test_util.h"

namespace weft::trainer {
namespace {

constexpr double kEps32 = 1.1920928955078125e-07;

double rel_l2(const float* got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += std::pow(double(got[i]) - double(want[i]), 2);
    den += std::pow(double(want[i]), 2);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Golden {
  test::GoldenFile f;
  ModelSpec m;
  RunSpec run;
  explicit Golden(const std::string& name)
      : f(test::golden_file_read(fmt::format("{}/{}", WEFT_FIXTURES_DIR, name))) {
    m = model_from_hf_config_json(f.header["config"], name);
    m.name = name;
    const auto& s = f.header["scalars"];
    run = RunSpec{s["seq_len"].get<int64_t>(), s["batch"].get<int64_t>(), Precision::fp32};
  }
};

struct Stage {
  memory::Arena arena;
  parallel::ProcessGroups groups = parallel::single_process_groups();
  LlamaStage<float> stage;
  Stage(const Golden& g, const std::string& layout)
      : stage(g.m, g.run, Layout::parse(layout), 0, device_preset("cpu"), arena, groups) {
    for (const auto& p : stage.params().specs) {
      const auto& w = g.f.at(p.name).f32();
      if (int64_t(w.size()) != p.local_elements()) throw InternalError("fixture shape of " + p.name);
      std::copy(w.begin(), w.end(), stage.weight(p));
    }
  }
  double step(const Golden& g) {
    const auto& in = g.f.at("inputs").i32();
    const auto& tg = g.f.at("targets").i32();
    const int64_t rows = g.run.seq * stage.layout().mb;
    const double scale = 1.0 / double(in.size());
    stage.zero_grads();
    double loss = 0;
    for (size_t first = 0; first < in.size(); first += size_t(rows)) {
      stage.forward(0, in.data() + first, tg.data() + first, scale);
      loss += stage.take_loss();
      stage.backward(0);
    }
    return loss * scale;
  }
};

class GoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenTest, ForwardAndGradientsMatchTransformers) {
  Golden g(GetParam());
  for (const char* layout : {"mb2", "mb1-ckpt:full", "mb2-attn:materialized-norm:unfused"}) {
    Stage s(g, layout);
    std::vector<float> logits;
    s.stage.capture_logits(&logits);
    const double loss = s.step(g);
    if (Layout::parse(layout).mb == 2) {
      const double e = rel_l2(logits.data(), g.f.at("logits").f32());
      EXPECT_LT(e, 64 * kEps32 * 8) << layout << " logits";
    }
    EXPECT_NEAR(loss, g.f.at("loss").f32()[0], 64 * kEps32 * 8 * loss) << layout;
    for (const auto& p : s.stage.params().specs) {
      const double e = rel_l2(s.stage.grad(p), g.f.at("grad." + p.name).f32());
      EXPECT_LT(e, 64 * kEps32 * 16) << layout << " grad of " << p.name;
    }
  }
}

TEST_P(GoldenTest, AdamwStepsMatchTorch) {
  Golden g(GetParam());
  const auto& o = g.f.header["optimizer"];
  OptimConfig c;
  c.lr = o["lr"];
  c.beta1 = o["beta1"];
  c.beta2 = o["beta2"];
  c.eps = o["eps"];
  c.weight_decay = o["weight_decay"];
  c.clip = o["max_grad_norm"];
  c.warmup_steps = o["warmup_steps"];
  c.schedule = Schedule::constant;
  Stage s(g, "mb2");
  Optimizer<float> opt(s.stage, c);
  const auto& losses = g.f.at("step_losses").f32();
  const auto& norms = g.f.at("grad_norms").f32();
  const auto& lrs = g.f.at("lrs").f64();
  for (int64_t step = 1; step <= int64_t(losses.size()); ++step) {
    const double loss = s.step(g);
    const StepStats st = opt.step(step, loss);
    // Each step compounds the rounding of the ones before it.
    const double tol = 64 * kEps32 * 16 * double(step);
    EXPECT_NEAR(loss, losses[size_t(step - 1)], tol * loss) << "step " << step;
    EXPECT_NEAR(st.grad_norm, norms[size_t(step - 1)], tol * st.grad_norm) << "step " << step;
    EXPECT_DOUBLE_EQ(st.lr, lrs[size_t(step - 1)]) << "step " << step;
  }
  for (const auto& p : s.stage.params().specs) {
    const double e = rel_l2(s.stage.weight(p), g.f.at("final." + p.name).f32());
    EXPECT_LT(e, 64 * kEps32 * 16 * 5) << "final " << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("golden_llama_gqa.bin", "golden_llama_tied.bin"));

}  // namespace
}  // namespace weft::trainer
