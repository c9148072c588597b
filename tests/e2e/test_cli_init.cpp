// `weft train --init` end to end on one rank: from the Hugging Face folders
// of tools/hf_init_fixtures.py (fp32, bf16, tied and sharded, Llama 3 RoPE
// scaling) the first
// step's loss is transformers' loss on the same tokens; --steps 0 and
// `weft export` give the folder's tensors back bit for bit; a weft checkpoint
// starts a new run at step 1; --init with --resume continues a relaunched
// run; and each bad input is one line, exit code 2, with nothing written.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "cli_runner.h"
#include "hf_init_fixture.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

constexpr double kLossTolerance = 1e-5;  // relative; fp32 on both sides
const std::string kOneRank = "tp1-pp1-dp1-mb3";

nlohmann::json read_json(const std::string& path) {
  nlohmann::json j;
  std::ifstream(path) >> j;
  return j;
}

TEST(CliInit, TheFirstLossIsTransformersLoss) {
  TempDir dir;
  for (const char* folder : {"untied", "untied_bf16", "untied_fp16", "tied_sharded", "rope_llama3"}) {
    const auto out = dir.path(folder);
    const auto r = run_weft(hf_train_args(kOneRank, out) + " --steps 2 --init " + hf_fixture(folder));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("initialised from Hugging Face folder"), std::string::npos) << r.out;
    const auto losses = metrics_losses(out);
    ASSERT_EQ(losses.size(), 2u) << folder;
    const double want = hf_reference_loss(folder);
    EXPECT_NEAR(losses[0], want, kLossTolerance * want) << folder;
    EXPECT_LT(losses[1], losses[0]) << folder;  // and it trains
    const auto man = read_json(out + "/checkpoints/step_000002/manifest.json");
    EXPECT_EQ(man["step"], 2);
    EXPECT_EQ(man["optimizer"]["step"], 2);
    EXPECT_EQ(man["run"]["init"], hf_fixture(folder));
    EXPECT_EQ(man["model"]["name"], folder);  // the folder's config, no --model given
  }
}

TEST(CliInit, StepsZeroAndExportGiveTheTensorsBack) {
  TempDir dir;
  for (const char* folder : {"untied", "untied_bf16", "tied_sharded", "rope_llama3"}) {
    const auto out = dir.path(folder);
    auto r = run_weft(hf_train_args(kOneRank, out) + " --steps 0 --init " + hf_fixture(folder));
    ASSERT_EQ(r.code, 0) << r.out;
    const auto ckpt = out + "/checkpoints/step_000000";
    const auto man = read_json(ckpt + "/manifest.json");
    EXPECT_EQ(man["step"], 0);
    EXPECT_EQ(man["data_position"], 0);
    EXPECT_EQ(man["optimizer"]["step"], 0);
    r = run_weft("export --checkpoint " + ckpt + " --out " + dir.path(std::string(folder) + "-hf"));
    ASSERT_EQ(r.code, 0) << r.out;
    expect_same_tensors(dir.path(std::string(folder) + "-hf"), hf_fixture(folder));
    // The exported config is the folder's model, token ids included.
    const auto cfg = read_json(dir.path(std::string(folder) + "-hf/config.json"));
    const auto src = read_json(hf_fixture(folder) + "/config.json");
    for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                            "tie_word_embeddings", "bos_token_id", "eos_token_id"})
      EXPECT_EQ(cfg[key], src[key]) << folder << " " << key;
    EXPECT_EQ(cfg["rope_theta"], src["rope_parameters"]["rope_theta"]) << folder;
    // rope_scaling as transformers 4 writes it: the folder's rope_parameters
    // less rope_theta, or null for plain RoPE.
    auto scaling = src["rope_parameters"];
    scaling.erase("rope_theta");
    EXPECT_EQ(cfg["rope_scaling"], scaling["rope_type"] == "default" ? nlohmann::json() : scaling) << folder;
    EXPECT_EQ(man["model"].contains("rope_scaling"), scaling["rope_type"] != "default") << folder;
    // weft eval of the imported model: transformers' loss over every window.
    r = run_weft("eval --checkpoint " + ckpt + " --data " + hf_fixture("tokens.npy") + " --samples 6");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto at = r.out.find("loss ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const double want = hf_reference_loss(folder);
    EXPECT_NEAR(std::stod(r.out.substr(at + 5)), want, 1e-6 + kLossTolerance * want) << r.out;
  }
}

// The scaled folder's test means something: transformers' loss of the same
// weights with plain RoPE is far outside the tolerance.
TEST(CliInit, TheRopeScalingFolderIsSensitiveToTheScaling) {
  const double scaled = hf_reference_loss("rope_llama3"), plain = hf_reference_loss("rope_llama3", "loss_plain_rope");
  EXPECT_GT(std::fabs(scaled - plain), 100 * kLossTolerance * scaled) << scaled << " vs " << plain;
}

TEST(CliInit, AWeftCheckpointStartsANewRun) {
  TempDir dir;
  const auto first = dir.path("first");
  auto r = run_weft(hf_train_args(kOneRank, first) + " --steps 3 --init " + hf_fixture("untied"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ckpt = first + "/checkpoints/step_000003";
  const auto second = dir.path("second");
  r = run_weft(hf_train_args(kOneRank, second) + " --steps 2 --init " + ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("initialised from weft checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step     1/2"), std::string::npos) << r.out;
  EXPECT_EQ(metrics_losses(second).size(), 2u);
  const auto man = read_json(second + "/checkpoints/step_000002/manifest.json");
  EXPECT_EQ(man["step"], 2);
  EXPECT_EQ(man["optimizer"]["step"], 2);  // a fresh optimizer: not 3 + 2
  EXPECT_EQ(man["run"]["init"], ckpt);
  // --steps 0 from the checkpoint exports what exporting the checkpoint
  // does; without a layout it tunes nothing (and takes the default mb 4).
  r = run_weft(fmt::format("train --data {} --seq 12 --global-batch 4 --threads 1 --steps 0 --out {} --init {}",
                           hf_fixture("tokens.npy"), dir.path("zero"), ckpt));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("recipe"), std::string::npos) << r.out;
  ASSERT_EQ(run_weft("export --checkpoint " + ckpt + " --out " + dir.path("a")).code, 0);
  ASSERT_EQ(run_weft("export --checkpoint " + dir.path("zero/checkpoints/step_000000") + " --out " +
                     dir.path("b")).code, 0);
  expect_same_tensors(dir.path("b"), dir.path("a"));
}

TEST(CliInit, ExplicitModelAndPaddedVocabulary) {
  TempDir dir;
  const auto folder = hf_fixture("untied");
  auto r = run_weft(hf_train_args(kOneRank, dir.path("a")) + " --steps 1 --init " + folder + " --model " + folder +
                    "/config.json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NEAR(metrics_losses(dir.path("a"))[0], hf_reference_loss("untied"), kLossTolerance * 6.1);
  r = run_weft(hf_train_args(kOneRank, dir.path("b")) + " --steps 1 --init " + folder + " --vocab 72");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("vocabulary enlarged from 64 to 72 by --vocab"), std::string::npos) << r.out;
  const double want = hf_reference_loss("untied", "loss_vocab72");
  EXPECT_NEAR(metrics_losses(dir.path("b"))[0], want, kLossTolerance * want);
}

// A job relaunched with the same command continues: --init applies only
// while the run has no checkpoint.
TEST(CliInit, InitWithResumeContinuesARelaunchedRun) {
  TempDir dir;
  const auto out = dir.path("run");
  const std::string cmd = hf_train_args(kOneRank, out) + " --resume --init " + hf_fixture("untied");
  auto r = run_weft(cmd + " --steps 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("initialised from"), std::string::npos) << r.out;
  r = run_weft(cmd + " --steps 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + out + "/checkpoints/step_000002 at step 2"), std::string::npos) << r.out;
  EXPECT_EQ(metrics_losses(out).size(), 4u);
}

TEST(CliInit, BadInputIsOneClearLineAndNothingIsWritten) {
  TempDir dir;
  const auto good = dir.path("good");
  auto r = run_weft(hf_train_args(kOneRank, good) + " --steps 1 --init " + hf_fixture("untied"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto metrics_before = metrics_losses(good).size();

  const auto copy = [&](const std::string& name) {
    fs::copy(hf_fixture("untied"), dir.path(name), fs::copy_options::recursive);
    return dir.path(name);
  };
  const std::string up = "model.layers.2.mlp.up_proj.weight";
  const auto rewrite = [&](const std::string& folder, auto edit) {
    const checkpoint::SafetensorsFile src(hf_fixture("untied") + "/model.safetensors");
    std::vector<checkpoint::TensorRef> t = src.tensors();
    edit(t);
    checkpoint::safetensors_write(folder + "/model.safetensors", t, {{"format", "pt"}});
  };
  const auto missing = copy("missing");
  rewrite(missing, [&](auto& t) { std::erase_if(t, [&](const auto& x) { return x.name == up; }); });
  const auto shape = copy("shape");
  rewrite(shape, [&](auto& t) {
    for (auto& x : t)
      if (x.name == up) x.shape = {16, 40};
  });
  fs::create_directories(dir.path("empty"));
  // A weft checkpoint whose bytes were damaged after it was written: only
  // its checksums tell.
  fs::copy(good + "/checkpoints/step_000001", dir.path("corrupt"), fs::copy_options::recursive);
  {
    std::fstream f(dir.path("corrupt/model.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  const auto with_config = [&](const std::string& name, const nlohmann::json& patch) {
    const auto folder = copy(name);
    auto cfg = read_json(folder + "/config.json");
    cfg.merge_patch(patch);
    std::ofstream(folder + "/config.json") << cfg.dump(2);
    return folder;
  };
  const auto yarn = with_config("yarn", {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}},
                                         {"attention_bias", true}});
  const auto scaled = with_config("scaled", {{"rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0},
                                                                  {"low_freq_factor", 2.0}, {"high_freq_factor", 8.0},
                                                                  {"original_max_position_embeddings", 128}}}});
  const auto untied = hf_fixture("untied");
  struct Case {
    std::string args;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"--init " + missing, {up, "missing"}},
      {"--init " + shape, {up, "[16, 40]", "[40, 16]"}},
      {"--init " + untied + " --model tiny",
       {"hidden: checkpoint 16, this run 128", "intermediate: checkpoint 40, this run 352",
        "rope_theta: checkpoint 500000, this run 10000", "without --model"}},
      {"--init " + untied + " --vocab 32", {"vocab: checkpoint 64, this run 32", "pad"}},
      {"--init " + yarn, {"rope_parameters has rope_type 'yarn'", "attention_bias is true"}},
      {"--init " + untied + " --model " + scaled + "/config.json",
       {"rope_scaling: checkpoint null, this run {", "\"rope_type\":\"llama3\""}},
      {"--init " + dir.path("empty"), {"not a checkpoint", "config.json", "manifest.json"}},
      {"--init " + dir.path("nope"), {"nope", "does not exist"}},
      {"--init " + untied + "/model.safetensors", {"is a file"}},
      {"--init " + dir.path("corrupt"), {"model.safetensors", "checksum"}},
      {"--init " + untied + " --resume-from " + good + "/checkpoints/step_000001", {"--resume-from", "one of them"}},
      {"--init " + untied + " --steps -1", {"--steps -1"}},
  };
  for (const auto& c : cases) {
    for (const auto& out : {good, dir.path("fresh")}) {
      const auto res = run_weft(hf_train_args(kOneRank, out) + " --steps 3 " + c.args);
      EXPECT_EQ(res.code, 2) << c.args << "\n" << res.out;
      EXPECT_EQ(std::count(res.out.begin(), res.out.end(), '\n'), 1) << c.args << "\n" << res.out;
      EXPECT_EQ(res.out.rfind("weft: error: ", 0), 0u) << c.args << "\n" << res.out;
      // Into the good run's folder, the folder's own refusal may come
      // first: it is checked before the checksums are read.
      if (out == good && res.out.find("already holds a run") != std::string::npos) continue;
      for (const auto& s : c.says) EXPECT_NE(res.out.find(s), std::string::npos) << c.args << "\n" << res.out;
    }
  }
  EXPECT_FALSE(fs::exists(dir.path("fresh"))) << "a refused run created its folder";
  EXPECT_EQ(metrics_losses(good).size(), metrics_before);
  EXPECT_FALSE(fs::exists(good + "/checkpoints/step_000003"));
}

}  // namespace
}  // namespace weft::test
