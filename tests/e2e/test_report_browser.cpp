// The HTML reports in a real browser: headless Chromium renders each kind of
// page; the page must draw without a script error (its body says
// data-weft="ok") and its screenshot must not be blank. Prints each page's
// size and open times (never asserted tightly: timing is for benchmarks/).
// Skipped where no Chromium is installed (tools/setup.sh installs it).
// WEFT_REPORT_SHOTS=<folder> keeps the pages and screenshots there.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "../unit/test_util.h"
#include "cli_runner.h"
#include "png_reader.h"
#include "report_page.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(WEFT_FIXTURES_DIR) + "/report";

std::string browser() {
  if (const char* b = std::getenv("WEFT_BROWSER")) return b;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
    const auto r = run_shell(std::string("command -v ") + name + " 2>/dev/null");
    if (r.code == 0 && !r.out.empty()) return r.out.substr(0, r.out.find('\n'));
  }
  return {};
}

class ReportBrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = browser();
    if (chromium_.empty()) GTEST_SKIP() << "no Chromium installed (apt-get install chromium; tools/setup.sh does)";
    const char* keep = std::getenv("WEFT_REPORT_SHOTS");
    out_ = keep ? std::string(keep) : dir_.path("shots");
    fs::create_directories(out_);
  }

  std::string chrome(const std::string& args) const {
    // A profile of its own, so parallel tests do not share one.
    return chromium_ + " --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=" +
           dir_.path("profile") + " " + args;
  }

  // Renders `page`: the DOM after the script ran, and a screenshot.
  void render(const std::string& name, const std::string& page) {
    const std::string url = "file://" + fs::absolute(page).string();
    const auto t0 = std::chrono::steady_clock::now();
    const auto dom = run_shell(chrome("--dump-dom " + url) + " 2>/dev/null");
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(dom.code, 0) << name;
    EXPECT_NE(dom.out.find("data-weft=\"ok\""), std::string::npos) << name << ": the script did not finish";
    // Script errors are written into this element (window.onerror): it stays empty.
    const size_t err = dom.out.find("<div id=\"weft-errors\">");
    ASSERT_NE(err, std::string::npos) << name;
    EXPECT_EQ(dom.out.compare(err, 28, "<div id=\"weft-errors\"></div>"), 0) << name << ": " << dom.out.substr(err, 600);
    auto attr = [&](const std::string& key) {
      const size_t at = dom.out.find(key + "=\"");
      return at == std::string::npos ? -1.0 : std::atof(dom.out.c_str() + at + key.size() + 2);
    };
    const std::string png = out_ + "/" + name + ".png";
    const auto shot = run_shell(chrome("--window-size=1200,2400 --screenshot=" + png + " " + url) + " 2>/dev/null");
    ASSERT_EQ(shot.code, 0) << name;
    const Image img = png_read(png);
    const int64_t ink = png_ink(img);
    std::printf("[ report ] %-14s %8.1f KB  open %.0f ms (parse + draw, in the page), script %.0f ms, "
                "chromium --dump-dom %.2f s in all; %lld of %lld pixels drawn\n",
                name.c_str(), double(fs::file_size(page)) / 1e3, attr("data-open-ms"), attr("data-draw-ms"), wall,
                static_cast<long long>(ink), static_cast<long long>(img.width * img.height));
    EXPECT_GT(ink, img.width * img.height / 50) << name << ": the screenshot is nearly blank";
    // A sanity bound, far above the 2 s the pages are meant to open in.
    EXPECT_LT(attr("data-open-ms"), 10000) << name;
    if (!std::getenv("WEFT_REPORT_SHOTS")) return;
    fs::copy_file(page, out_ + "/" + name + ".html", fs::copy_options::overwrite_existing);
  }

  TempDir dir_;
  std::string chromium_, out_;
};

TEST_F(ReportBrowser, DryRunPages) {
  auto r = run_weft("tune --dry-run --model llama-7b --gpu h100 --gpus 16 --format html --out " +
                    dir_.path("dry.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("dry-run", dir_.path("dry.html"));
  // More layouts listed than the bar chart draws.
  r = run_weft("tune --dry-run --model llama-7b --gpu h100 --gpus 16 --top 60 --format html --out " +
               dir_.path("dry60.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("dry-run-top60", dir_.path("dry60.html"));
  r = run_weft("tune --dry-run --model llama-65b --gpu a100-80gb --gpus 1024 --format html --out " +
               dir_.path("big.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("dry-run-65b", dir_.path("big.html"));
}

TEST_F(ReportBrowser, TuningPage) {
  auto r = run_weft("report " + kFixtures + "/tuning.json --out " + dir_.path("tuning.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("tuning", dir_.path("tuning.html"));
  // Recorded start times, and a first trial from an earlier run's journal
  // (in the table, off the timeline).
  std::ofstream(dir_.path("timed.json"))
      << tuning_with_start_times(nlohmann::json::parse(read_text(kFixtures + "/tuning.json")), 0.5, 0.25).dump();
  r = run_weft("report " + dir_.path("timed.json") + " --out " + dir_.path("timed.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("tuning-timed", dir_.path("timed.html"));
}

TEST_F(ReportBrowser, RunPage) {
  fs::copy(kFixtures + "/resumed", dir_.path("run"), fs::copy_options::recursive);
  // With a tuning beside it, as weft train --auto leaves one.
  fs::copy_file(kFixtures + "/tuning.json", dir_.path("run/tuning.json"));
  const auto r = run_weft("report " + dir_.path("run"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("run", dir_.path("run/report.html"));
}

// An MoE run's page draws its experts' loads: a bar per expert and the
// worst-to-mean ratio of each MoE layer, and under a capacity the choices
// each layer dropped.
TEST_F(ReportBrowser, MoeRunPage) {
  const auto r = run_weft("train --model tiny-moe --layout mb2 --seq 32 --global-batch 4 --steps 3 --threads 1 "
                          "--eval-samples 4 --moe-capacity-factor 0.5 --out " + dir_.path("moe"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("moe-run", dir_.path("moe/report.html"));
  const auto dom = run_shell(chrome("--dump-dom file://" + fs::absolute(dir_.path("moe/report.html")).string()) +
                             " 2>/dev/null");
  EXPECT_NE(dom.out.find("Experts' loads"), std::string::npos);
  for (int layer = 0; layer < 4; ++layer)
    EXPECT_NE(dom.out.find("Layer " + std::to_string(layer) + ": tokens per expert (worst / mean "), std::string::npos)
        << layer;
  EXPECT_NE(dom.out.find("the choices the capacity dropped"), std::string::npos);
  EXPECT_NE(dom.out.find(">dropped<"), std::string::npos);
  // A launch that stopped on an error (the end record an MoE overflow
  // leaves, tests/mpi/test_moe_overflow.cpp) is named with its last step.
  {
    std::ofstream m(dir_.path("moe/metrics.jsonl"), std::ios::app);
    m << R"({"kind": "end", "last_step": 2, "interrupted": false, "error": "step 3: MoE layer 1: an ep rank's )"
         R"(experts received 70 rows of a micro-batch, past the 64 its buffers hold"})"
      << "\n";
  }
  ASSERT_EQ(run_weft("report " + dir_.path("moe")).code, 0);
  const auto stopped = run_shell(chrome("--dump-dom file://" + fs::absolute(dir_.path("moe/report.html")).string()) +
                                 " 2>/dev/null");
  EXPECT_NE(stopped.out.find(">stopped<"), std::string::npos);
  EXPECT_NE(stopped.out.find("after step 2: step 3: MoE layer 1: an ep rank's experts received 70 rows"),
            std::string::npos);
}

// A tuned MoE run's page also draws the winner's trial's expert loads, and
// each trial's worst layer in the table of trials.
TEST_F(ReportBrowser, MoeTuningPage) {
  const auto r = run_weft("train --model tiny-moe --auto --tune-top 2 --seq 32 --global-batch 4 --steps 1 "
                          "--threads 1 --eval-samples 4 --out " + dir_.path("moe-tuned"));
  ASSERT_EQ(r.code, 0) << r.out;
  render("moe-tuning", dir_.path("moe-tuned/report.html"));
  const auto dom = run_shell(chrome("--dump-dom file://" + fs::absolute(dir_.path("moe-tuned/report.html")).string()) +
                             " 2>/dev/null");
  EXPECT_NE(dom.out.find("Experts' loads in the winner's trial"), std::string::npos);
  EXPECT_NE(dom.out.find("experts worst / mean (worst layer)"), std::string::npos);
  EXPECT_NE(dom.out.find("Layer 3: tokens per expert (worst / mean "), std::string::npos);
}

// Pages of JSON with a null wherever a number was (weft writes a NaN as
// null): drawn without a script error.
TEST_F(ReportBrowser, PagesOfNulls) {
  auto r = run_weft("tune --dry-run --model llama-7b --gpu h100 --gpus 16 --tp 1,2 --mb 1 --format json --out " +
                    dir_.path("dry.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ofstream(dir_.path("dry-null.json")) << with_nulls(nlohmann::json::parse(read_text(dir_.path("dry.json")))).dump();
  std::ofstream(dir_.path("tuning-null.json"))
      << with_nulls(nlohmann::json::parse(read_text(kFixtures + "/tuning.json"))).dump();
  copy_run_with_nulls(kFixtures + "/resumed", dir_.path("run"));
  fs::copy_file(dir_.path("tuning-null.json"), dir_.path("run/tuning.json"));
  for (const std::string input : {"dry-null.json", "tuning-null.json", "run"}) {
    r = run_weft("report " + dir_.path(input) + " --out " + dir_.path(input + ".html"));
    ASSERT_EQ(r.code, 0) << input << "\n" << r.out;
    render(input + "-page", dir_.path(input + ".html"));
  }
}

}  // namespace
}  // namespace weft::test
