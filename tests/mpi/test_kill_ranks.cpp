// Killing any rank at any moment never costs a completed checkpoint: 20
// trials of a 4-rank run (pp2 x dp2, ZeRO-1) that saves every step with the
// writes in the background, each SIGKILLing a random rank after a random
// delay. Afterwards every step folder of the run loads with its checksums
// verified, and `latest` names one of them: a write that was in flight left
// only a temporary folder, which loading ignores.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../e2e/cli_runner.h"
#include "../unit/test_util.h"
#include "mpi_env.h"
#include "trainer/checkpoint/checkpoint.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

TEST(KillRanks, NoCompletedCheckpointIsLostAndLatestIsAlwaysComplete) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Checkpoints survive " + std::to_string(i * 7919 % 1000) + " kills.\n%\n";
  const auto in = dir.file("c.txt", text);
  ASSERT_EQ(run_weft("data prepare --input " + in + " --out " + dir.path("data") + " --val-fraction 0.1").code, 0);
  const uint32_t seed = uint32_t(std::random_device{}());
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  int killed_mid_write = 0, with_latest = 0;
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE(trial);
    const std::string out = dir.path(fmt::format("t{}", trial));
    const std::string cmd = fmt::format(
        "{} --oversubscribe -np 4 {} train --data {} --model tiny --seq 32 --global-batch 8 --steps 100000 "
        "--ckpt-every 1 --log-every 1 --eval-every 0 --threads 1 --comm-timeout 10 --layout tp1-pp2-dp2-mb1-zero1 "
        "--out {} > /dev/null 2>&1",
        MPIEXEC, WEFT_BIN, dir.path("data"), out);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 600 && !fs::exists(out + "/metrics.jsonl"); ++i) ::usleep(20000);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 2500)(rng)));
    const auto ranks = weft_ranks(out);
    ASSERT_EQ(ranks.size(), 4u);
    ::kill(ranks[std::uniform_int_distribution<size_t>(0, 3)(rng)], SIGKILL);
    int status = 0;
    for (int i = 0; i < 600 && ::waitpid(pid, &status, WNOHANG) != pid; ++i) ::usleep(100000);
    // Every completed step folder loads, checksums verified.
    const fs::path root = fs::path(out) / "checkpoints";
    int folders = 0;
    if (fs::exists(root))
      for (const auto& e : fs::directory_iterator(root)) {
        const std::string name = e.path().filename().string();
        if (!e.is_directory()) continue;
        if (name.find(".tmp-") != std::string::npos) {
          ++killed_mid_write;
          continue;
        }
        ++folders;
        EXPECT_NO_THROW(checkpoint::load_checkpoint(e.path().string())) << name;
      }
    // `latest` names a complete one (or no save finished yet).
    if (fs::exists(root / "latest")) {
      ++with_latest;
      std::ifstream latest(root / "latest");
      std::string name;
      latest >> name;
      EXPECT_TRUE(fs::is_directory(root / name)) << name;
      EXPECT_NO_THROW(checkpoint::load_checkpoint((root / name).string())) << name;
    }
    EXPECT_GE(folders, fs::exists(root / "latest") ? 1 : 0);
  }
  std::printf("20 trials: %d with a checkpoint, %d killed with a write in flight\n", with_latest, killed_mid_write);
  EXPECT_GT(with_latest, 10);
}

}  // namespace
}  // namespace weft::test
