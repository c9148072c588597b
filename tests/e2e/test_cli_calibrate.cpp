// `weft calibrate` end to end: a measured profile of this machine that the
// dry-run prices layouts with, refused when it does not describe this set-up;
// on two MPI ranks it holds the collectives too.
#include <cstdlib>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "cli_runner.h"

namespace weft::test {
namespace {

const std::string kCalibrate =
    "calibrate --model tiny-test --seq 16 --mb 1,2 --threads 1 --min-time 0.002 --max-message-log2 14 --device cpu";

nlohmann::json read(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

double predicted_step(const std::string& extra) {
  const auto r = run_weft("tune --dry-run --model tiny-test --seq 16 --global-batch 4 --gpu cpu --gpus 1 "
                          "--layout tp1-pp1-dp1-mb2 --format json " + extra);
  EXPECT_EQ(r.code, 0) << r.out;
  return nlohmann::json::parse(r.out)["layouts"][0]["prediction"]["step_s"].get<double>();
}

TEST(CliCalibrate, MeasuresThisMachineAndPricesLayoutsWithIt) {
  TempDir dir;
  const std::string p = dir.path("p.json");
  auto r = run_weft(kCalibrate + " --out " + p);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = read(p);
  EXPECT_EQ(j["format"], "weft-device-profile");
  EXPECT_EQ(j["origin"], "measured");
  EXPECT_EQ(j["fingerprint"]["threads"], 1);
  EXPECT_EQ(j["fingerprint"]["ranks_per_node"], 1);
  // Forward, data- and weight-gradient GEMMs of 6 linears at mb 1 and 2 (a
  // few shapes coincide), both attention kinds, every kernel family.
  EXPECT_GE(j["rates"]["gemm"].size(), 24u);
  EXPECT_EQ(j["rates"]["attention"].size(), 4u);
  EXPECT_EQ(j["rates"]["streams"].size(), 12u);
  for (const auto& g : j["rates"]["gemm"]) EXPECT_GT(g["seconds"].get<double>(), 0);
  // The dry-run prices with it: another step than the datasheet's.
  const double with = predicted_step("--profile " + p), without = predicted_step("");
  EXPECT_GT(with, 0);
  EXPECT_NE(with, without);
}

TEST(CliCalibrate, ProfilesOfAnotherSetUpAreRefused) {
  TempDir dir;
  const std::string p = dir.path("p.json");
  ASSERT_EQ(run_weft(kCalibrate + " --out " + p).code, 0);
  auto j = read(p);
  j["fingerprint"]["cores"] = 4096;
  j["fingerprint"]["weft_version"] = "0.0.0";
  std::ofstream(dir.path("other.json")) << j.dump();
  auto r = run_weft("tune --dry-run --model tiny-test --seq 16 --global-batch 4 --gpu cpu --gpus 1 --profile " +
                    dir.path("other.json"));
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* s : {"other.json", "cores: profile 4096", "weft_version: profile \"0.0.0\"", "weft calibrate"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in " << r.out;
  std::ofstream(dir.path("junk.json")) << "{\"format\": \"weft-device-profile\", \"version\": 1}";
  r = run_weft("tune --dry-run --model tiny-test --seq 16 --global-batch 4 --gpu cpu --gpus 1 --profile " +
               dir.path("junk.json"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("missing field 'device'"), std::string::npos) << r.out;
  r = run_weft("calibrate --model tiny-test --mb 0 --device cpu --out " + dir.path("x.json"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--mb 0"), std::string::npos) << r.out;
}

TEST(CliCalibrate, TwoRanksMeasureTheirCollectives) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  TempDir dir;
  const std::string p = dir.path("p2.json");
  const auto r = run_shell("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 " +
                           std::string(WEFT_BIN) + " " + kCalibrate + " --out " + p + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = read(p);
  EXPECT_EQ(j["fingerprint"]["ranks_per_node"], 2);
  std::set<std::string> ops;
  for (const auto& c : j["rates"]["comm"]) {
    EXPECT_EQ(c["ranks"], 2);
    EXPECT_GT(c["bytes_per_s"].get<double>(), 0);
    ops.insert(c["op"].get<std::string>());
  }
  EXPECT_EQ(ops, (std::set<std::string>{"all_reduce", "all_gather", "reduce_scatter", "p2p"}));
  // Both tensor-parallel shards of the model were timed.
  std::set<int64_t> heads;
  for (const auto& a : j["rates"]["attention"]) heads.insert(a["h"].get<int64_t>());
  EXPECT_EQ(heads, (std::set<int64_t>{2, 4}));
}

}  // namespace
}  // namespace weft::test
