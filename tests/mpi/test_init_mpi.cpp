// `weft train --init` under mpirun: each rank slices the Hugging Face
// folder's tensors by its layout (tp rows and columns, its pipeline stage's
// blocks, a tied head's copy on the last stage), so the first step's loss is
// transformers' on every layout, within a relative 1e-5 (fp32, different
// summation orders); a vocabulary padded to 72 whose tp shards straddle the
// pretrained 64 rows gives the loss Python computed for the mean-row rule; and
// --steps 0 under tp2-pp2 followed by `weft export` gives the tensors back
// bit for bit. Prints the table of folders, layouts and deviations.
#include <cmath>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../e2e/cli_runner.h"
#include "../e2e/hf_init_fixture.h"
#include "../unit/test_util.h"
#include "mpi_env.h"

namespace weft::test {
namespace {

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

constexpr double kLossTolerance = 1e-5;

CliResult run_mpi(int64_t np, const std::string& args) {
  return run_shell(fmt::format("{} --oversubscribe -np {} {} {} 2>&1", MPIEXEC, np, WEFT_BIN, args));
}

TEST(InitMpi, TheFirstLossIsTransformersLossOnEveryLayout) {
  TempDir dir;
  struct Case {
    std::string folder, layout, extra, key;
  };
  const std::vector<Case> cases = {
      {"untied", "tp2-pp2-dp1-mb1", "", "loss"},
      {"untied_bf16", "tp2-pp2-dp1-mb1", "", "loss"},
      {"tied_sharded", "tp2-pp2-dp1-mb1", "", "loss"},
      {"untied", "tp1-pp4-dp1-mb1", "", "loss"},
      {"untied", "tp2-pp1-dp2-mb1-sp-zero1", "", "loss"},
      {"tied_sharded", "tp1-pp2-dp2-mb1-zero1", "", "loss"},
      // Llama 3 RoPE scaling, on tp shards of the heads and on SP's row shards.
      {"rope_llama3", "tp2-pp2-dp1-mb1", "", "loss"},
      {"rope_llama3", "tp2-pp1-dp2-mb1-sp-zero1", "", "loss"},
      // Context parallelism: each chunk of 3 tokens rotated at its own
      // positions (Llama 3 scaling too), against transformers on the whole.
      {"rope_llama3", "tp2-cp2-pp1-dp1-mb1-sp-cp:ring", "", "loss"},
      {"rope_llama3", "tp1-cp2-pp1-dp2-mb1-zero1-cp:allgather", "", "loss"},
      {"tied_sharded", "tp1-cp2-pp2-dp1-mb1-cp:ring", "", "loss"},
      {"untied", "tp1-cp2-pp2-dp1-mb1-cp:a2a", "", "loss"},
      // 72 rows over tp2: rank 1 holds rows 36..71, pretrained up to 63.
      {"untied", "tp2-pp2-dp1-mb1", "--vocab 72", "loss_vocab72"},
      {"tied_sharded", "tp2-pp2-dp1-mb1", "--vocab 72", "loss_vocab72"},
  };
  std::string table = fmt::format("{:<14} {:<28} {:<12} {:>12} {:>12} {:>10}\n", "folder", "layout", "extra",
                                  "weft loss", "transformers", "rel dev");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const auto out = dir.path(fmt::format("run{}", i));
    const auto r = run_mpi(4, hf_train_args(c.layout, out) + " --steps 1 --init " + hf_fixture(c.folder) + " " + c.extra);
    ASSERT_EQ(r.code, 0) << c.folder << " " << c.layout << "\n" << r.out;
    const auto losses = metrics_losses(out);
    ASSERT_EQ(losses.size(), 1u) << r.out;
    const double want = hf_reference_loss(c.folder, c.key);
    const double dev = std::fabs(losses[0] - want) / want;
    EXPECT_LE(dev, kLossTolerance) << c.folder << " " << c.layout << " " << c.extra;
    table += fmt::format("{:<14} {:<28} {:<12} {:>12.7f} {:>12.7f} {:>10.2e}\n", c.folder, c.layout, c.extra,
                         losses[0], want, dev);
  }
  std::printf("%s", table.c_str());
}

TEST(InitMpi, ShardedLoadsGatherBackToTheSameTensors) {
  TempDir dir;
  for (const char* folder : {"untied", "tied_sharded"}) {
    const auto out = dir.path(folder);
    auto r = run_mpi(4, hf_train_args("tp2-pp2-dp1-mb1", out) + " --steps 0 --init " + hf_fixture(folder));
    ASSERT_EQ(r.code, 0) << r.out;
    const auto hf = dir.path(std::string(folder) + "-hf");
    r = run_shell(fmt::format("{} export --checkpoint {}/checkpoints/step_000000 --out {} 2>&1", WEFT_BIN, out, hf));
    ASSERT_EQ(r.code, 0) << r.out;
    expect_same_tensors(hf, hf_fixture(folder));
  }
}

}  // namespace
}  // namespace weft::test
