// `weft train` end to end on the CPU, its recipes and MoE models: --auto
// tunes then reuses the cached recipe, a recipe of another run or a
// malformed one is refused by name, and an MoE model trains from the
// command line with its options checked.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "cli_runner.h"
#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

TEST(CliTrain, AutoTunesThenReusesTheCachedRecipe) {
  TempDir dir;
  const auto data = corpus(dir);
  ::setenv("XDG_CACHE_HOME", dir.path("cache").c_str(), 1);
  const std::string cmd = "train --data " + data +
                          " --model tiny --seq 32 --global-batch 4 --threads 1 --steps 2 --eval-samples 4 "
                          "--tune-top 2 --trial-min-time 0.05 --out ";
  // No layout, recipe or knob: --auto is the default.
  auto r = run_weft(cmd + dir.path("a"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tuning tiny on 1 x cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[2/2] "), std::string::npos) << r.out;
  const auto recipe = nlohmann::json::parse(slurp(dir.path("a/recipe.json")));
  EXPECT_EQ(recipe["source"], "profiled");
  EXPECT_FALSE(recipe["machine"].get<std::string>().empty());
  EXPECT_NE(r.out.find("layout " + recipe["layout"].get<std::string>()), std::string::npos) << r.out;
  r = run_weft(cmd + dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("using cached recipe"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[1/"), std::string::npos) << r.out;
  // A knob given without --auto chooses the layout by hand: no tuning.
  r = run_weft(cmd + dir.path("c") + " --mb 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("tuning"), std::string::npos) << r.out;
  // With --auto, knobs restrict the space.
  r = run_weft(cmd + dir.path("d") + " --auto --retune --mb 1 --attn materialized --cp 1 --cp-comm ring --zero 1");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto pinned = nlohmann::json::parse(slurp(dir.path("d/tuning.json")));
  for (const auto& t : pinned["trials"]) {
    EXPECT_NE(t["layout"].get<std::string>().find("-mb1-"), std::string::npos) << t.dump();
    EXPECT_NE(t["layout"].get<std::string>().find("attn:materialized"), std::string::npos) << t.dump();
    EXPECT_NE(t["layout"].get<std::string>().find("-zero1-"), std::string::npos) << t.dump();
  }
  ::unsetenv("XDG_CACHE_HOME");
}

TEST(CliTrain, RecipesOfAnotherRunOrMalformedAreRefusedByName) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string run = "train --data " + data + " --model tiny --seq 32 --global-batch 4 --threads 1 --steps 1 "
                          "--out " + dir.path("run") + " --recipe ";
  auto r = run_weft("tune --dry-run --model tiny --gpu cpu --gpus 1 --seq 32 --global-batch 4 --precision fp32 "
                    "--save-recipe " + dir.path("good.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto good = nlohmann::json::parse(slurp(dir.path("good.json")));
  r = run_weft("tune --dry-run --model tiny-tied --gpu cpu --gpus 1 --seq 32 --global-batch 4 --precision fp32 "
               "--save-recipe " + dir.path("tied.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string other_model = slurp(dir.path("tied.json"));
  struct Case {
    std::string name;
    std::string text;
    std::vector<std::string> says;
  };
  auto edited = [&](auto edit) {
    auto j = good;
    edit(j);
    return j.dump(1);
  };
  const std::string text = good.dump(1);
  const std::vector<Case> cases = {
      {"model", other_model, {"model hash: recipe"}},
      {"edited", edited([](auto& j) { j["model"]["layers"] = 8; }), {"edited.json", "hash"}},
      {"world", edited([](auto& j) { j["cluster"]["world"] = 4; }), {"world size: recipe 4, this run 1"}},
      {"device", edited([](auto& j) { j["cluster"]["device"] = "h100"; }), {"device: recipe h100, this run cpu"}},
      {"truncated", text.substr(0, text.size() / 2), {"truncated.json"}},
      {"malformed", edited([](auto& j) { j.erase("layout"); }), {"malformed.json", "layout"}},
      {"not a recipe", R"({"layout": "tp1-pp1-dp1-mb1"})", {"not a weft recipe"}},
  };
  for (const auto& c : cases) {
    const auto path = dir.file(c.name == "not a recipe" ? "other.json" : c.name + ".json", c.text);
    r = run_weft(run + path);
    EXPECT_EQ(r.code, 2) << c.name << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << c.name << "\n" << r.out;
    for (const auto& s : c.says) EXPECT_NE(r.out.find(s), std::string::npos) << c.name << "\n" << r.out;
    EXPECT_EQ(slurp(path), c.text) << c.name;
  }
  EXPECT_FALSE(fs::exists(dir.path("run/checkpoints")));
  // Tuning options that make no sense.
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--auto --layout tp1-pp1-dp1-mb1", "--auto chooses the layout"},
           {"--tune-budget 10x", "duration '10x'"},
           {"--tune-top 0", "--tune-top 0"},
           {"--retune --mb 2", "--retune applies to --auto"}}) {
    r = run_weft("train --data " + data + " --model tiny --seq 32 --global-batch 4 --steps 1 --out " +
                 dir.path("run2") + " " + args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
  }
}

// An MoE model trains from the command line, its balancing loss in the
// progress line and the metrics; its options are refused where they mean
// nothing or name nothing valid, and a layout the MoE trainer does not run
// yet is refused by name.
TEST(CliTrain, MixtureOfExpertsTrainsAndItsOptionsAreChecked) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string moe = " --model tiny-moe --seq 32 --global-batch 4 --threads 1 --log-every 1 --eval-samples 4";
  auto r = run_weft("train --data " + data + moe + " --layout mb2 --steps 3 --moe-aux-coef 0.05 --out " +
                    dir.path("moe"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("| aux 0.1"), std::string::npos) << r.out;  // coef x k at balance: about 0.05 x 2
  std::ifstream in(dir.path("moe") + "/metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    ++records;
    EXPECT_NEAR(j["aux_loss"].get<double>(), 0.1, 0.02) << line;
    // Every MoE layer's experts took the step's 4 x 32 tokens twice (top-2).
    ASSERT_EQ(j["expert_load"]["layers"].size(), 4u) << line;
    for (const auto& row : j["expert_load"]["counts"]) {
      int64_t sum = 0;
      for (const auto& v : row) sum += v.get<int64_t>();
      EXPECT_EQ(sum, 4 * 32 * 2) << line;
    }
  }
  EXPECT_EQ(records, 3);
  r = run_weft("train --data " + data + kSmall + " --steps 1 --moe-aux-coef 0.1 --out " + dir.path("dense"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--moe-aux-coef applies to MoE models; tiny is dense"), std::string::npos) << r.out;
  r = run_weft("train --data " + data + moe + " --layout mb2 --steps 1 --moe-aux-scope layer --out " + dir.path("x"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--moe-aux-scope layer is not a scope; use global"), std::string::npos) << r.out;
  // Block scaling trains MoE blocks (MoeParity.Fp8BlockScalingOfTheExperts, Fp8BlockTilesDownTheTokensAcrossRanks)
  // where its tiles fit; tiny-moe's experts are 96 wide and its runs of 32 tokens, so nothing would run in FP8.
  r = run_weft("train --data " + data + moe + " --layout mb2-fp8:blockwise --steps 1 --out " + dir.path("y"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no GEMM runs in FP8 under fp8:blockwise"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the routed experts stay in fp32: FP8 needs C and each expert's local width multiples of "
                       "128 (C 128, width 96)"),
            std::string::npos)
      << r.out;

  // A capacity of half the balanced share drops at least half the choices:
  // counted per MoE layer in the records and shown in the progress line.
  r = run_weft("train --data " + data + moe + " --layout mb2 --steps 2 --moe-capacity-factor 0.5 --out " +
               dir.path("capped"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("| dropped "), std::string::npos) << r.out;
  std::ifstream capped(dir.path("capped") + "/metrics.jsonl");
  records = 0;
  for (std::string line; std::getline(capped, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    ++records;
    ASSERT_EQ(j["expert_load"]["dropped"].size(), 4u) << line;
    for (const auto& d : j["expert_load"]["dropped"]) {
      // Each micro-batch's 2 x 32 x 2 choices keep at most E x ceil(0.5 x 128 / E).
      EXPECT_GE(d.get<int64_t>(), 4 * 32 * 2 / 2) << line;
      EXPECT_LT(d.get<int64_t>(), 4 * 32 * 2) << line;
    }
  }
  EXPECT_EQ(records, 2);
  // The layout may name the factor (cap:F); the option must then agree.
  // Several factors are for tuning to search, not for a run given its layout.
  r = run_weft("train --data " + data + moe + " --layout mb2-cap:0.5 --steps 1 --out " + dir.path("cap_layout"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("| dropped "), std::string::npos) << r.out;
  r = run_weft("train --data " + data + moe + " --layout mb2-cap:0.5 --moe-capacity-factor 1 --steps 1 --out " +
               dir.path("cap_both"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--moe-capacity-factor 1 and --layout mb2-cap:0.5 disagree (the layout says cap:0.5)"),
            std::string::npos)
      << r.out;
  r = run_weft("train --data " + data + moe + " --layout mb2 --moe-capacity-factor 0,1 --steps 1 --out " +
               dir.path("cap_two"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--moe-capacity-factor lists 2 factors, which tuning searches (--auto)"), std::string::npos)
      << r.out;
  r = run_weft("train --data " + data + kSmall + " --layout mb2-cap:1 --steps 1 --out " + dir.path("cap_dense"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cap:1 names an MoE capacity factor, but tiny is dense"), std::string::npos) << r.out;
  r = run_weft("train --data " + data + kSmall + " --steps 1 --moe-capacity-factor 1 --out " + dir.path("dense2"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--moe-capacity-factor applies to MoE models; tiny is dense"), std::string::npos) << r.out;
  r = run_weft("train --data " + data + moe + " --layout mb2 --steps 1 --moe-capacity-factor -1 --out " +
               dir.path("z"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--moe-capacity-factor -1 must be 0 (dropless"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace weft::test
