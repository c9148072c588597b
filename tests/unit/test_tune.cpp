// The tuning driver on one process: profiling order, selection, the journal
// (resume, a trial that killed the process, a journal of another run), a
// refused reservation, and duration parsing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <gtest/gtest.h>

#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "data/prepare.h"
#include "report/tune_report.h"
#include "tuner/tune.h"
#include "tuner/tune_search.h"

namespace weft::tuner {
namespace {

struct TuneFixture {
  test::TempDir dir;
  SpaceContext ctx;
  SpaceLimits limits;
  trainer::TrainConfig base;
  TuneOptions o;
  std::unique_ptr<parallel::Comm> control = parallel::single_rank_comm();

  TuneFixture() {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "The tuner measures " + std::to_string(i * 7919 % 1000) + " layouts.\n%\n";
    data::PrepareOptions p;
    p.inputs = {dir.file("c.txt", text)};
    p.out = dir.path("data");
    p.val_fraction = 0.1;
    data::data_prepare(p);
    ctx.model = model_preset("tiny");
    ctx.run = RunSpec{16, 4, Precision::fp32};
    ctx.cluster.device = device_preset("cpu");
    ctx.cluster.gpus = 1;
    ctx.cluster.gpus_per_node = 1;
    ctx.constants = cost_defaults(ctx.cluster.device);
    limits.attention = {AttentionKind::flash};
    limits.norm = {NormKind::fused};
    base.model = ctx.model;
    base.run = ctx.run;
    base.device = ctx.cluster.device;
    base.data = {p.out};
    base.threads = 1;
    o.top = 3;
    o.timed_steps = 2;
    o.min_timed_s = 0.01;
    o.calibrate_after = 2;
    o.journal = dir.path("tuning/journal.jsonl");
  }
  TuneResult run() { return tune(ctx, limits, base, o, *control, nullptr, nullptr); }
};

TEST(Tune, ProfilesTheTopCandidatesAndPicksTheFastest) {
  TuneFixture f;
  const auto r = f.run();
  // Three candidates, then the three leaders measured again.
  ASSERT_EQ(r.trials.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(r.trials[i].repeat, i >= 3);
  ASSERT_TRUE(r.winner.has_value());
  std::vector<double> probes;
  for (const auto& t : r.trials) {
    EXPECT_EQ(t.status, "ok") << t.reason;
    EXPECT_GT(t.measured_s, 0);
    EXPECT_GT(t.mfu, 0);
    // A CPU trial times the machine after each of its steps, and its noise.
    EXPECT_TRUE(t.probe_s > 0 && t.probe_s < 1) << t.probe_s;
    EXPECT_TRUE(t.noise >= 0 && t.noise < 1) << t.noise;
    probes.push_back(t.probe_s);
    // The arena's high-water mark against the memory model.
    EXPECT_NEAR(double(t.measured_peak) / double(t.predicted_peak), 1.0, 0.05) << t.layout.to_string();
  }
  // The decisions compare steady steps, measured * median probe / probe: the
  // shortest mean of them wins, or one within 1% of it with less memory.
  std::nth_element(probes.begin(), probes.begin() + long(probes.size() / 2), probes.end());
  const double ref = probes[probes.size() / 2];
  // The winner's row carries the mean of its two measured steps: its own
  // trial measured twice that, less the other trial.
  const auto& w = r.trials[*r.winner];
  double other = 0;
  for (size_t i = 0; i < r.trials.size(); ++i)
    if (i != *r.winner && r.trials[i].layout == w.layout) other = r.trials[i].measured_s;
  std::map<std::string, std::vector<double>> steady;
  for (size_t i = 0; i < r.trials.size(); ++i) {
    const auto& t = r.trials[i];
    const double measured = i == *r.winner ? 2 * t.measured_s - other : t.measured_s;
    steady[t.layout.to_string()].push_back(measured * ref / t.probe_s);
  }
  const auto mean = [](const std::vector<double>& v) { return (v[0] + v[1]) / 2; };
  double fastest = mean(steady.at(w.layout.to_string()));
  for (auto& [l, v] : steady) fastest = std::min(fastest, mean(v));
  EXPECT_EQ(w.repeats, 2);
  EXPECT_LE(mean(steady.at(w.layout.to_string())), fastest * 1.01 + 1e-12);
  // Its row carries the mean of its two measured steps.
  double raw = 0;
  for (size_t i = 0; i < r.trials.size(); ++i)
    if (i != *r.winner && r.trials[i].layout == w.layout) raw = r.trials[i].measured_s;
  EXPECT_GT(raw, 0);
  ASSERT_TRUE(r.calibration.has_value());
  EXPECT_LE(r.calibration->rms_error_after, r.calibration->rms_error_before + 1e-12);
  EXPECT_EQ(r.stop_reason, "profiled the top 3");
  // The recipe and report carry the measurements.
  const auto recipe = tune_recipe(r, f.ctx, "test machine");
  EXPECT_EQ(recipe.layout, r.trials[*r.winner].layout);
  EXPECT_EQ(recipe.source, "profiled");
  EXPECT_NE(report::tune_report_md(r, f.ctx).find("**winner**"), std::string::npos);
  EXPECT_EQ(report::tune_report_json(r, f.ctx)["trials"].size(), 6u);
}

TEST(Tune, ResumesFromTheJournalAndSkipsATrialThatKilledTheProcess) {
  TuneFixture f;
  f.o.top = 4;
  f.o.calibrate_after = 0;  // the order stays the models' one
  f.o.confirm = false;
  const auto first = f.run();
  ASSERT_EQ(first.trials.size(), 4u);
  // Cut the journal back to a process that died in the third trial: header,
  // two trials started and finished, the third started.
  std::vector<std::string> lines;
  {
    std::ifstream in(f.o.journal);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 9u);
  {
    std::ofstream out(f.o.journal, std::ios::trunc);
    for (size_t i = 0; i < 6; ++i) out << lines[i] << "\n";
  }
  const auto again = f.run();
  ASSERT_EQ(again.trials.size(), 4u);
  EXPECT_TRUE(again.trials[0].from_journal);
  EXPECT_TRUE(again.trials[1].from_journal);
  EXPECT_EQ(again.trials[0].measured_s, first.trials[0].measured_s);
  EXPECT_EQ(again.trials[1].measured_s, first.trials[1].measured_s);
  EXPECT_EQ(again.trials[2].layout, first.trials[2].layout);
  EXPECT_EQ(again.trials[2].status, "killed");
  // The fourth is chosen from what the two reused trials measured, as any
  // trial after the first few: a layout not tried before, run now.
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(again.trials[3].layout, again.trials[i].layout) << i;
  EXPECT_EQ(again.trials[3].status, "ok");
  EXPECT_FALSE(again.trials[3].from_journal);
}

TEST(Tune, AJournalOfAnotherRunIsRefusedByName) {
  TuneFixture f;
  f.o.top = 1;
  f.run();
  f.ctx.run.global_batch = 8;
  f.base.run.global_batch = 8;
  try {
    f.run();
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch 4, this run has 8"), std::string::npos) << e.what();
  }
}

// A journal record no trial could have written (a step of 1e-308 s, which
// would win with an MFU of inf%, or a null) refuses the tuning by file and
// field before any trial, leaving the journal as it was.
TEST(Tune, AJournalRecordOutOfRangeIsRefusedByField) {
  for (const auto& [value, says] : std::vector<std::pair<nlohmann::json, std::string>>{
           {1e-308, "measured_s' of an ok trial is 1e-308"}, {1e9, "is 1e+09"}, {nullptr, "measured_s"}}) {
    TuneFixture f;
    f.o.top = 1;
    f.o.confirm = false;
    f.run();
    std::vector<std::string> lines;
    {
      std::ifstream in(f.o.journal);
      for (std::string l; std::getline(in, l);) lines.push_back(l);
    }
    std::string text;
    for (auto& l : lines) {
      auto e = nlohmann::json::parse(l);
      if (e["kind"] == "result") e["result"]["measured_s"] = value;
      text += e.dump() + "\n";
    }
    std::ofstream(f.o.journal, std::ios::trunc) << text;
    try {
      f.run();
      FAIL() << "expected an error for " << value.dump();
    } catch (const FileFormatError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(f.o.journal), std::string::npos) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
      EXPECT_EQ(what.find("[json.exception"), std::string::npos) << what;
    }
    EXPECT_EQ(test::file_contents(f.o.journal), text);
  }
}

TEST(Tune, ARefusedReservationIsRecordedAsOutOfMemory) {
  TuneFixture f;
  f.o.confirm = false;
  f.o.faults = "refuse_memory:1:0";
  const auto r = f.run();
  ASSERT_EQ(r.trials.size(), 3u);
  EXPECT_EQ(r.trials[0].status, "oom");
  EXPECT_NE(r.trials[0].reason.find("rank 0: host memory: reserving"), std::string::npos) << r.trials[0].reason;
  EXPECT_EQ(r.trials[1].status, "ok");
  EXPECT_NE(*r.winner, 0u);
  f.o.faults = "melt:1:0";
  EXPECT_THROW(f.run(), InputError);
}

// Successive trials need not all run in full: a layout whose first timed
// step is far behind the best measured one ends there.
TEST(Tune, ATrialFarBehindTheBestEndsAfterOneTimedStep) {
  TuneFixture f;
  // The profiler itself: cut, it stops after the warm-up and one timed step;
  // not cut, it runs them all.
  trainer::ProfileConfig pc;
  pc.train = f.base;
  pc.train.layout = Layout::parse("tp1-pp1-dp1-mb4-vpp1-nosp-ckpt:none-attn:flash-norm:fused-zero0-grad:fp32");
  pc.warmup_steps = 1;
  pc.timed_steps = 4;
  pc.min_timed_s = 0;
  pc.cut_above_s = 1e-9;
  const auto cut = trainer::profile_layout(pc, *f.control, nullptr);
  ASSERT_EQ(cut.status, trainer::TrialStatus::ok) << cut.reason;
  EXPECT_TRUE(cut.cut);
  EXPECT_EQ(cut.steps, 2);
  EXPECT_GT(cut.step_s, 0);
  pc.cut_above_s = 1e6;
  const auto full = trainer::profile_layout(pc, *f.control, nullptr);
  EXPECT_FALSE(full.cut);
  EXPECT_EQ(full.steps, 5);

  // In a search every first trial after the first one is measured against
  // the best so far; repeats of the leaders always run in full. A factor
  // below any ratio of steps cuts them all.
  f.o.cut_factor = 1e-6;
  const auto r = f.run();
  ASSERT_EQ(r.trials.size(), 6u);
  for (size_t i = 0; i < r.trials.size(); ++i) {
    EXPECT_EQ(r.trials[i].status, "ok") << r.trials[i].reason;
    EXPECT_EQ(r.trials[i].cut, i == 1 || i == 2) << i;
  }
  EXPECT_NE(report::tune_report_md(r, f.ctx).find("ok (cut: one timed step)"), std::string::npos);
  // The journal keeps the mark, and a resumed run reads it back.
  bool marked = false;
  {
    std::ifstream in(f.o.journal);
    for (std::string l; std::getline(in, l);) marked |= l.find("\"cut\":true") != std::string::npos;
  }
  EXPECT_TRUE(marked);
  const auto again = f.run();
  ASSERT_GE(again.trials.size(), 3u);
  EXPECT_TRUE(again.trials[1].from_journal);
  EXPECT_TRUE(again.trials[1].cut);
  // Brute force (factor 0) cuts nothing.
  f.o.cut_factor = 0;
  std::filesystem::remove(f.o.journal);
  for (const auto& t : f.run().trials) EXPECT_FALSE(t.cut) << t.layout.to_string();
}

// An MoE model's trials measure how unevenly its routers spread the tokens
// (the busiest expert over its layer's mean, worst layer), and the report
// says it; a dense model's trials have no such figure.
TEST(Tune, MixtureOfExpertsTrialsMeasureTheExpertsLoads) {
  TuneFixture f;
  f.ctx.model = model_preset("tiny-moe");
  f.base.model = f.ctx.model;
  f.o.top = 2;
  f.o.confirm = false;
  const auto r = f.run();
  ASSERT_EQ(r.trials.size(), 2u);
  for (const auto& t : r.trials) {
    ASSERT_EQ(t.status, "ok") << t.reason;
    // At least the mean, at most every token's choice on one expert (E x the mean).
    EXPECT_GE(t.expert_imbalance, 1.0) << t.layout.to_string();
    EXPECT_LE(t.expert_imbalance, double(f.ctx.model.moe.experts)) << t.layout.to_string();
    // Each MoE layer's tokens per expert: every layer took every token's k
    // choices, and the worst layer's busiest expert is the figure above.
    ASSERT_EQ(t.expert_layers, (std::vector<int64_t>{0, 1, 2, 3}));
    ASSERT_EQ(t.expert_counts.size(), 4u);
    double worst = 0;
    int64_t first_sum = -1;
    for (const auto& row : t.expert_counts) {
      ASSERT_EQ(int64_t(row.size()), f.ctx.model.moe.experts);
      int64_t sum = 0, most = 0;
      for (const int64_t c : row) {
        EXPECT_GE(c, 0);
        sum += c;
        most = std::max(most, c);
      }
      EXPECT_GT(sum, 0);
      EXPECT_EQ(sum % f.ctx.model.moe.top_k, 0);
      if (first_sum < 0) first_sum = sum;
      EXPECT_EQ(sum, first_sum);
      worst = std::max(worst, double(most) * double(row.size()) / double(sum));
    }
    EXPECT_DOUBLE_EQ(worst, t.expert_imbalance);
    // The most uneven dispatches, at each ep degree d of the 8 experts: a
    // block of 8 / d of them takes at least its share of a micro-batch and
    // at most min(k, 8 / d) choices a row; at d = 8 (an expert each) one
    // micro-batch's, so at least what the trial's sums show.
    ASSERT_EQ(t.dispatch_peaks.size(), 9u);
    EXPECT_EQ(t.dispatch_rows, t.layout.mb * f.ctx.run.seq);
    for (const int64_t d : {2, 4, 8}) {
      EXPECT_GE(t.dispatch_peaks[size_t(d)], 1.0) << d;
      EXPECT_LE(t.dispatch_peaks[size_t(d)], double(d * std::min<int64_t>(2, 8 / d)) / 2) << d;
    }
    for (const int64_t d : {0, 1, 3, 5, 6, 7}) EXPECT_EQ(t.dispatch_peaks[size_t(d)], 0.0) << d;
    EXPECT_GE(t.dispatch_peaks[8], t.expert_imbalance * (1 - 1e-12)) << t.layout.to_string();
    // The journal keeps them; a damaged record is refused by field.
    const TrialRecord back = record_from_json(trial_to_json(t), "journal");
    EXPECT_EQ(back.expert_layers, t.expert_layers);
    EXPECT_EQ(back.expert_counts, t.expert_counts);
    EXPECT_EQ(back.dispatch_peaks, t.dispatch_peaks);
    EXPECT_EQ(back.dispatch_rows, t.dispatch_rows);
    nlohmann::json odd = trial_to_json(t);
    odd["dispatch_peaks"]["3x"] = 1.5;
    WEFT_EXPECT_THROW_MSG(record_from_json(odd, "journal"), FileFormatError, "journal", "field 'dispatch_peaks'",
                          "\"3x\":1.5");
    nlohmann::json bad = trial_to_json(t);
    bad["expert_load"]["counts"][1].push_back(3);
    WEFT_EXPECT_THROW_MSG(record_from_json(bad, "journal"), FileFormatError, "journal", "field 'expert_load'",
                          "one length");
  }
  const std::string md = report::tune_report_md(r, f.ctx);
  EXPECT_NE(md.find("Experts' loads in the trials: in the worst MoE layer the busiest expert took"), std::string::npos)
      << md;
  EXPECT_NE(md.find("The winner's trial, busiest expert over its layer's mean, by MoE layer: 0 "), std::string::npos)
      << md;
  EXPECT_GT(report::tune_report_json(r, f.ctx)["trials"][0]["expert_imbalance"].get<double>(), 0.0);
  TuneFixture dense;
  dense.o.top = 1;
  dense.o.confirm = false;
  for (const auto& t : dense.run().trials) {
    EXPECT_EQ(t.expert_imbalance, 0.0);
    EXPECT_TRUE(t.dispatch_peaks.empty());
    EXPECT_FALSE(trial_to_json(t).contains("dispatch_peaks"));
    EXPECT_TRUE(t.expert_layers.empty());
    EXPECT_FALSE(trial_to_json(t).contains("expert_load"));
  }
}

// Capacity factors the user lists are searched: each layout of the space
// at each factor, its trial trained with the model dropping at it (the
// trainer refuses a layout whose factor is not the model's, so a trial that
// ran says so), the refit priced likewise, and the recipe's model drops at
// the winner's.
TEST(Tune, ListedCapacityFactorsAreSearched) {
  TuneFixture f;
  f.ctx.model = model_preset("tiny-moe");
  f.base.model = f.ctx.model;
  f.limits.mb = {4};
  f.limits.ckpt = {Checkpointing::none};
  f.limits.capacity = {0.0, 1.0};
  f.o.top = 2;
  f.o.confirm = false;
  const auto space = enumerate(f.ctx.model, f.ctx.run, 1, f.limits, f.ctx.cluster);
  ASSERT_EQ(space.size(), 2u);
  EXPECT_EQ(space[0].capacity_factor, 0.0);
  EXPECT_EQ(space[1].capacity_factor, 1.0);
  EXPECT_EQ(Layout::parse(space[1].to_string()), space[1]);
  EXPECT_NE(space[1].to_string().find("-cap:1"), std::string::npos) << space[1].to_string();
  const auto r = f.run();
  ASSERT_EQ(r.trials.size(), 2u);
  std::set<double> ran;
  for (const auto& t : r.trials) {
    EXPECT_EQ(t.status, "ok") << t.layout.to_string() << ": " << t.reason;
    ran.insert(t.layout.capacity_factor);
  }
  EXPECT_EQ(ran, (std::set<double>{0.0, 1.0}));
  ASSERT_TRUE(r.calibration.has_value());
  ASSERT_TRUE(r.winner.has_value());
  const Recipe rc = tune_recipe(r, f.ctx, "test");
  EXPECT_EQ(rc.model.moe.capacity_factor, r.trials[*r.winner].layout.capacity_factor);
  EXPECT_TRUE(rc.layout.violations(rc.model, f.ctx.run, 1).empty());
}

// The run's receive buffers (run_buffer_factor): the most the winner's
// memory leaves room for, from its trials' factor up to the worst case.
// Mixtral 8x7B's published layout on 64 H100 (T 4096, GBS 256;
// benchmarks/RESULTS.md) fits at 1.5x a rank's balanced rows and not at the
// worst case's 4x: the factor found is on the grid of hundredths, fits, and
// a hundredth more does not. The tiny MoE on a CPU takes the worst case.
TEST(Tune, TheRunsReceiveBuffersTakeTheMemoryItsLayoutLeaves) {
  SpaceContext ctx;
  ctx.model = model_preset("mixtral-8x7b");
  ctx.run = RunSpec{4096, 256, Precision::bf16};
  ctx.cluster = cluster_resolve("h100", 64, 8);
  ctx.constants = cost_defaults(ctx.cluster.device);
  const Layout l = Layout::parse("tp1-pp4-dp16-ep8-mb1-vpp8-zero1-grad:fp32");
  const auto fits_at = [&](const SpaceContext& c, const Layout& at, double f) {
    ModelSpec m = model_for(c.model, at);
    m.moe.imbalance = f;
    return evaluate_one(m, c.run, c.cluster, at, c.constants, c.memory).verdict == Verdict::fits;
  };
  ASSERT_TRUE(fits_at(ctx, l, 1.5));
  ASSERT_FALSE(fits_at(ctx, l, 4.0));
  const double f = run_buffer_factor(ctx, l, 1.5);
  EXPECT_GT(f, 1.5);
  EXPECT_LT(f, 4.0);
  EXPECT_NEAR(100 * f, std::round(100 * f), 1e-9);
  EXPECT_TRUE(fits_at(ctx, l, f)) << f;
  EXPECT_FALSE(fits_at(ctx, l, f + 0.01)) << f;
  std::printf("Mixtral 8x7B, %s on 64 H100: the run's buffers at %.2fx (trials 1.5x, worst case 4x)\n",
              l.to_string().c_str(), f);
  EXPECT_EQ(run_buffer_factor(ctx, l, f), f);      // no room for more
  EXPECT_EQ(run_buffer_factor(ctx, l, 0.0), 0.0);  // the worst case already
  const Layout dense_ffn = Layout::parse("tp1-pp4-dp16-mb1-vpp8-zero1-grad:fp32");
  EXPECT_EQ(run_buffer_factor(ctx, dense_ffn, 1.5), 1.5);  // no expert parallelism
  // A CPU's memory holds the tiny MoE's worst case: under ep 2, each rank's
  // 4 of 8 experts can take both choices of every row of both ranks, 2x.
  TuneFixture t;
  t.ctx.model = model_preset("tiny-moe");
  t.ctx.cluster.gpus = 2;
  t.ctx.cluster.gpus_per_node = 2;
  const Layout small = Layout::parse("tp1-pp1-dp2-ep2-mb1");
  ASSERT_TRUE(fits_at(t.ctx, small, 2.0));
  EXPECT_EQ(run_buffer_factor(t.ctx, small, 1.3), 2.0);
}

TEST(Tune, DurationsParse) {
  EXPECT_DOUBLE_EQ(duration_parse("90"), 90);
  EXPECT_DOUBLE_EQ(duration_parse("45s"), 45);
  EXPECT_DOUBLE_EQ(duration_parse("10m"), 600);
  EXPECT_DOUBLE_EQ(duration_parse("1h30m"), 5400);
  EXPECT_DOUBLE_EQ(duration_parse("1.5m"), 90);
  for (const char* bad : {"", "10x", "m", "-5s", "0", "1h30", "abc"}) {
    try {
      duration_parse(bad);
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace weft::tuner
