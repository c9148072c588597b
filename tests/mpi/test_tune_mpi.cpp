// `weft train --auto` on 4 real mpirun ranks: tuning with real steps, the
// report, the recipe and its reuse, and the faults tuning must survive (a
// reservation refused on one rank, a rank that hangs, a process killed mid-
// tuning then resumed from the journal), each bounded by the test timeout.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../e2e/cli_runner.h"
#include "../e2e/report_page.h"
#include "../unit/test_util.h"
#include "mpi_env.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Fixture {
  TempDir dir;
  std::string data;
  Fixture() {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "Tuning picks a layout " + std::to_string(i * 7919 % 1000) + " times.\n%\n";
    const auto in = dir.file("c.txt", text);
    data = dir.path("data");
    const auto r = run_weft("data prepare --input " + in + " --out " + data + " --val-fraction 0.1");
    EXPECT_EQ(r.code, 0) << r.out;
  }
  // mpirun -np 4 weft train --auto ... with its own recipe cache.
  CliResult tune(const std::string& out, const std::string& extra = "", const std::string& env = "") const {
    const std::string cmd = fmt::format(
        "{} XDG_CACHE_HOME={} {} --oversubscribe -np 4 {} train --auto --model tiny --data {} --seq 32 "
        "--global-batch 8 --steps 3 --threads 1 --eval-samples 8 --tune-top 4 --trial-warmup 1 "
        "--trial-steps 2 --out {} {} 2>&1",
        env, dir.path("cache"), MPIEXEC, WEFT_BIN, data, out, extra);
    return run_shell(cmd);
  }
  static nlohmann::json report(const std::string& out) {
    return nlohmann::json::parse(read(out + "/tuning.json"));
  }
};

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(TuneMpi, TunesOnFourRanksTrainsTheWinnerAndReusesTheRecipe) {
  Fixture f;
  const auto out = f.dir.path("a");
  auto r = f.tune(out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "tuning tiny on 4 x cpu")) << r.out;
  EXPECT_TRUE(contains(r.out, "[4/4] ")) << r.out;
  EXPECT_TRUE(contains(r.out, "(measured again)")) << r.out;
  EXPECT_TRUE(contains(r.out, "| memory measured |")) << r.out;
  // mpirun hands the ranks a pseudo-terminal even into a pipe: still plain
  // lines, no bars redrawn in place.
  EXPECT_FALSE(contains(r.out, "\x1b[K")) << r.out;
  EXPECT_FALSE(contains(r.out, "\r")) << r.out;
  const auto rep = Fixture::report(out);
  // 4 candidates, the 3 leaders again, and the 4th if it then leads.
  ASSERT_GE(rep["trials"].size(), 7u) << rep.dump(1);
  ASSERT_LE(rep["trials"].size(), 8u) << rep.dump(1);
  for (const auto& t : rep["trials"]) {
    EXPECT_EQ(t["status"], "ok") << t.dump();
    EXPECT_GT(t["measured_s"].get<double>(), 0);
    // The memory model against every rank's arena peak.
    const double p = t["predicted_peak_bytes"].get<double>(), m = t["measured_peak_bytes"].get<double>();
    EXPECT_NEAR(m / p, 1.0, 0.05) << t.dump();
  }
  // Each trial's start in the tuning's time: one after another, inside it.
  double end = 0;
  for (const auto& t : rep["trials"]) {
    ASSERT_TRUE(t.contains("start_s")) << t.dump();
    EXPECT_GE(t["start_s"].get<double>(), end - 1e-6) << t.dump();
    end = t["start_s"].get<double>() + t["seconds"].get<double>();
  }
  EXPECT_LE(end, rep["seconds"].get<double>() + 1e-6);
  const std::string winner = rep["winner"].get<std::string>();
  EXPECT_TRUE(contains(r.out, "layout " + winner)) << r.out;  // training used it
  const auto recipe = nlohmann::json::parse(read(out + "/recipe.json"));
  EXPECT_EQ(recipe["layout"], winner);
  EXPECT_EQ(recipe["source"], "profiled");
  EXPECT_EQ(recipe["cluster"]["world"], 4);
  EXPECT_GT(recipe["measured"]["tokens_per_s"].get<double>(), 0);
  EXPECT_TRUE(fs::exists(out + "/tuning.md"));
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_000003"));

  // The same command again: the cached recipe, no profiling.
  r = f.tune(f.dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "using cached recipe")) << r.out;
  EXPECT_FALSE(contains(r.out, "[1/")) << r.out;
  EXPECT_TRUE(contains(r.out, "layout " + winner)) << r.out;
  // --retune profiles again.
  r = f.tune(f.dir.path("c"), "--retune --tune-top 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "[2/2] ")) << r.out;
}

// The checkpoint of the last step run, and an end record saying so.
void expect_stopped_with_checkpoint(const std::string& out) {
  std::ifstream latest(out + "/checkpoints/latest");
  std::string named;
  std::getline(latest, named);
  ASSERT_FALSE(named.empty()) << out;
  EXPECT_TRUE(fs::exists(out + "/checkpoints/" + named + "/manifest.json")) << named;
  std::string line, last;
  for (std::ifstream in(out + "/metrics.jsonl"); std::getline(in, line);) last = line;
  const auto end = nlohmann::json::parse(last);
  EXPECT_EQ(named, fmt::format("step_{:06d}", end["last_step"].get<int64_t>())) << "the checkpoint is of the last step run";
  EXPECT_EQ(end["kind"], "end") << last;
  EXPECT_EQ(end["interrupted"], true) << last;
  EXPECT_EQ(end["signal"], "SIGTERM") << last;
  EXPECT_TRUE(fs::exists(out + "/report.html"));
}

// Stopping a run under mpirun keeps its checkpoint, both ways: SIGTERM to
// the ranks (mpirun keeps forwarding their output), and Ctrl-C to mpirun,
// which stops reading the ranks' terminals, signals them after
// odls_base_sigkill_timeout seconds and kills them as long after that (a
// rank blocked writing a log line then never reached its checkpoint). The
// default 1 s is named in a note at the start.
TEST(TuneMpi, StoppingUnderMpirunKeepsTheCheckpoint) {
  Fixture f;
  const std::string train = fmt::format(
      "{} --oversubscribe -np 2 {} train --model tiny --data {} --seq 32 --global-batch 8 --threads 1 "
      "--layout tp1-pp1-dp2-mb4 --eval-samples 8 --steps 100000",
      MPIEXEC, WEFT_BIN, f.data);
  // Runs `train` into `out` in the background, a line per step, and once
  // `records` steps are logged sends `signal` to `whom` ($p: mpirun's pid).
  const auto stop = [&](const std::string& out, const std::string& env, const std::string& signal,
                        const std::string& whom, int64_t records) {
    return run_shell(fmt::format(
        "{} {} --log-every 1 --out {} > {}.log 2>&1 & p=$!; i=0; "
        "while [ \"$(cat {}/metrics.jsonl 2>/dev/null | grep -c '\"kind\":\"train\"')\" -lt {} ] && [ $i -lt 1200 ]; "
        "do sleep 0.1; i=$((i+1)); done; kill -{} {}; "
        "( sleep 120; kill -KILL $p ) >/dev/null 2>&1 & w=$!; wait $p; echo \"mpirun exit $?\"; kill $w 2>/dev/null",
        env, train, out, out, out, records, signal, whom));
  };
  const std::string a = f.dir.path("ranks");
  auto r = stop(a, "", "TERM", "$(pgrep -P $p)", 3);
  std::string log = read(a + ".log");
  EXPECT_TRUE(contains(log, "note: on Ctrl-C mpirun gives the ranks 1 s before it kills them")) << log;
  EXPECT_TRUE(contains(log, "stopped early; checkpoint")) << log;
  EXPECT_TRUE(contains(r.out, "mpirun exit 143")) << r.out;
  expect_stopped_with_checkpoint(a);

  const std::string b = f.dir.path("ctrl-c");
  // A line per step: the terminal mpirun no longer reads fills within the
  // grace (without the fix, rank 0 blocked there and wrote no end record).
  r = stop(b, "OMPI_MCA_odls_base_sigkill_timeout=10", "INT", "$p", 50);
  log = read(b + ".log");
  EXPECT_FALSE(contains(log, "note: on Ctrl-C")) << log;
  expect_stopped_with_checkpoint(b);
}

TEST(TuneMpi, AReservationRefusedOnOneRankIsRecordedAsOutOfMemory) {
  Fixture f;
  const auto out = f.dir.path("a");
  const auto r = f.tune(out, "--tune-top 3", "WEFT_TUNE_FAULT=refuse_memory:1:2");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rep = Fixture::report(out);
  ASSERT_EQ(rep["trials"].size(), 5u) << rep.dump(1);  // 3 candidates, the 2 that ran measured again
  EXPECT_EQ(rep["trials"][0]["status"], "oom") << rep.dump(1);
  EXPECT_TRUE(contains(rep["trials"][0]["reason"], "rank 2:")) << rep.dump(1);
  EXPECT_TRUE(contains(rep["trials"][0]["reason"], "reserving")) << rep.dump(1);
  EXPECT_EQ(rep["trials"][1]["status"], "ok");
  EXPECT_NE(rep["winner"], rep["trials"][0]["layout"]);
}

TEST(TuneMpi, ARankThatHangsIsAbandonedByTheTrialWatchdog) {
  Fixture f;
  const auto out = f.dir.path("a");
  const auto r = f.tune(out, "--tune-top 3 --trial-timeout 3", "WEFT_TUNE_FAULT=hang:2:3");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rep = Fixture::report(out);
  ASSERT_EQ(rep["trials"].size(), 5u) << rep.dump(1);  // 3 candidates, the 2 that ran measured again
  EXPECT_EQ(rep["trials"][1]["status"], "timeout") << rep.dump(1);
  EXPECT_TRUE(contains(rep["trials"][1]["reason"], "no progress in 3 s")) << rep.dump(1);
  EXPECT_EQ(rep["trials"][0]["status"], "ok");
  EXPECT_EQ(rep["trials"][2]["status"], "ok");
  EXPECT_TRUE(contains(r.out, "training tiny")) << r.out;
}

TEST(TuneMpi, AProcessKilledMidTuningResumesFromTheJournal) {
  Fixture f;
  const auto out = f.dir.path("a");
  auto r = f.tune(out, "--tune-top 3", "WEFT_TUNE_FAULT=die:2:0");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(out + "/recipe.json"));
  const std::string journal = out + "/tuning/journal.jsonl";
  const std::string before = read(journal);
  EXPECT_EQ(std::count(before.begin(), before.end(), '\n'), 4) << before;  // header, start, result, start

  // A journal cut off mid-line is refused, and left as it was.
  {
    std::ofstream(journal, std::ios::app) << R"({"kind":"result","res)";
  }
  const std::string torn = read(journal);
  r = f.tune(out, "--tune-top 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "line 5")) << r.out;
  EXPECT_EQ(read(journal), torn);
  fs::resize_file(journal, before.size());

  // A journal of another run (here another seq) is refused by name.
  r = f.tune(out, "--tune-top 3 --seq 16");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "seq 32, this run has 16")) << r.out;
  EXPECT_EQ(read(journal), before);

  // The re-run reuses trial 1, records trial 2 as killed and goes on.
  r = f.tune(out, "--tune-top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "(from the journal)")) << r.out;
  const auto rep = Fixture::report(out);
  ASSERT_EQ(rep["trials"].size(), 5u) << rep.dump(1);  // 3 candidates, the 2 that ran measured again
  EXPECT_EQ(rep["trials"][0]["status"], "ok");
  EXPECT_TRUE(rep["trials"][0]["from_journal"].get<bool>());
  EXPECT_EQ(rep["trials"][1]["status"], "killed") << rep.dump(1);
  EXPECT_EQ(rep["trials"][2]["status"], "ok");
  EXPECT_TRUE(fs::exists(out + "/recipe.json"));
  // Trials of the earlier process have no start in this tuning's time: the
  // report's timeline leaves them off and says so.
  EXPECT_FALSE(rep["trials"][0].contains("start_s")) << rep.dump(1);
  EXPECT_FALSE(rep["trials"][1].contains("start_s")) << rep.dump(1);
  EXPECT_TRUE(rep["trials"][2].contains("start_s")) << rep.dump(1);
  r = run_shell(fmt::format("{} report {}/tuning.json --out {}/t.html 2>&1", WEFT_BIN, out, out));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto page = report_embedded(read(out + "/t.html"));
  EXPECT_EQ(page["timeline_estimated"], false);
  EXPECT_EQ(page["trials"][0]["on_timeline"], false);
  EXPECT_EQ(page["trials"][1]["on_timeline"], false);
  EXPECT_FALSE(page["trials"][2].contains("on_timeline"));
}

}  // namespace
}  // namespace weft::test
