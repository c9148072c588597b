// The dry-run's FP8 predictions for Llama 3.1 8B and 70B on H100 clusters:
// the best layout with bf16 GEMMs against the best with FP8 (tensorwise
// scaling, and delayed), the predicted gain in tokens/s, whether the two
// layouts differ, and the public measurements and recipes to hold them
// against (calibration/SOURCES.md, "FP8"). No device is touched.
//   fp8_gains
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/model_spec.h"
#include "tuner/space.h"

using namespace weft;
using namespace weft::tuner;

namespace {

struct Scenario {
  const char* model;
  int64_t gpus, seq, global_batch;
};

SpaceContext context(const Scenario& s) {
  SpaceContext ctx;
  ctx.model = model_preset(s.model);
  ctx.run = RunSpec{s.seq, s.global_batch, Precision::bf16};
  ctx.cluster = cluster_resolve("dgx-h100", s.gpus, 8);
  ctx.constants = cost_defaults(ctx.cluster.device);
  return ctx;
}

// The best fitting layout of the space with the GEMM precision pinned.
const Candidate* best(const SpaceReport& r) {
  return !r.candidates.empty() && r.candidates.front().verdict == Verdict::fits ? &r.candidates.front() : nullptr;
}

SpaceReport best_with(const SpaceContext& ctx, std::vector<std::pair<Fp8Recipe, int64_t>> fp8) {
  SpaceLimits lim;
  lim.fp8 = std::move(fp8);
  return search(ctx, lim, 1, ctx.cluster.device);
}

// The layout's parallel shape and kernels without its GEMM precision.
std::string without_fp8(Layout l) {
  l.fp8 = Fp8Recipe::off;
  l.fp8_bf16_layers = 0;
  return l.to_string();
}

std::string shape(const Layout& l) {
  return fmt::format("tp{}-cp{}-pp{}-dp{}-mb{}-vpp{}{}", l.tp, l.cp, l.pp, l.dp, l.mb, l.vpp, l.sp ? "-sp" : "");
}

}  // namespace

int main() {
  const double bf16_peak = device_preset("h100").peak_bf16_flops / 1e12;
  const double fp8_peak = device_preset("h100").peak_fp8_flops / 1e12;
  fmt::print("Best layout by predicted step, bf16 GEMMs against FP8 GEMMs (dgx-h100 presets, shipped hopper "
             "profile).\nMFU is against the {:.0f} TFLOP/s dense bf16 peak for both; 'fp8 util' is the model "
             "FLOP/s over the {:.0f} TFLOP/s FP8 peak.\n\n",
             bf16_peak, fp8_peak);
  fmt::print("{:<12} {:>5} {:>5} {:>6}  {:<34} {:>9} {:>6}  {:<34} {:>9} {:>6} {:>8} {:>7} {:>8}  {}\n", "model", "gpus",
             "seq", "batch", "best bf16 (shape)", "tokens/s", "MFU", "best fp8:tensorwise (shape)", "tokens/s", "MFU",
             "fp8 util", "gain", "delayed", "layouts");
  const std::vector<Scenario> scenarios = {
      {"llama3.1-8b", 8, 8192, 128},    {"llama3.1-8b", 16, 8192, 128},  {"llama3.1-8b", 64, 8192, 128},
      {"llama3.1-8b", 128, 8192, 256},  {"llama3.1-8b", 256, 8192, 512}, {"llama3.1-70b", 32, 8192, 128},
      {"llama3.1-70b", 64, 8192, 128},  {"llama3.1-70b", 128, 8192, 256}, {"llama3.1-70b", 256, 8192, 512},
  };
  for (const auto& s : scenarios) {
    const SpaceContext ctx = context(s);
    const auto r16 = best_with(ctx, {{Fp8Recipe::off, 0}});
    const auto r8 = best_with(ctx, {{Fp8Recipe::tensorwise, 0}});
    const auto rd = best_with(ctx, {{Fp8Recipe::delayed, 0}});
    const auto free = search(ctx, {}, 1, ctx.cluster.device);
    const Candidate *b16 = best(r16), *b8 = best(r8), *bd = best(rd), *bf = best(free);
    if (!b16 || !b8) {
      fmt::print("{:<12} {:>5} {:>5} {:>6}  (no layout fits)\n", s.model, s.gpus, s.seq, s.global_batch);
      continue;
    }
    const bool differ = without_fp8(b16->layout) != without_fp8(b8->layout);
    fmt::print("{:<12} {:>5} {:>5} {:>6}  {:<34} {:>9.0f} {:>5.1f}%  {:<34} {:>9.0f} {:>5.1f}% {:>7.1f}% {:>+6.1f}% {:>+7.1f}%  {}{}\n",
               s.model, s.gpus, s.seq, s.global_batch, shape(b16->layout), b16->cost.tokens_per_second,
               100 * b16->cost.mfu, shape(b8->layout), b8->cost.tokens_per_second, 100 * b8->cost.mfu,
               100 * b8->cost.fp8_peak_utilization, 100 * (b8->cost.tokens_per_second / b16->cost.tokens_per_second - 1),
               bd ? 100 * (bd->cost.tokens_per_second / b16->cost.tokens_per_second - 1) : 0.0,
               differ ? "differ" : "same", bf && bf->layout.fp8 == Fp8Recipe::off ? " (free search picks bf16)" : "");
  }

  // The published Llama 3 70B recipes on 64 H100 (Megatron-Bridge's H100
  // presets): TP4 PP4 CP2 VP5 in BF16, TP4 PP8 VP5 in FP8 (current scaling),
  // both micro-batch 1, global batch 128, seq 8192, attention through
  // Transformer Engine, which on Hopper runs cuDNN's fused SDPA, and the
  // tensor-parallel collectives overlapped with the GEMMs (userbuffers, in
  // both recipes). Each priced under both precisions: does the model rank
  // them as the recipes chose?
  fmt::print("\nPublished Llama 3 70B H100 recipes (64 GPUs, seq 8192, global batch 128), predicted:\n");
  SpaceContext ctx = context({"llama3.1-70b", 64, 8192, 128});
  ctx.constants.tp_overlap = 1;
  const char* bf16_recipe = "tp4-cp2-pp4-dp2-mb1-vpp5-sp-ckpt:none-attn:cudnn-zero1-grad:bf16-cp:ring";
  const char* fp8_recipe = "tp4-pp8-dp2-mb1-vpp5-sp-ckpt:none-attn:cudnn-zero1-grad:bf16";
  for (const auto& [name, fp8] : {std::pair{"bf16", Fp8Recipe::off}, {"fp8:tensorwise", Fp8Recipe::tensorwise}}) {
    double steps[2];
    int i = 0;
    for (const char* text : {bf16_recipe, fp8_recipe}) {
      Layout l = Layout::parse(text);
      l.fp8 = fp8;
      const Candidate c = evaluate_one(ctx.model, ctx.run, ctx.cluster, l, ctx.constants, ctx.memory);
      steps[i++] = c.cost.step;
      fmt::print("  GEMMs {:<15} {:<52} step {:6.2f} s  {:>7.0f} tokens/s  MFU {:4.1f}%  {}\n", name,
                 i == 1 ? "BF16 recipe tp4-cp2-pp4-vpp5" : "FP8 recipe tp4-pp8-vpp5", c.cost.step,
                 c.cost.tokens_per_second, 100 * c.cost.mfu,
                 c.verdict == Verdict::fits ? "fits" : std::string(to_string(c.verdict)) + ": " + c.reason);
    }
    fmt::print("  -> under {} the model prefers the {} recipe ({:+.1f}%)\n", name,
               steps[0] <= steps[1] ? "BF16 (tp4-cp2-pp4)" : "FP8 (tp4-pp8)", 100 * (steps[0] / steps[1] - 1));
  }
  return 0;
}
