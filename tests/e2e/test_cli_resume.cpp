// A run is never silently changed: what `weft train --resume` continues from,
// with which settings, and what the metrics say afterwards.
#include <filesystem>
#include <fstream>
#include <map>

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

}  // namespace
}  // namespace weft::test
