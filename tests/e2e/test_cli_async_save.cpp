// Checkpoints written while training goes on (trainer/async_save.h): the
// files are those a synchronous save writes, so a run resumed from either
// continues with the same losses bit for bit; and a process killed at any
// moment, a write in flight or not, leaves a `latest` checkpoint that loads
// and resumes to the uninterrupted run's losses.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

const std::string kRun = " --model small --seq 32 --global-batch 4 --layout tp1-pp1-dp1-mb2 --threads 1 --log-every 1 --eval-samples 2";

TEST(CliAsyncSave, TheSameFilesAsASynchronousSave) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string run = "train --data " + data + kRun + " --steps 4 --ckpt-every 2";
  auto r = run_weft(run + " --out " + dir.path("async"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft(run + " --out " + dir.path("sync") + " --sync-checkpoints");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(slurp(dir.path(std::string("async/checkpoints/step_000002/") + f)),
              slurp(dir.path(std::string("sync/checkpoints/step_000002/") + f)))
        << f;
  // The metrics say what each save stalled training for.
  int saves = 0;
  std::ifstream in(dir.path("async/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "checkpoint") continue;
    ++saves;
    EXPECT_EQ(j["async"].get<bool>(), j["step"].get<int64_t>() == 2) << line;
    EXPECT_GT(j["stall_s"].get<double>(), 0.0);
  }
  EXPECT_EQ(saves, 2);
}

// Killed (SIGKILL: no chance to clean up) at several moments of a run that
// saves every step: `latest` always names a complete checkpoint, and
// --resume from it gives the uninterrupted run's losses for the steps after.
TEST(CliAsyncSave, AKillDuringAWriteLeavesTheLastCompleteCheckpoint) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string run = "train --data " + data + kRun + " --steps 8 --ckpt-every 1";
  auto r = run_weft(run + " --out " + dir.path("whole"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto whole = losses(dir.path("whole/metrics.jsonl"));
  ASSERT_EQ(whole.size(), 8u);
  for (const int delay_ms : {3100, 4700}) {
    SCOPED_TRACE(delay_ms);
    const std::string out = dir.path("k" + std::to_string(delay_ms));
    const pid_t pid = spawn_weft(run + " --out " + out);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const fs::path latest = fs::path(out) / "checkpoints" / "latest";
    if (!fs::exists(latest)) {  // killed before the first save completed
      std::printf("killed after %d ms: no checkpoint yet\n", delay_ms);
      std::fflush(stdout);
      continue;
    }
    int64_t folders = 0;
    for (const auto& e : fs::directory_iterator(fs::path(out) / "checkpoints")) folders += e.is_directory();
    std::printf("killed after %d ms: latest %s, %lld folders (a write in flight leaves a temporary one)\n", delay_ms,
                slurp(latest.string()).c_str(), static_cast<long long>(folders));
    std::fflush(stdout);
    r = run_weft(run + " --out " + out + " --resume");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto after = losses(out + "/metrics.jsonl");
    ASSERT_GE(after.size(), 8u);
    for (size_t i = after.size() - 8; i < after.size(); ++i) EXPECT_EQ(after[i], whole[i - (after.size() - 8)]) << i;
  }
}

}  // namespace
}  // namespace weft::test
