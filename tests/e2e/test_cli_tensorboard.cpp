// `weft train --tensorboard`: the event files hold every value metrics.jsonl
// holds, read back with the tensorboard Python package as the TensorBoard
// server loads them (tests/e2e/tensorboard_dump.py), bit for bit; a resumed
// launch supersedes the same steps in both; and a tuning's trials read back
// as tuning.json has them. The expected values are worked out here from the
// JSON files, not by weft's own conversion.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

// (tag, step) -> value.
using Scalars = std::map<std::pair<std::string, int64_t>, double>;

// The reader's JSON on stdout; its stderr (TensorBoard logs each purge
// there) apart, shown when it fails.
nlohmann::json dump(const std::string& dir) {
  const std::string err = dir + ".stderr";
  const auto r = run_shell("python3 " WEFT_SOURCE_DIR "/tests/e2e/tensorboard_dump.py " + dir + " 2>" + err);
  EXPECT_EQ(r.code, 0) << "reading " << dir << " with the tensorboard package failed (tools/setup.sh installs "
                       << "it):\n" << r.out << slurp(err);
  if (r.code != 0) return {};
  return nlohmann::json::parse(r.out);
}

Scalars scalars_of(const nlohmann::json& d) {
  Scalars out;
  for (auto it = d["scalars"].begin(); it != d["scalars"].end(); ++it)
    for (const auto& sv : it.value()) {
      const auto key = std::make_pair(it.key(), sv[0].get<int64_t>());
      EXPECT_EQ(out.count(key), 0u) << it.key() << " twice at step " << key.second;
      out[key] = sv[1].get<double>();
    }
  return out;
}

// Every number and boolean of the records TensorBoard gets, flattened.
void flatten(const nlohmann::json& j, const std::string& prefix, int64_t step, Scalars& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string tag = prefix + "/" + it.key();
    const auto& v = it.value();
    if (v.is_object())
      flatten(v, tag, step, out);
    else if (v.is_boolean())
      out[{tag, step}] = v.get<bool>() ? 1.0 : 0.0;
    else if (v.is_number())
      out[{tag, step}] = v.get<double>();
  }
}

Scalars expected_from_metrics(const std::string& path, std::vector<nlohmann::json>* headers) {
  Scalars out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    const std::string kind = j["kind"];
    if (kind == "run") {
      headers->push_back(j);
      continue;
    }
    if (kind != "train" && kind != "val" && kind != "checkpoint" && kind != "end") continue;
    const char* step_key = kind == "end" ? "last_step" : "step";
    const int64_t step = j[step_key];
    j.erase("kind");
    j.erase(step_key);
    flatten(j, kind, step, out);
  }
  return out;
}

void expect_same(const Scalars& want, const Scalars& got) {
  EXPECT_EQ(want.size(), got.size());
  for (const auto& [key, value] : want) {
    const auto it = got.find(key);
    if (it == got.end()) {
      ADD_FAILURE() << key.first << " at step " << key.second << " is in metrics.jsonl, not in TensorBoard";
      continue;
    }
    // Bit for bit (NaN, never logged here, would fail).
    EXPECT_EQ(it->second, value) << key.first << " at step " << key.second;
  }
  for (const auto& [key, value] : got)
    if (!want.count(key)) ADD_FAILURE() << key.first << " at step " << key.second << " is only in TensorBoard";
}

TEST(CliTensorBoard, EveryMetricsValueReadsBackExactlyAcrossAResume) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string run = "train --data " + data + kSmall +
                          " --layout tp1-pp1-dp1-mb2 --eval-every 2 --ckpt-every 3 --tensorboard --out " +
                          dir.path("run");
  auto r = run_weft(run + " --steps 6");
  ASSERT_EQ(r.code, 0) << r.out;
  // Resumed from step 3 of 6: steps 4..6 of the first launch are superseded.
  r = run_weft(run + " --steps 8 --resume-from " + dir.path("run/checkpoints/step_000003"));
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_NE(r.out.find("superseded"), std::string::npos) << r.out;

  const nlohmann::json d = dump(dir.path("run/tensorboard"));
  ASSERT_FALSE(d.is_null());
  EXPECT_EQ(d["files"], 2) << "one event file per launch";
  std::vector<nlohmann::json> headers;
  const Scalars want = expected_from_metrics(dir.path("run/metrics.jsonl"), &headers);
  const Scalars got = scalars_of(d);
  EXPECT_GT(want.count({"train/loss", 8}), 0u);
  EXPECT_GT(want.count({"val/val_loss", 2}), 0u);
  EXPECT_GT(want.count({"checkpoint/stall_s", 3}), 0u);
  EXPECT_GT(want.count({"end/tokens_per_s", 8}), 0u);
  expect_same(want, got);

  // Each launch's header as text at its first step, the same JSON.
  ASSERT_EQ(headers.size(), 2u);
  const auto& texts = d["texts"]["run/header"];
  ASSERT_EQ(texts.size(), 2u) << texts.dump();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(texts[i][0].get<int64_t>(), headers[i]["first_step"].get<int64_t>());
    std::string text = texts[i][1];
    ASSERT_GE(text.size(), 8u);
    EXPECT_EQ(nlohmann::json::parse(text.substr(4, text.size() - 8)), headers[i]);
  }
}

TEST(CliTensorBoard, TheTuningTrialsReadBackAsTheReportHasThem) {
  TempDir dir;
  const auto data = corpus(dir);
  auto r = run_weft("train --data " + data +
                    " --model tiny --seq 32 --global-batch 4 --threads 1 --eval-samples 4 --steps 2 --auto "
                    "--retune --tune-top 3 --tensorboard " +
                    dir.path("tb") + " --out " + dir.path("run"));
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(dir.path("run/tuning.json"))) << r.out;
  std::ifstream in(dir.path("run/tuning.json"));
  const auto report = nlohmann::json::parse(in);
  ASSERT_GE(report["trials"].size(), 2u);
  Scalars want;
  std::set<int64_t> orders;
  for (const auto& t : report["trials"]) {
    const int64_t step = t["order"];
    orders.insert(step);
    want[{"tune/predicted_step_s", step}] = t["predicted_s"];
    want[{"tune/calibrated_step_s", step}] = t["calibrated_s"];
    if (t["status"] != "ok") continue;
    want[{"tune/measured_step_s", step}] = t["measured_s"];
    want[{"tune/tokens_per_s", step}] = t["tokens_per_s"];
    want[{"tune/mfu", step}] = t["mfu"];
    want[{"tune/predicted_peak_bytes", step}] = t["predicted_peak_bytes"];
    want[{"tune/measured_peak_bytes", step}] = t["measured_peak_bytes"];
  }
  const nlohmann::json d = dump(dir.path("tb/tune"));
  ASSERT_FALSE(d.is_null());
  expect_same(want, scalars_of(d));
  const auto& texts = d["texts"]["tune/trial"];
  ASSERT_EQ(texts.size(), report["trials"].size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto& t = report["trials"][i];
    EXPECT_EQ(texts[i][0], t["order"]);
    EXPECT_EQ(texts[i][1].get<std::string>().rfind(t["layout"].get<std::string>() + ": " + t["status"].get<std::string>(), 0), 0u)
        << texts[i].dump();
  }
  // The run's own metrics beside them.
  const nlohmann::json run = dump(dir.path("tb"));
  ASSERT_FALSE(run.is_null());
  EXPECT_GT(run["scalars"].count("train/loss"), 0u);
}

TEST(CliTensorBoard, AFolderThatCannotBeMadeIsRefusedBeforeTraining) {
  TempDir dir;
  const auto blocker = dir.file("a-file", "x");
  const auto r = run_weft("train" + kSmall + " --layout tp1-pp1-dp1-mb2 --steps 1 --tensorboard " + blocker +
                          "/tb --out " + dir.path("run"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--tensorboard " + blocker + "/tb"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir.path("run/metrics.jsonl"))) << r.out;
}

}  // namespace
}  // namespace weft::test
