// Tuning with real steps: enumerate → validate → memory prune → cost rank →
// profile → select. Every rank of the world calls tune() together; rank 0
// decides which candidate comes next (and when to stop) and tells the others
// over the control communicator, so clocks and files that differ between
// ranks cannot split them. See trainer/profile.h for what one trial does and
// how a failing trial is contained.
//
// The search: candidates that fit (and that the trainer can run), ranked by
// predicted step time. The first trials go to distinct parallel shapes (tp,
// cp, pp, dp, mb, vpp), best predicted first. After `calibrate_after`
// measured trials the cost model's efficiencies are refit to the measured
// steps (nlopt least squares, see calibrate.h), and after every trial a
// correction per knob value (tuner/surrogate.h: tp=2, mb=8, attn:materialized,
// norm:unfused, zero1, ...) is fitted to what the refit still misses, with a
// spread for each prediction. Each next trial is the candidate with the
// largest expected shortening of the best measured step under that
// prediction and spread, so a knob value never measured, whose spread is the
// prior's, is tried while its layouts could still win. The search stops when
// no candidate is expected to shorten the best step by 0.5% or more, or
// after 2% of the candidates (at least 16, at most 96; --tune-top sets it).
// Last, the three leaders are measured again (and whichever layout then
// leads, if it had one trial), and the winner is the layout with the
// shortest mean step (within 1%: the least memory).
//
// On CPUs every decision compares steady steps: the measured step times the
// median probe over the trial's own probe (a fixed GEMM timed after each of
// its steps, trainer/profile.h), since a VM's cores drift by a quarter over
// minutes and twofold over hours; the reports and the recipe carry the
// measured steps.
//
// The journal (JSONL, written by rank 0 after every trial) makes tuning
// resumable: a re-run reuses completed trials and records a trial that was
// started but never finished as "killed" instead of running it again.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainer/profile.h"
#include "tuner/calibrate.h"
#include "tuner/recipe.h"
#include "tuner/space.h"

namespace weft::tuner {

struct TuneOptions {
  int64_t top = 0;               // profile at most this many candidates; 0: 2% of them, 16 to 96
  double budget_s = 0;           // start no trial after this many seconds; 0: none
  bool model_stop = true;        // stop once the refit model is confident the rest are slower
  bool confirm = true;           // measure the three leaders again at the end
  int64_t warmup_steps = 1;
  int64_t timed_steps = 3;       // at least; more until they took min_timed_s
  double min_timed_s = 0.5;
  double silence_s = 60;         // a trial's communication watchdog
  bool probe = true;             // CPU trials time a probe GEMM after each step (trainer::ProfileConfig::probe)
  double trial_limit_s = 0;      // a trial's wall-time limit; 0: 10 × predicted + 30 s
  // A first trial of a layout whose first timed step takes more than this
  // many times the best measured step ends there (trainer::ProfileConfig::
  // cut_above_s): the rest of its steps would only rank it further behind.
  // 0: every trial runs its steps (brute force).
  double cut_factor = 1.5;
  int64_t calibrate_after = 3;   // measured trials before the first refit
  std::string journal;           // JSONL path; empty: no journal
  // Test faults, "KIND:TRIAL:RANK[,...]" with KIND refuse_memory, hang or die
  // and TRIAL the 1-based position in the profiling order (WEFT_TUNE_FAULT).
  std::string faults;
  // Called on rank 0 after each trial with the trials profiled and the most
  // that will be (a progress bar); may be empty.
  std::function<void(int64_t done, int64_t total)> progress;
  // MoE models with expert-parallel layouts in the space and no stated
  // imbalance factor (the model's is 0, the worst case): once the seed
  // trials have measured how unevenly the routers dispatch, the receive
  // buffers are sized from that (MoeSpec::measured, TuneResult::
  // moe_dispatches), the space is evaluated again with them, and the later
  // trials and the run use them.
  bool size_buffers = false;
};

struct TrialRecord {
  int64_t order = 0;              // 1-based position in the profiling order
  Layout layout;
  std::string status;             // ok, oom, timeout, failed, killed
  std::string reason;
  bool from_journal = false;
  bool repeat = false;            // a leader measured again
  bool cut = false;               // ended after its first timed step, far behind the best (TuneOptions::cut_factor)
  double expert_imbalance = 0;    // MoE models: busiest expert over its layer's mean, worst layer (trainer::TrialOutcome)
  // MoE models: the most uneven dispatch at each ep degree d (index d;
  // trainer::TrialOutcome::dispatch_peaks) of the rows each rank routed.
  std::vector<double> dispatch_peaks;
  int64_t dispatch_rows = 0;
  // MoE models: the tokens each expert took in each MoE layer over the
  // trial's steps and every rank, as a run's records give them: the MoE
  // layers, and a row of E counts for each. Empty for a dense model.
  std::vector<int64_t> expert_layers;
  std::vector<std::vector<int64_t>> expert_counts;
  int64_t repeats = 1;            // on the winner's row: trials its measurement averages
  double predicted_s = 0;         // default constants
  double calibrated_s = 0;        // constants refit before this trial (= predicted_s before any fit)
  double measured_s = 0;          // median timed step, slowest rank
  double noise = 0;               // relative standard error of the trial's own median (of step / probe with a probe)
  double probe_s = 0;             // CPU trials: the machine's speed during the trial (trainer/profile.h)
  double tokens_per_s = 0;
  double mfu = 0;
  int64_t predicted_peak = 0;     // worst stage, memory model
  int64_t measured_peak = 0;      // worst rank, arena high-water mark
  double seconds = 0;             // wall time of the trial
  double start_s = -1;            // when it began, seconds since tuning began; -1: read from the journal
};

struct TuneResult {
  SpaceReport space;               // the analytic evaluation
  int64_t candidates = 0;          // fitting layouts the trainer can run
  std::vector<TrialRecord> trials; // in profiling order
  std::optional<size_t> winner;    // index into trials
  std::optional<CalibrationResult> calibration;  // the last refit, over every measured trial
  std::string stop_reason;         // why profiling stopped
  // A stop signal ended the search: the trials are a part of a tuning, and
  // no recipe may come of them (the journal lets the next run go on).
  bool stopped = false;
  int64_t profiled = 0;            // distinct layouts profiled (a repeat of a leader is not counted)
  int64_t repeats = 0;             // trials that measured a leader again
  double profile_seconds = 0;      // wall time spent in trials
  double journal_seconds = 0;      // what the trials taken from the journal took when they ran
  // The corrections the search learnt on top of the refit cost model: each
  // measured knob value's effect (log of measured over predicted step), the
  // largest first, and the noise left.
  std::vector<std::pair<std::string, double>> knob_effects;
  double correction_noise = 0;
  double seconds = 0;              // wall time of tune()
  double peak_flops = 0;           // per device, what MFU is against
  // MoE models (TuneOptions::size_buffers): the receive buffers sized from
  // the dispatches of the first moe_sizing_trials trials, kBufferMargin
  // times each (empty: not sized); the candidates there were before, at the
  // worst case's buffers; the factor the winner's trials held; and the
  // run's (run_buffer_factor: at least that, more where the winner's memory
  // leaves room; 0: the model's own).
  std::vector<MeasuredDispatch> moe_dispatches;
  int64_t moe_sizing_trials = 0;
  int64_t moe_worst_candidates = 0;
  double moe_sized_imbalance = 0;
  double moe_imbalance = 0;
};

// The receive buffers sized from measured routing hold this many times the
// most uneven dispatch the trials saw: routing moves as the routers learn,
// and a micro-batch past the buffers stops the run (MoeSpec::imbalance).
inline constexpr double kBufferMargin = 1.25;

// The measured dispatches of `trials` (their ok ones'), kBufferMargin
// times each peak rounded up to a hundredth, from 1 to kMaxImbalance: one
// per (rows, ep) pair, the largest.
std::vector<MeasuredDispatch> measured_dispatches(const std::vector<TrialRecord>& trials);

// The receive-buffer factor a run of layout `l` trains with, where its
// trials held `sized` (the measured routing's, MoeSpec::imbalance_for): the
// largest factor on a grid of hundredths, from `sized` up to the worst
// case's, at which the memory model still fits `l` on ctx's device. A
// trial's few steps see the router at its initialisation, and a run's
// routing moves further as the routers learn (benchmarks/RESULTS.md: a
// tiny Mixtral form's run overflowed buffers sized at 1.25 x its trials'
// peak within 20 steps), so memory the layout leaves free goes to them. `sized`
// itself where no more fits, and where it is 0 (the worst case) or l has
// no expert parallelism.
double run_buffer_factor(const SpaceContext& ctx, const Layout& l, double sized);

// `base` gives the model, run, device, optimizer, seed, data and threads of
// every trial. `log` gets the progress lines (pass null on ranks other than 0).
// Throws InputError when no layout fits, or a bad journal or fault spec.
TuneResult tune(const SpaceContext& ctx, const SpaceLimits& limits, const trainer::TrainConfig& base,
                const TuneOptions& options, parallel::Comm& control,
                const trainer::GroupFactory& make_groups, std::FILE* log);

// The journal header: what a journal must match to be resumed.
nlohmann::json tune_journal_header(const SpaceContext& ctx, const SpaceLimits& limits, const TuneOptions& o);

// One trial as JSON: a journal entry and a row of the JSON report.
nlohmann::json trial_to_json(const TrialRecord& t);

// The recipe of the winner; InputError when no trial succeeded or the
// tuning was stopped before it finished.
Recipe tune_recipe(const TuneResult& r, const SpaceContext& ctx, const std::string& machine);

// Rank 0's `text`, returned on every rank of `control`.
std::string share_text(parallel::Comm& control, const std::string& text);

// "10m", "90s", "1h30m", "45" (seconds) → seconds; InputError naming the text.
double duration_parse(const std::string& text);

}  // namespace weft::tuner
