// A run is never silently changed: what `weft train --resume` continues from,
// with which settings, and what the metrics say afterwards.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> records(const std::string& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// How many records of each (kind, step) the file holds.
std::map<std::pair<std::string, int64_t>, int> step_counts(const std::string& metrics) {
  std::map<std::pair<std::string, int64_t>, int> n;
  for (const auto& r : records(metrics))
    if (r.contains("step")) ++n[{r["kind"].get<std::string>(), r["step"].get<int64_t>()}];
  return n;
}

// A damaged newest checkpoint: --resume refuses (exit 2) naming it and the
// intact one to continue from, and changes nothing; --resume-from that one
// trains the steps after it again, and metrics.jsonl then says each step
// once, the earlier records kept whole beside it.
TEST(CliResume, DamagedNewestCheckpointIsRefusedAndNoStepIsRecordedTwice) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string out = dir.path("run");
  const std::string common = "train --data " + data + kSmall + " --out " + out;
  auto r = run_weft(common + " --steps 4 --ckpt-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string metrics = out + "/metrics.jsonl";
  const auto before = records(metrics);
  fs::resize_file(out + "/checkpoints/step_000004/model.safetensors", 1000);

  r = run_weft(common + " --steps 6 --resume");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("step_000004 is damaged"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.safetensors is 1000 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--resume-from " + out + "/checkpoints/step_000002"), std::string::npos) << r.out;
  EXPECT_EQ(records(metrics).size(), before.size());
  EXPECT_FALSE(fs::exists(out + "/checkpoints/step_000006"));

  r = run_weft(common + " --steps 6 --resume-from " + out + "/checkpoints/step_000002");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("superseded by this resume at step 2"), std::string::npos) << r.out;
  for (const auto& [key, n] : step_counts(metrics)) EXPECT_EQ(n, 1) << key.first << " step " << key.second;
  EXPECT_EQ(losses(metrics).size(), 6u);
  // The file as it was, whole, beside it; the new launch's header says so.
  std::string kept;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().starts_with("metrics.jsonl.prev-")) kept = e.path().string();
  ASSERT_FALSE(kept.empty());
  EXPECT_EQ(records(kept), before);
  const auto all = records(metrics);
  const auto header = std::find_if(all.rbegin(), all.rend(), [](const auto& j) { return j["kind"] == "run"; });
  ASSERT_NE(header, all.rend());
  EXPECT_EQ((*header)["superseded"]["first_step"], 3);
  EXPECT_EQ((*header)["superseded"]["last_step"], 4);
  EXPECT_EQ((*header)["superseded"]["kept"], kept);
}

// Lines of the tuning journal that record a finished trial.
int64_t journal_trials(const std::string& path) {
  int64_t n = 0;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    n += j.is_object() && j.value("kind", "") == "result";
  }
  return n;
}

// SIGINT in the middle of a tuning: exit 130, nothing trained, no recipe in
// the run folder or the cache (a later run must not trust a part of a
// tuning), the report says it stopped; the same command then continues the
// tuning from the journal and saves the recipe it finishes with.
TEST(CliResume, AStoppedTuningLeavesNoRecipeAndContinuesFromItsJournal) {
  TempDir dir;
  const auto data = corpus(dir);
  ::setenv("XDG_CACHE_HOME", dir.path("cache").c_str(), 1);
  const std::string out = dir.path("run");
  const std::string cmd = "train --data " + data +
                          " --model tiny --seq 32 --global-batch 4 --threads 1 --steps 2 --eval-samples 4 "
                          "--tune-top 6 --trial-min-time 1 --out " + out;
  const pid_t pid = spawn_weft(cmd);
  ASSERT_GE(pid, 0);
  const std::string journal = out + "/tuning/journal.jsonl";
  for (int i = 0; i < 1200 && journal_trials(journal) < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(journal_trials(journal), 2);
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_FALSE(fs::exists(out + "/recipe.json"));
  EXPECT_FALSE(fs::exists(dir.path("cache/weft/recipes")) && !fs::is_empty(dir.path("cache/weft/recipes")));
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(out + "/checkpoints"));
  const auto report = nlohmann::json::parse(slurp(out + "/tuning.json"));
  EXPECT_EQ(report["stopped"], true);
  EXPECT_EQ(report["stop_reason"], "stopped by SIGINT");
  const int64_t done = journal_trials(journal);

  // --resume, as after any stop: the tuning goes on from its journal.
  auto r = run_weft(cmd + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("using cached recipe"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(from the journal)"), std::string::npos) << r.out;
  EXPECT_GT(journal_trials(journal), done);
  EXPECT_EQ(nlohmann::json::parse(slurp(out + "/recipe.json"))["source"], "profiled");
  EXPECT_EQ(nlohmann::json::parse(slurp(out + "/tuning.json"))["stopped"], false);
  EXPECT_EQ(losses(out + "/metrics.jsonl").size(), 2u);
  ::unsetenv("XDG_CACHE_HOME");
}

// A resume keeps the run's optimizer settings and seed: a command that
// differs is refused (exit 2) naming each setting with both values and the
// --change that allows it; with --change the run goes on with the new values,
// said on the terminal and in the run header, with a longer --steps (free to
// change) beside them. A manifest whose saved settings are out of range is a
// damaged file.
TEST(CliResume, OptimizerSettingsChangeOnlyWhenAsked) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string out = dir.path("run");
  const std::string common = "train --data " + data + kSmall + " --out " + out;
  auto r = run_weft(common + " --steps 4 --lr 1e-3");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string metrics = out + "/metrics.jsonl";
  const size_t lines = records(metrics).size();

  r = run_weft(common + " --steps 6 --lr 7.5e-4 --warmup 3 --seed 9 --resume");
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* part : {"--lr 0.00075 (the run was trained with 0.001)", "--warmup 3 (the run was trained with 20)",
                           "--seed 9 (the run was trained with 1234)", "--change lr,warmup,seed"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;
  EXPECT_EQ(records(metrics).size(), lines);

  // Unstated settings are the run's: no refusal, and said.
  r = run_weft("train --data " + data + kSmall + " --out " + out + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("continuing with the run's settings from " + out + "/checkpoints/step_000004: --lr 0.001, "
                       "--steps 4"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("nothing to train"), std::string::npos) << r.out;

  r = run_weft(common + " --steps 6 --lr 7.5e-4 --resume --change lr");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("changed from the checkpoint: --lr 0.001 -> 0.00075; --steps 4 -> 6"), std::string::npos)
      << r.out;
  const auto all = records(metrics);
  const auto header = std::find_if(all.rbegin(), all.rend(), [](const auto& j) { return j["kind"] == "run"; });
  ASSERT_NE(header, all.rend());
  const auto changed = (*header)["changed"];
  ASSERT_EQ(changed.size(), 2u) << changed.dump();
  EXPECT_EQ(changed[0], (nlohmann::json{{"field", "lr"}, {"from", 1e-3}, {"to", 7.5e-4}}));
  EXPECT_EQ(changed[1], (nlohmann::json{{"field", "steps"}, {"from", 4}, {"to", 6}}));
  // The new value is the run's from now on; and --change asks for a resume.
  r = run_weft(common + " --steps 7 --lr 7.5e-4 --resume");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run_weft("train --data " + data + kSmall + " --steps 2 --change lr --out " + dir.path("new"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--change lr applies to a resumed run"), std::string::npos) << r.out;

  // A damaged run.optim in the manifest.
  const std::string manifest = out + "/checkpoints/step_000007/manifest.json";
  auto m = nlohmann::json::parse(slurp(manifest));
  m["run"]["optim"]["lr"] = -1.0;
  std::ofstream(manifest) << m.dump();
  r = run_weft(common + " --steps 8 --lr 7.5e-4 --resume");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("run.optim.lr is -1.0, out of its range"), std::string::npos) << r.out;
}

// An MoE run's balancing loss and capacity factor are the run's settings
// like the optimizer's: unstated, a resume takes them from the checkpoint
// (said); stated otherwise, refused until --change names them; changed, the
// new values are said and saved with the next checkpoint.
TEST(CliResume, MixtureOfExpertsTrainingSettingsChangeOnlyWhenAsked) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string out = dir.path("moe");
  const std::string common = "train --data " + data +
                             " --model tiny-moe --seq 32 --global-batch 4 --layout mb2 --threads 1 --log-every 1 "
                             "--eval-samples 4 --out " + out;
  auto r = run_weft(common + " --steps 2 --moe-aux-coef 0.05 --moe-capacity-factor 1.5");
  ASSERT_EQ(r.code, 0) << r.out;

  r = run_weft(common + " --steps 3 --moe-capacity-factor 2 --moe-aux-scope per_layer --resume");
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* part : {"--moe-aux-scope \"per_layer\" (the run was trained with \"global\")",
                           "--moe-capacity-factor 2.0 (the run was trained with 1.5)",
                           "--change moe-aux-scope,moe-capacity-factor"})
    EXPECT_NE(r.out.find(part), std::string::npos) << part << "\n" << r.out;

  // Unstated: the run's, said, and the run goes on dropping past capacity.
  r = run_weft(common + " --steps 3 --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("continuing with the run's settings from " + out +
                       "/checkpoints/step_000002: --moe-aux-coef 0.05, --moe-capacity-factor 1.5"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| dropped "), std::string::npos) << r.out;
  auto saved = nlohmann::json::parse(slurp(out + "/checkpoints/step_000003/manifest.json"));
  EXPECT_EQ(saved["model"]["moe"]["capacity_factor"], 1.5);
  EXPECT_EQ(saved["model"]["moe"]["aux_loss_coef"], 0.05);

  r = run_weft(common + " --steps 4 --moe-capacity-factor 0 --resume --change moe-capacity-factor");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("changed from the checkpoint: --moe-capacity-factor 1.5 -> 0.0; --steps 3 -> 4"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("| dropped "), std::string::npos) << r.out;
  saved = nlohmann::json::parse(slurp(out + "/checkpoints/step_000004/manifest.json"));
  EXPECT_EQ(saved["model"]["moe"]["capacity_factor"], 0.0);
  EXPECT_EQ(saved["model"]["moe"]["aux_loss_coef"], 0.05);
}

// Two signals within milliseconds (GNU timeout signals the process and its
// group; a double key press) are one stop: the run saves its checkpoint and
// exits 130, every time.
TEST(CliResume, TwoSignalsTogetherKeepTheCheckpoint) {
  TempDir dir;
  const auto data = corpus(dir);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string out = dir.path("run" + std::to_string(attempt));
    const pid_t pid = spawn_weft("train --data " + data + " --steps 100000 --out " + out + kSmall);
    ASSERT_GE(pid, 0);
    for (int i = 0; i < 600 && losses(out + "/metrics.jsonl").size() < 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_GE(losses(out + "/metrics.jsonl").size(), 2u);
    ::kill(pid, SIGINT);
    ::kill(pid, SIGINT);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status)) << "attempt " << attempt << ": killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 130);
    std::ifstream latest(out + "/checkpoints/latest");
    std::string named;
    std::getline(latest, named);
    EXPECT_TRUE(fs::exists(out + "/checkpoints/" + named + "/manifest.json")) << named;
  }
}

// --model naming a Hugging Face folder gives the architecture only: the
// terminal says the weights are not loaded and how to load them, and the
// run header says where the architecture and the weights came from.
TEST(CliResume, AModelFolderWithoutInitSaysItsWeightsAreNotLoaded) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string folder = std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/hf_init/untied";
  const std::string out = dir.path("run");
  auto r = run_weft("train --data " + data + " --model " + folder +
                    " --vocab 256 --seq 32 --global-batch 4 --mb 2 --steps 1 --eval-samples 2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--model " + folder + " gives the architecture only; its weights are not loaded"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--init " + folder + " loads the folder's weights"), std::string::npos) << r.out;
  auto header = records(out + "/metrics.jsonl").front();
  EXPECT_EQ(header["model_from"], folder + " (architecture only)");
  EXPECT_EQ(header["weights"], (nlohmann::json{{"source", "random"}, {"seed", 1234}}));

  // With --init the weights are the folder's, and no note.
  r = run_weft("train --data " + data + " --init " + folder +
               " --vocab 256 --seq 32 --global-batch 4 --mb 2 --steps 1 --eval-samples 2 --out " + dir.path("init"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("architecture only"), std::string::npos) << r.out;
  header = records(dir.path("init/metrics.jsonl")).front();
  EXPECT_EQ(header["weights"]["source"], "pretrained");
}

// The independent memory row (the kernel's count of the process's resident
// growth) measures the run itself, whatever came before it in the process:
// a fresh run, a resume (checkpoint files mapped while loading), --init
// (pretrained files) and a run tuned in the same process count the same for
// the same layout; a checkpoint save's copies are reported apart.
TEST(CliResume, IndependentMemoryIsTheRunsWhateverCameBefore) {
#ifdef WEFT_TEST_ASAN
  // ASan's allocator keeps freed memory in quarantine and adds redzones and
  // shadow pages: a sanitized process's resident size is not the run's.
  GTEST_SKIP() << "resident memory under AddressSanitizer is not the program's";
#endif
  TempDir dir;
  const auto data = corpus(dir);
  ::setenv("XDG_CACHE_HOME", dir.path("cache").c_str(), 1);
  const std::string run = "train --data " + data +
                          " --model small --seq 32 --global-batch 2 --threads 1 --eval-samples 2 --log-every 1";
  const std::string layout = " --layout tp1-pp1-dp1-mb1-ckpt:none-attn:flash";
  auto independent = [&](const std::string& out) {
    const auto j = nlohmann::json::parse(slurp(out + "/memory/rank0.json"));
    return j["independent"]["bytes"].get<double>();
  };
  auto r = run_weft(run + layout + " --steps 1 --out " + dir.path("fresh"));
  ASSERT_EQ(r.code, 0) << r.out;
  const double fresh = independent(dir.path("fresh"));
  EXPECT_GT(nlohmann::json::parse(slurp(dir.path("fresh/memory/rank0.json")))["independent_saving"].get<double>(),
            fresh);
  r = run_weft(run + layout + " --steps 2 --resume --out " + dir.path("fresh"));
  ASSERT_EQ(r.code, 0) << r.out;
  const double resumed = independent(dir.path("fresh"));
  r = run_weft(run + layout + " --steps 1 --init " + dir.path("fresh/checkpoints/step_000001") + " --out " +
               dir.path("init"));
  ASSERT_EQ(r.code, 0) << r.out;
  const double init = independent(dir.path("init"));
  r = run_weft(run + " --steps 1 --auto --mb 1 --ckpt none --attn flash --tune-top 2 --trial-min-time 0.05 --out " +
               dir.path("tuned"));
  ASSERT_EQ(r.code, 0) << r.out;
  const double tuned = independent(dir.path("tuned"));
  for (const auto& [what, v] : {std::pair{"resumed", resumed}, {"--init", init}, {"tuned", tuned}})
    EXPECT_NEAR(v / fresh, 1.0, 0.05) << what << ": " << v << " bytes, a fresh run " << fresh;
  ::unsetenv("XDG_CACHE_HOME");
}

// Data the run reads more than once is said: a warning when one step needs
// more sequences than the data holds windows, a note when the steps go past
// one epoch, and nothing when they do not.
TEST(CliResume, DataReadMoreThanOnceIsSaid) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 30; ++i) text += "A short corpus line number " + std::to_string(i) + ".\n%\n";
  const auto in = dir.file("small.txt", text);
  auto r = run_weft("data prepare --input " + in + " --out " + dir.path("data") + " --val-fraction 0.1");
  ASSERT_EQ(r.code, 0) << r.out;
  // About 840 train tokens: 26 windows of 33 tokens at --seq 32.
  const std::string run = "train --data " + dir.path("data") + " --model tiny --seq 32 --mb 2 --threads 1 "
                          "--eval-samples 2 --no-checkpoint --out ";
  r = run_weft(run + dir.path("a") + " --global-batch 64 --steps 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fewer than the 64 sequences of one step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memorise"), std::string::npos) << r.out;
  r = run_weft(run + dir.path("b") + " --global-batch 8 --steps 5");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: 5 steps of 8 sequences read the training data's"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("samples repeat from step 4 on"), std::string::npos) << r.out;
  r = run_weft(run + dir.path("c") + " --global-batch 8 --steps 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("samples repeat"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("memorise"), std::string::npos) << r.out;
}

// --memory-limit caps each rank's memory: a layout the memory model says
// needs more is refused (exit 2) before anything is allocated or written,
// naming the limit; under it the run trains.
TEST(CliResume, MemoryLimitHoldsTheLayoutToIt) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string run = "train --data " + data + kSmall + " --steps 1 --no-checkpoint";
  auto r = run_weft(run + " --memory-limit 1MiB --out " + dir.path("small"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("does not fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(--memory-limit 1MiB)"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.path("small")));
  r = run_weft(run + " --memory-limit 2GiB --out " + dir.path("big"));
  EXPECT_EQ(r.code, 0) << r.out;
  r = run_weft(run + " --memory-limit lots --out " + dir.path("bad"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("size 'lots' is not valid"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace weft::test
