// A micro-batch routed past expert parallelism's receive buffers in the
// middle of a run (a third source of test_moe_parity): every rank stops
// before that step's update, exit 2 naming the step, the layer and the rows,
// with the checkpoint of the step before it (under the default --ckpt-every
// 0 too), from which a resume with larger buffers trains the reference's
// losses. Under FP8 delayed scaling the checkpoint's amax history is the
// step before's too: the resumed steps scale as the reference's.
//
// The buffers are set from the reference's own records: each step's
// received peak (the most rows an ep rank's experts received in one
// micro-batch, over the balanced rows x k) gives the first step s that
// received more than every step before it, and a factor that holds the most
// rows received before s and not one more stops the run at s.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moe_parity_forms.h"
#include "parity_fixture.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

// The records of kind `kind` in a run's metrics.jsonl.
std::vector<nlohmann::json> records(const std::string& out, const std::string& kind) {
  std::vector<nlohmann::json> v;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j["kind"] == kind) v.push_back(std::move(j));
  return v;
}

TEST(MoeOverflow, StopsBeforeTheStepWithTheCheckpointOfTheOneBefore) {
  const auto config = nlohmann::json::parse(kMixtral);
  // Under pp the stage that overflows finishes the step with the others.
  const std::pair<const char*, int64_t> layouts[] = {
      {"tp1-pp1-dp2-ep2-mb1", 2}, {"tp1-pp1-dp2-ep2-mb1-fp8:delayed", 2}, {"tp1-pp2-dp2-ep2-mb1-zero1", 4}};
  for (const auto& [layout_text, world] : layouts) {
    const std::string layout = layout_text;
    SCOPED_TRACE(layout);
    Fixture f(false, kMixtral);
    f.steps = 8;
    const std::string ref_out = f.dir.path("ref");
    const auto ref = f.train(layout, ref_out, "--moe-imbalance 0");
    ASSERT_EQ(ref.size(), size_t(f.steps));
    // Each step's received peak, in rows (mb 1: a micro-batch routes seq rows).
    const int64_t balanced = f.seq * config["num_experts_per_tok"].get<int64_t>();
    std::vector<int64_t> most;
    for (const auto& j : records(ref_out, "train"))
      most.push_back(std::llround(j["expert_load"]["received_peak"].get<double>() * double(balanced)));
    ASSERT_EQ(most.size(), size_t(f.steps));
    // The last step that received more than every step before it (the
    // latest, so that the run stops with as many steps behind it as it can).
    int64_t held = most[0];
    int64_t stop = 0;  // the 1-based step that overflows
    for (size_t i = 1; i < most.size(); ++i) {
      if (most[i] > held) stop = int64_t(i) + 1;
      held = std::max(held, most[i]);
    }
    ASSERT_GT(stop, 1) << "no step after the first received more rows than every step before it";
    held = *std::max_element(most.begin(), most.begin() + (stop - 1));
    // ceil(factor x balanced) = held: the rows before `stop`, not one more.
    const double factor = (double(held) - 0.5) / double(balanced);
    ASSERT_GE(factor, 1.0);

    const std::string out = f.dir.path("over");
    const auto cmd = [&](const std::string& extra) {
      return fmt::format(
          "train --data {} --model {} --seq {} --global-batch {} --steps {} --warmup 2 --log-every 1 --threads 1 "
          "--eval-samples 8 --comm-timeout 120 --layout {} --out {} {}",
          f.data, f.config, f.seq, f.global_batch, f.steps, layout, out, extra);
    };
    const auto over = Fixture::run_mpi(world, cmd(fmt::format("--moe-imbalance {:.17g}", factor)));
    EXPECT_EQ(over.code, 2) << over.out;
    const std::string ckpt = fmt::format("{}/checkpoints/step_{:06d}", out, stop - 1);
    for (const std::string& said :
         {fmt::format("weft: error: step {}: MoE layer ", stop),
          fmt::format("rows of a micro-batch, past the {} its buffers hold (--moe-imbalance {:g}: ", held, factor),
          fmt::format("checkpoint {} holds step {}, the last completed: continue from it with --resume", ckpt,
                      stop - 1)})
      EXPECT_NE(over.out.find(said), std::string::npos) << said << "\n" << over.out;
    // Said once (rank 0), and the records end before the step that overflowed.
    EXPECT_EQ(over.out.find("weft: error:"), over.out.rfind("weft: error:")) << over.out;
    const auto trained = records(out, "train");
    ASSERT_EQ(trained.size(), size_t(stop - 1));
    for (size_t i = 0; i < trained.size(); ++i)
      EXPECT_LE(std::fabs(trained[i]["loss"].get<double>() - ref[i]) / ref[i], 1e-5) << "step " << i + 1;
    const auto end = records(out, "end");
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0]["last_step"], stop - 1);
    EXPECT_EQ(end[0]["error"].get<std::string>().rfind(fmt::format("step {}: MoE layer", stop), 0), 0u) << end[0];
    EXPECT_TRUE(fs::exists(ckpt));
    EXPECT_FALSE(fs::exists(fmt::format("{}/checkpoints/step_{:06d}", out, stop)));

    // Resumed with the worst case's buffers: every step the reference's.
    const auto resumed = Fixture::run_mpi(world, cmd("--resume --moe-imbalance 0 --change moe-imbalance"));
    EXPECT_EQ(resumed.code, 0) << resumed.out;
    std::vector<double> losses;
    for (const auto& j : records(out, "train")) losses.push_back(j["loss"].get<double>());
    EXPECT_LE(max_rel(losses, ref), 1e-5);
    std::printf("%s: received %s rows; stopped at step %lld (%lld rows past the %lld held), resumed from step "
                "%lld: rel %.1e\n",
                layout.c_str(), fmt::format("{}", fmt::join(most, ", ")).c_str(), static_cast<long long>(stop),
                static_cast<long long>(most[size_t(stop - 1)]), static_cast<long long>(held),
                static_cast<long long>(stop - 1), max_rel(losses, ref));
  }
}

}  // namespace
}  // namespace weft::test
