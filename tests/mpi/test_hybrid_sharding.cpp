// Hybrid sharding (Layout::zero_group) with real mpirun processes: ZeRO-1,
// -2 and -3 sharded within groups of 2 and 4 ranks of dp (and of dp x cp)
// and replicated across them, the gradients reduce-scattered in a group and
// the shards all-reduced over the groups. Every run must give the
// single-rank losses within a relative 1e-5 (fp32), and every rank's arena
// the memory model's per category (which shards by the group). A checkpoint
// saved under hybrid sharding resumes under plain ZeRO and on one rank, and
// the reverse.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "mpi_env.h"
#include "parity_fixture.h"

namespace weft::test {
namespace {

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

TEST(HybridSharding, GivesTheSingleRankLosses) {
  Fixture f;
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  const std::vector<std::string> layouts = {
      // Groups of 2 over dp 4, each ZeRO stage.
      "tp1-pp1-dp4-mb1-zero1@2",
      "tp1-pp1-dp4-mb1-zero2@2",
      "tp1-pp1-dp4-mb1-zero3@2",
      // Groups of 2 and 4 over dp 8.
      "tp1-pp1-dp8-mb1-zero1@4",
      "tp1-pp1-dp8-mb1-zero3@4",
      "tp1-pp1-dp8-mb1-zero3@2-ckpt:full",
      // With tp and sp, pipeline stages (interleaved), and context
      // parallelism, whose pairs a group of 2 holds.
      "tp2-pp1-dp4-mb1-sp-zero3@2",
      "tp1-pp2-dp4-mb1-vpp2-zero1@2",
      "tp1-cp2-pp1-dp2-mb1-zero3@2-cp:ring",
  };
  std::printf("%s", parity_table(f, ref, layouts).c_str());
}

TEST(HybridSharding, TiedEmbeddingsOverStages) {
  Fixture f(/*tied=*/true);
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  for (const char* layout : {"tp1-pp2-dp4-mb1-zero1@2", "tp1-pp2-dp4-mb1-zero3@2"}) parity_row(f, ref, layout);
}

// Checkpoints hold whole tensors, so they reshard between hybrid and plain
// sharding and to one rank.
TEST(HybridSharding, CheckpointsReshard) {
  Fixture f;
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  const ReshardCases cases = {
      {"tp1-pp1-dp4-mb1-zero3@2", {"tp1-pp1-dp4-mb1-zero3", "tp1-pp1-dp1-mb2", "tp1-pp1-dp4-mb1-zero1@2"}},
      {"tp1-pp1-dp4-mb1-zero1", {"tp1-pp1-dp4-mb1-zero2@2"}},
  };
  expect_reshards(f, ref, cases);
}

// A shard group that does not divide dp x cp, or one under ZeRO-0, is
// refused naming the values.
TEST(HybridSharding, BadGroupsAreClearErrors) {
  Fixture f;
  for (const auto& [layout, says] : std::vector<std::pair<std::string, std::string>>{
           {"tp1-pp1-dp4-mb1-zero3@3", "zero3@3: the shard group must divide dp x cp = 4 x 1 = 4"},
           {"tp1-pp1-dp4-mb1-zero0@2", "zero0@2 names a shard group but ZeRO-0 shards nothing"}}) {
    const auto r = Fixture::run_mpi(
        4, fmt::format("train --data {} --model {} --seq {} --global-batch {} --steps 1 --threads 1 "
                       "--layout {} --out {}",
                       f.data, f.config, f.seq, f.global_batch, layout, f.dir.path("bad")));
    EXPECT_NE(r.code, 0) << layout;
    EXPECT_NE(r.out.find(says), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace weft::test
