// `weft report` and `weft tune --dry-run --format html` end to end: each kind
// of page is written, the data it embeds equals the JSON it came from, the
// largest dry-run stays small, and bad input is one line with exit code 2.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "cli_runner.h"
#include "report_page.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(WEFT_FIXTURES_DIR) + "/report";

// Every embedded point equals its layout's row of the dry-run JSON, and the
// points, the binned counts and the invalid layouts add up to the space.
void expect_points_match(const json& page, const json& src) {
  std::map<std::string, const json*> rows;
  for (const auto& r : src["layouts"]) rows[r["layout"].get<std::string>()] = &r;
  ASSERT_EQ(page["kind"], "dry-run");
  for (const auto& p : page["points"]) {
    const auto it = rows.find(p["layout"].get<std::string>());
    ASSERT_NE(it, rows.end()) << p.dump();
    const json& r = *it->second;
    EXPECT_EQ(p["verdict"], r["verdict"]) << p.dump();
    EXPECT_EQ(p["mfu"], r["prediction"]["mfu"]) << p.dump();
    EXPECT_EQ(p["step_s"], r["prediction"]["step_s"]) << p.dump();
    EXPECT_EQ(p["peak_bytes"], r["memory_peak_bytes"]) << p.dump();
    EXPECT_EQ(page["classes"][p["class"].get<size_t>()],
              r["verdict"] == "fits" ? json("fits") : r["prune_class"]) << p.dump();
    if (r.contains("rank")) {
      EXPECT_EQ(p["rank"], r["rank"]);
    }
  }
  EXPECT_EQ(page["points"].size() + page["binned"].get<size_t>() + page["invalid"].get<size_t>(),
            src["layouts"].size());
  ASSERT_FALSE(page["top"].empty());
  EXPECT_EQ(page["top"][0]["layout"], src["layouts"][0]["layout"]);
  EXPECT_EQ(page["top"][0]["compute_s"], src["layouts"][0]["prediction"]["compute_s"]);
  EXPECT_EQ(page["best"]["stages"], src["layouts"][0]["memory_stages"]);
}

TEST(CliReport, DryRunPageEmbedsEveryLayout) {
  TempDir dir;
  const std::string common =
      "tune --dry-run --model llama-7b --gpu h100 --gpus 16 --tp 1,2 --mb 1 --ckpt none,full --attn flash "
      "--norm fused --zero 1 --zero-group 0";  // GEMMs in bf16 and fp8:tensorwise (searched on the H100)
  ASSERT_EQ(run_weft(common + " --all --format json --out " + dir.path("r.json")).code, 0);
  const json src = json::parse(read_text(dir.path("r.json")));
  // From the JSON file, and straight from the tuner: the same data.
  auto r = run_weft("report " + dir.path("r.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("r.html"), std::string::npos) << r.out;
  r = run_weft(common + " --format html --out " + dir.path("t.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  const json a = report_embedded(read_text(dir.path("r.html")));
  const json b = report_embedded(read_text(dir.path("t.html")));
  expect_points_match(a, src);
  expect_points_match(b, src);
  EXPECT_EQ(a["points"].size(), src["layouts"].size() - a["invalid"].get<size_t>()) << "a small space is exact";
  // To stdout, like the other formats.
  r = run_shell(std::string(WEFT_BIN) + " " + common + " --format html 2>/dev/null");
  ASSERT_EQ(r.code, 0);
  EXPECT_EQ(r.out.rfind("<!doctype html>", 0), 0u);
  EXPECT_EQ(report_embedded(r.out)["points"], b["points"]);
  // --top lists that many fitting layouts on the page too, in rank order,
  // each with its GEMM precision.
  EXPECT_EQ(b["top"].size(), 10u);
  std::set<std::string> gemms;
  for (const auto& t : b["top"]) gemms.insert(t.at("gemm_precision").get<std::string>());
  EXPECT_TRUE(gemms.count("fp8:tensorwise")) << b["top"].dump();
  r = run_weft(common + " --top 25 --format html --out " + dir.path("t25.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  const json c = report_embedded(read_text(dir.path("t25.html")));
  const size_t fitting = std::min<size_t>(25, c["fitting"].get<size_t>());
  ASSERT_GT(fitting, 10u);
  ASSERT_EQ(c["top"].size(), fitting);
  for (size_t i = 0; i < fitting; ++i) {
    EXPECT_EQ(c["top"][i]["layout"], src["layouts"][i]["layout"]) << i;
    EXPECT_EQ(c["top"][i]["rank"], int64_t(i + 1));
  }
  EXPECT_EQ(c["points"], b["points"]);
  // Nothing to fetch (the SVG namespace URI is a name, never loaded).
  for (const char* s : {"https://", "<link", " src=", "@import", "url(", "fetch(", "XMLHttpRequest"})
    EXPECT_EQ(r.out.find(s), std::string::npos) << s;
}

// A space above the exact-point limit: the fitting Pareto front and the top
// ranks stay exact, the sampled points equal their rows, the rest is binned.
TEST(CliReport, LargeDryRunKeepsTheFrontExact) {
  TempDir dir;
  // About 15,000 layouts (the 65B case below ranks millions).
  const std::string common =
      "tune --dry-run --model llama-7b --gpu h100 --gpus 16 --tp 1,2 --mb 1,2 --ckpt none,full --attn flash "
      "--norm fused --fp8 off";
  auto r = run_weft(common + " --format html --out " + dir.path("big.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft(common + " --all --format json --out " + dir.path("big.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  const json src = json::parse(read_text(dir.path("big.json")));
  ASSERT_GT(src["layouts"].size(), 4000u);
  const json page = report_embedded(read_text(dir.path("big.html")));
  expect_points_match(page, src);
  EXPECT_GT(page["binned"].get<int64_t>(), 0);
  std::set<std::string> exact;
  for (const auto& p : page["points"]) exact.insert(p["layout"].get<std::string>());
  // The fitting Pareto front of the source, computed here independently.
  std::vector<const json*> fit;
  for (const auto& row : src["layouts"])
    if (row["verdict"] == "fits") fit.push_back(&row);
  for (size_t i = 0; i < std::min<size_t>(fit.size(), 100); ++i)
    EXPECT_TRUE(exact.count((*fit[i])["layout"].get<std::string>())) << "rank " << i + 1 << " binned";
  std::sort(fit.begin(), fit.end(), [](const json* a, const json* b) {
    const auto ma = (*a)["memory_peak_bytes"].get<int64_t>(), mb = (*b)["memory_peak_bytes"].get<int64_t>();
    return ma != mb ? ma < mb : (*a)["prediction"]["mfu"].get<double>() > (*b)["prediction"]["mfu"].get<double>();
  });
  double best = -1;
  for (const json* row : fit) {
    const double mfu = (*row)["prediction"]["mfu"].get<double>();
    if (mfu <= best) continue;
    best = mfu;
    EXPECT_TRUE(exact.count((*row)["layout"].get<std::string>())) << "Pareto layout binned: " << row->dump();
  }
}

// llama-65b's whole space on 1024 GPUs (9,109,884 layouts with hybrid
// sharding, ranked in bounded memory: tuner::space_scan) stays under 5 MB.
TEST(CliReport, LargestDryRunStaysSmall) {
  TempDir dir;
  // Under a 2.5 GiB address-space limit (880 MiB resident measured; the
  // address space also holds the CUDA libraries' mappings and the threads'
  // arenas).
  const auto r = run_shell("ulimit -v 2621440; " + std::string(WEFT_BIN) +
                           " tune --dry-run --model llama-65b --gpu a100-80gb --gpus 1024 --format html --out " +
                           dir.path("big.html") + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto size = fs::file_size(dir.path("big.html"));
  std::printf("[ report ] llama-65b on 1024 x a100-80gb: %.2f MB\n", double(size) / 1e6);
  EXPECT_LT(size, 5u * 1000 * 1000);
  const json page = report_embedded(read_text(dir.path("big.html")));
  EXPECT_EQ(int64_t(page["points"].size()) + page["binned"].get<int64_t>() + page["invalid"].get<int64_t>(),
            page["evaluated"].get<int64_t>());
  EXPECT_LE(page["points"].size(), 4000u);
  EXPECT_EQ(page["top"].size(), 10u);
  EXPECT_FALSE(page["best"]["stages"].empty());
}

TEST(CliReport, TuningPageEmbedsTheTrials) {
  TempDir dir;
  const auto r = run_weft("report " + kFixtures + "/tuning.json --out " + dir.path("tuning.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  const json src = json::parse(read_text(kFixtures + "/tuning.json"));
  const json page = report_embedded(read_text(dir.path("tuning.html")));
  ASSERT_EQ(page["kind"], "tuning");
  ASSERT_EQ(page["trials"].size(), src["trials"].size());
  double start = 0;
  for (size_t i = 0; i < src["trials"].size(); ++i) {
    for (const auto& [k, v] : src["trials"][i].items()) EXPECT_EQ(page["trials"][i][k], v) << k;
    EXPECT_DOUBLE_EQ(page["trials"][i]["start_s"].get<double>(), start);
    start += src["trials"][i]["seconds"].get<double>();
  }
  EXPECT_EQ(page["winner"], src["winner"]);
  EXPECT_EQ(page["calibration"], src["calibration"]);
  EXPECT_EQ(page["timeline_estimated"], true);  // this tuning.json predates start times
}

// Recorded start times are kept as they are (the gaps between trials are
// refits and set-up); a trial from an earlier run's journal has none and is
// left off the timeline.
TEST(CliReport, TuningPageKeepsRecordedStartTimes) {
  TempDir dir;
  const json src = tuning_with_start_times(json::parse(read_text(kFixtures + "/tuning.json")), 0.75, 0.5);
  ASSERT_GE(src["trials"].size(), 3u);
  std::ofstream(dir.path("tuning.json")) << src.dump();
  const auto r = run_weft("report " + dir.path("tuning.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  const json page = report_embedded(read_text(dir.path("tuning.html")));
  EXPECT_EQ(page["timeline_estimated"], false);
  EXPECT_EQ(page["trials"][0]["on_timeline"], false);
  EXPECT_FALSE(page["trials"][0].contains("start_s"));
  for (size_t i = 1; i < src["trials"].size(); ++i) {
    EXPECT_EQ(page["trials"][i]["start_s"], src["trials"][i]["start_s"]);
    EXPECT_FALSE(page["trials"][i].contains("on_timeline"));
  }
}

// Old records without "kind", a second run header after a resume, a step
// logged twice and a line cut off mid-write: one continuous curve by step.
TEST(CliReport, RunFolderOfAResumedRun) {
  TempDir dir;
  fs::copy(kFixtures + "/resumed", dir.path("run"), fs::copy_options::recursive);
  const auto r = run_weft("report " + dir.path("run"));
  ASSERT_EQ(r.code, 0) << r.out;
  const json page = report_embedded(read_text(dir.path("run/report.html")));
  ASSERT_EQ(page["kind"], "run");
  std::vector<int64_t> steps;
  for (const auto& t : page["train"]) steps.push_back(t["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(page["headers"].size(), 2u);
  EXPECT_EQ(page["resumes"], json::array({6}));
  EXPECT_EQ(page["unreadable_lines"], 1);
  EXPECT_EQ(page["val"].size(), 3u);
  EXPECT_EQ(page["memory"][0]["independent"]["bytes"], 410000000);
  // The later record of step 6 (the resumed run's) is the one kept.
  std::istringstream in(read_text(dir.path("run/metrics.jsonl")));
  json last6;
  for (std::string line; std::getline(in, line);) {
    const auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("step", 0) == 6 && j.contains("loss")) last6 = j;
  }
  EXPECT_EQ(page["train"][5], last6);
}

// The end of `weft train` writes <out>/report.html; its losses are the
// metrics file's, step by step.
TEST(CliReport, TrainingWritesItsReport) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "The quick brown fox " + std::to_string(i * 7919 % 1000) + " jumps.\n%\n";
  ASSERT_EQ(run_weft("data prepare --input " + dir.file("c.txt", text) + " --out " + dir.path("data") +
                     " --val-fraction 0.1").code, 0);
  const auto r = run_weft("train --data " + dir.path("data") +
                          " --model tiny --seq 32 --global-batch 4 --mb 2 --threads 1 --log-every 1 "
                          "--eval-samples 4 --steps 6 --eval-every 3 --no-checkpoint --out " + dir.path("run"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("report " + dir.path("run/report.html")), std::string::npos) << r.out;
  const json page = report_embedded(read_text(dir.path("run/report.html")));
  ASSERT_EQ(page["kind"], "run");
  std::map<int64_t, double> loss, val;
  std::istringstream in(read_text(dir.path("run/metrics.jsonl")));
  for (std::string line; std::getline(in, line);) {
    const auto j = json::parse(line);
    if (j.contains("loss")) loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    if (j.contains("val_loss")) val[j["step"].get<int64_t>()] = j["val_loss"].get<double>();
  }
  ASSERT_EQ(loss.size(), 6u);
  ASSERT_EQ(page["train"].size(), loss.size());
  for (const auto& t : page["train"]) EXPECT_EQ(t["loss"].get<double>(), loss.at(t["step"].get<int64_t>()));
  ASSERT_EQ(page["val"].size(), val.size());
  for (const auto& v : page["val"]) EXPECT_EQ(v["val_loss"].get<double>(), val.at(v["step"].get<int64_t>()));
  ASSERT_FALSE(page["memory"].empty());
  EXPECT_TRUE(page["memory"][0].contains("measured"));
  // The run's GEMM precision: no FP8 recipe in its layout, so the run's
  // compute precision (fp32 on the CPU).
  EXPECT_EQ(page["gemm_precision"], "fp32") << page["layout"];
}

// Every JSON weft writes, with a null wherever it holds a number (weft
// writes a NaN as null: a validation a stop skipped, a diverged loss): the
// report still opens, showing what it can.
TEST(CliReport, NullsWhereNumbersWereStillOpen) {
  TempDir dir;
  ASSERT_EQ(run_weft("tune --dry-run --model llama-7b --gpu h100 --gpus 16 --tp 1,2 --mb 1 --format json --out " +
                     dir.path("dry.json")).code,
            0);
  std::ofstream(dir.path("dry-null.json")) << with_nulls(json::parse(read_text(dir.path("dry.json")))).dump();
  std::ofstream(dir.path("tuning-null.json")) << with_nulls(json::parse(read_text(kFixtures + "/tuning.json"))).dump();
  copy_run_with_nulls(kFixtures + "/resumed", dir.path("run"));
  fs::copy_file(dir.path("tuning-null.json"), dir.path("run/tuning.json"));
  for (const std::string input : {"dry-null.json", "tuning-null.json", "run"}) {
    const auto r = run_weft("report " + dir.path(input) + " --out " + dir.path(input + ".html"));
    EXPECT_EQ(r.code, 0) << input << "\n" << r.out;
    EXPECT_FALSE(report_embedded(read_text(dir.path(input + ".html"))).is_null()) << input;
  }
}

TEST(CliReport, BadInputIsOneLineWithExitCode2) {
  TempDir dir;
  const std::string odd = dir.file("odd.json", "{\"hello\": 1}");
  const std::string broken = dir.file("broken.json", "{\"layouts\": [");
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"report " + dir.path("missing.json"), "missing.json"},
           {"report " + odd, "odd.json"},
           {"report " + broken, "broken.json"},
           {"report " + dir.path(), "metrics.jsonl"}}) {
    const auto r = run_weft(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("valid: a run folder"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
}

}  // namespace
}  // namespace weft::test
