// `weft train --auto` on 4 real mpirun ranks: tuning with real steps, the
// report, the recipe and its reuse, and the faults tuning must survive (a
// reservation refused on one rank, a rank that hangs, a process killed mid-
// tuning then resumed from the journal), each bounded by the test timeout.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

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
  return test::file_contents(path);
}

struct Fixture {
  TempDir dir;
  std::string data;
  std::string model = "tiny";
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
        "{} XDG_CACHE_HOME={} {} --oversubscribe -np 4 {} train --auto --model {} --data {} --seq 32 "
        "--global-batch 8 --steps 3 --threads 1 --eval-samples 8 --tune-top 4 --trial-warmup 1 "
        "--trial-steps 2 --out {} {} 2>&1",
        env, dir.path("cache"), MPIEXEC, WEFT_BIN, model, data, out, extra);
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

// An MoE model's tuning sizes the expert-parallel receive buffers from the
// dispatches its seed trials measured instead of the worst case, evaluates
// the space again with them, and runs the later trials and the training
// with them; the recipe keeps the winner's factor for the runs that reuse
// it. A stated --moe-imbalance is left as it is.
TEST(TuneMpi, MixtureOfExpertsSizesTheReceiveBuffersFromItsTrials) {
  Fixture f;
  // Mixtral's form, 16 experts top-2: under ep 4 a token's two choices can
  // both go to one rank's 4 experts, from every rank, so the worst case is
  // 4 x a rank's balanced rows.
  f.model = f.dir.file("moe/config.json", R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": false, "num_local_experts": 16, "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.01, "output_router_logits": true, "max_position_embeddings": 64})");
  const auto out = f.dir.path("a");
  auto r = f.tune(out, "--ep 4 --tune-top 6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "MoE routing measured in ")) << r.out;
  const auto rep = Fixture::report(out);
  ASSERT_TRUE(rep.contains("moe_buffers")) << rep.dump(1);
  const auto& b = rep["moe_buffers"];
  const int64_t sizing = b["trials"].get<int64_t>();
  ASSERT_GE(sizing, 1);
  // The factor a layout's ep-4 buffers hold: the one measured at the most
  // rows a rank up to its own (0: the worst case).
  const auto factor_at = [&](int64_t rows) {
    double f = 0;
    int64_t nearest = 0;
    for (const auto& d : b["dispatches"])
      if (d["ep"] == 4 && d["rows"].get<int64_t>() <= rows && d["rows"].get<int64_t>() >= nearest) {
        if (d["rows"].get<int64_t>() > nearest) f = 0;
        nearest = d["rows"].get<int64_t>();
        f = std::max(f, d["factor"].get<double>());
      }
    return f;
  };
  // Each (rows a rank, ep) factor: 1.25 x the most uneven dispatch of the
  // trials before the sizing that routed those rows, rounded up to a
  // hundredth.
  std::map<std::pair<int64_t, int64_t>, double> most;
  const auto& trials = rep["trials"];
  for (int64_t i = 0; i < int64_t(trials.size()); ++i) {
    const auto& t = trials[size_t(i)];
    ASSERT_EQ(t["status"], "ok") << t.dump();
    // The memory model with the buffers the trial ran with, against its arena.
    EXPECT_NEAR(t["measured_peak_bytes"].get<double>() / t["predicted_peak_bytes"].get<double>(), 1.0, 0.05)
        << t.dump();
    for (const auto& [d, p] : t["dispatch_peaks"].items()) {
      // At least the balanced share; at most min(k, 16 / d) choices of a row.
      EXPECT_GE(p.get<double>(), 1.0) << t.dump();
      EXPECT_LE(p.get<double>(), std::stoi(d) * std::min(2, 16 / std::stoi(d)) / 2.0) << t.dump();
      if (i < sizing && d == "4") {  // (the ep degrees of the space: --ep 4)
        double& m = most[{t["dispatch_rows"].get<int64_t>(), std::stoll(d)}];
        m = std::max(m, p.get<double>());
      }
    }
  }
  ASSERT_EQ(b["dispatches"].size(), most.size()) << b.dump();
  for (const auto& d : b["dispatches"]) {
    const double peak = most.at({d["rows"].get<int64_t>(), d["ep"].get<int64_t>()});
    EXPECT_NEAR(d["factor"].get<double>(), std::max(1.0, std::ceil(100 * 1.25 * peak) / 100), 1e-9) << d.dump();
  }
  // A layout measured before the sizing (with the worst case's buffers) and
  // again after it, with the measured buffers: less memory where they hold
  // less than the worst case, the arena the memory model's both times.
  int64_t shrunk = 0;
  for (int64_t i = 0; i < sizing; ++i)
    for (int64_t j = sizing; j < int64_t(trials.size()); ++j) {
      const auto &before = trials[size_t(i)], &after = trials[size_t(j)];
      if (before["layout"] != after["layout"]) continue;
      const double fa = factor_at(after["dispatch_rows"].get<int64_t>());
      if (fa > 0 && fa < 4) {
        EXPECT_LT(after["predicted_peak_bytes"].get<double>(), before["predicted_peak_bytes"].get<double>())
            << after.dump();
        ++shrunk;
      }
    }
  EXPECT_GE(shrunk, 1) << b.dump();
  // The winner's trials held its measured factor; the run takes the most
  // the winner's memory leaves room for, up to the worst case (4x here: the
  // seed trials ran this tiny model with the worst case's buffers), and the
  // recipe keeps it.
  const auto& winner = *std::find_if(trials.rbegin(), trials.rend(), [&](const auto& t) {
    return t["layout"] == rep["winner"];
  });
  const double sized = factor_at(winner["dispatch_rows"].get<int64_t>());
  EXPECT_DOUBLE_EQ(b["sized"].get<double>(), sized);
  const double factor = b["imbalance"].get<double>();
  EXPECT_DOUBLE_EQ(factor, sized > 0 ? 4.0 : 0.0);
  const auto recipe = nlohmann::json::parse(read(out + "/recipe.json"));
  EXPECT_DOUBLE_EQ(recipe["model"]["moe"]["imbalance"].get<double>(), factor);
  // Its predicted memory is the run's, at the run's buffers: more than the
  // winner's trials predicted where those hold more.
  if (factor > sized && sized > 0)
    EXPECT_GT(recipe["predicted"]["peak_bytes"].get<double>(), winner["predicted_peak_bytes"].get<double>());
  EXPECT_TRUE(contains(read(out + "/tuning.md"), "Expert-parallel receive buffers: sized from the dispatches"))
      << read(out + "/tuning.md");
  if (sized > 0)
    EXPECT_TRUE(contains(read(out + "/tuning.md"), fmt::format("the run holds {}x", factor))) << read(out + "/tuning.md");
  if (factor > 0) {
    EXPECT_TRUE(contains(r.out, fmt::format("of the buffers' {}x", std::min(factor, 4.0)))) << r.out;
    // The cached recipe brings the factor with its layout.
    r = f.tune(f.dir.path("b"), "--ep 4");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, fmt::format("MoE receive buffers at {}x as it sized them", factor))) << r.out;
    EXPECT_TRUE(contains(r.out, fmt::format("of the buffers' {}x", std::min(factor, 4.0)))) << r.out;
  }
  std::ifstream metrics(out + "/metrics.jsonl");
  int64_t records = 0;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train") continue;
    ++records;
    EXPECT_GE(j["expert_load"]["dispatch_peaks"]["4"].get<double>(), 1.0) << line;
    EXPECT_EQ(j["expert_load"]["dispatch_peaks"].size(), 4u) << line;  // ep 2, 4, 8 and 16
  }
  EXPECT_GE(records, 1);
  // Stated, the worst case stays: nothing is sized.
  r = f.tune(f.dir.path("c"), "--ep 4 --retune --tune-top 2 --moe-imbalance 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "MoE routing measured")) << r.out;
  EXPECT_FALSE(Fixture::report(f.dir.path("c")).contains("moe_buffers"));
  // Stated below what any trial routes: every trial stops on its first
  // step, and the error names the first one's reason beside the report
  // that lists them all (exit 2).
  r = f.tune(f.dir.path("d"), "--ep 4 --retune --tune-top 2 --moe-imbalance 1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "weft: error: tuning found no layout that runs: every trial failed (2 of them; the "
                              "first, tp"))
      << r.out;
  EXPECT_TRUE(contains(r.out, ": failed (rank 0: step 1: MoE layer ")) << r.out;
  EXPECT_TRUE(contains(r.out, "; see " + f.dir.path("d") + "/tuning.md")) << r.out;
  const auto failed = Fixture::report(f.dir.path("d"));
  ASSERT_EQ(failed["trials"].size(), 2u) << failed.dump(1);
  for (const auto& t : failed["trials"]) EXPECT_EQ(t["status"], "failed") << t.dump();
  EXPECT_TRUE(fs::exists(f.dir.path("d") + "/tuning.md"));
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
