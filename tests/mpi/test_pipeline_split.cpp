// Uneven pipeline splits (Layout::split) with real mpirun processes: the
// layers of each virtual stage given, 1F1B and interleaved, with virtual
// stages that hold only the embedding or only the head and loss (the
// embedding and the loss counted as layers), on a model with 8 layers and
// one with a prime count (7), composed with tp, sp, dp, ZeRO-1 and -3,
// partial checkpointing and tied embeddings. Every run must give the
// single-rank losses within a relative 1e-5 (fp32), and every rank's arena
// the memory model's per category. A checkpoint reshards across splits.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "mpi_env.h"
#include "parity_fixture.h"

namespace weft::test {
namespace {

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

// kConfig with 7 layers: no pp > 1 divides it.
std::string prime_config() {
  std::string c = kConfig;
  const std::string from = "\"num_hidden_layers\": 8";
  c.replace(c.find(from), from.size(), "\"num_hidden_layers\": 7");
  return c;
}

TEST(PipelineSplit, UnevenSplitsGiveTheSingleRankLosses) {
  Fixture f;
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  const std::vector<std::string> layouts = {
      // 1F1B: layers moved off either end, and ends that hold no layer.
      "tp1-pp2-dp1-mb1-split:3.5",
      "tp1-pp2-dp1-mb2-split:6.2",
      "tp1-pp2-dp1-mb1-split:0.8",
      "tp1-pp2-dp1-mb1-split:8.0",
      "tp1-pp4-dp1-mb1-split:1.3.3.1",
      "tp2-pp4-dp1-mb1-sp-split:2.3.2.1",
      // Interleaved: the first and last virtual stage lighter, and only the
      // embedding and only the head: 8 + 2 layers over pp 2 x vpp 5.
      "tp1-pp2-dp1-mb1-vpp2-split:1.3.3.1",
      "tp1-pp2-dp1-mb1-vpp5-split:0.1x8.0",
      "tp1-pp4-dp1-mb1-vpp2-split:0.1x6.2",
      // With dp and ZeRO, and partial checkpointing over uneven chunks.
      "tp1-pp2-dp2-mb1-vpp2-ckpt:full@2-split:1.3.2.2",
      "tp2-pp2-dp2-mb1-sp-zero1-split:2.6",
      "tp1-pp2-dp2-mb1-zero3-split:5.3",
      "tp1-pp2-dp2-mb1-vpp2-zero3-ckpt:selective-split:0.3.3.2",
  };
  std::printf("%s", parity_table(f, ref, layouts).c_str());
}

TEST(PipelineSplit, APrimeLayerCount) {
  Fixture f(false, prime_config());
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  const std::vector<std::string> layouts = {
      "tp1-pp2-dp1-mb1-split:3.4",
      "tp1-pp3-dp1-mb1-split:2.3.2",
      "tp1-pp4-dp1-mb1-split:1.2.2.2",
      "tp1-pp2-dp1-mb1-vpp2-split:1.2.2.2",
      "tp1-pp4-dp1-mb1-vpp2-split:0.1x7",
      "tp2-pp2-dp2-mb1-sp-zero1-ckpt:full@1-split:4.3",
  };
  std::printf("%s", parity_table(f, ref, layouts).c_str());
}

TEST(PipelineSplit, TiedEmbeddings) {
  Fixture f(/*tied=*/true);
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  for (const char* layout : {"tp1-pp2-dp1-mb1-split:0.8", "tp1-pp2-dp1-mb1-vpp2-split:1.3.3.1",
                             "tp2-pp2-dp2-mb1-sp-zero1-split:5.3"})
    parity_row(f, ref, layout);
}

// Checkpoints name every block by its global layer, so they reshard across
// splits, to even ones and to one rank.
TEST(PipelineSplit, CheckpointsReshardAcrossSplits) {
  Fixture f;
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  const ReshardCases cases = {
      {"tp1-pp2-dp1-mb1-split:3.5", {"tp1-pp2-dp1-mb1-vpp2-split:1.3.3.1", "tp1-pp1-dp1-mb2", "tp1-pp2-dp1-mb1"}},
      {"tp1-pp4-dp1-mb1-vpp2-split:0.1x6.2", {"tp2-pp2-dp1-mb1-sp-split:6.2", "tp1-pp4-dp1-mb1"}},
  };
  expect_reshards(f, ref, cases);
}

// The run header names the split and each stage's layers; a split that
// does not hold the model's layers is refused naming both counts.
TEST(PipelineSplit, TheHeaderSaysItAndBadSplitsAreClearErrors) {
  Fixture f;
  const auto ok = Fixture::run_mpi(
      2, fmt::format("train --data {} --model {} --seq {} --global-batch {} --steps 1 --threads 1 "
                     "--layout tp1-pp2-dp1-mb1-vpp2-split:0.3.3.2 --out {}",
                     f.data, f.config, f.seq, f.global_batch, f.dir.path("ok")));
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("pipeline split 0.3x2.2: stages hold 3, 5 layers"), std::string::npos) << ok.out;
  const auto r = Fixture::run_mpi(
      2, fmt::format("train --data {} --model {} --seq {} --global-batch {} --steps 1 --threads 1 "
                     "--layout tp1-pp2-dp1-mb1-split:3.4 --out {}",
                     f.data, f.config, f.seq, f.global_batch, f.dir.path("bad")));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("split:3.4 holds 7 layers; the model has L=8"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace weft::test
