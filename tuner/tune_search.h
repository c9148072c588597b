// The phases of tune() (tuner/tune.h), each on its own: the candidates the
// analytic half leaves, the journal the ranks agree on, and the search with
// real steps: which trial comes next, running it, recording it and refitting
// the cost model, and the winner. Internal to the tuner.
#pragma once

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tuner/journal.h"
#include "tuner/surrogate.h"
#include "tuner/tune.h"

namespace weft::tuner {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A fault a test asks of one rank in one trial (WEFT_TUNE_FAULT).
struct Fault {
  trainer::TrialFault kind;
  int64_t trial;
  int64_t rank;
};
std::vector<Fault> faults_parse(const std::string& spec);
// A journal's trial record; FileFormatError naming `origin`, the record and
// the field for a missing or mistyped field, a value out of its range, or an
// ok trial whose measured_s lies outside [kMinStepSeconds, kMaxStepSeconds].
inline constexpr double kMinStepSeconds = 1e-6, kMaxStepSeconds = 86400;
TrialRecord record_from_json(const nlohmann::json& j, const std::string& origin);
// Rank 0's value of `v`, on every rank of the control communicator.
int64_t share(parallel::Comm& control, int64_t v);
// Layouts that differ only in kernel knobs share a parallel shape.
std::string shape_key(const Layout& l);

// A layout the search may profile.
struct SearchCandidate {
  Layout layout;
  double predicted_s;   // the device's constants
  double calibrated_s;  // the constants refit to the trials so far
  int64_t peak;         // bytes, the memory model's worst stage
  bool done = false;    // profiled (a confirmation measures it again)
};

// Evaluates the space into r.space and returns the layouts that fit and that
// the trainer runs, by predicted step; InputError when there are none.
std::vector<SearchCandidate> search_candidates(const SpaceContext& ctx, const SpaceLimits& limits, TuneResult& r);

// Rank 0 opens the journal (when o.journal names one); a bad one stops every
// rank with rank 0's message.
std::optional<Journal> open_journal(const SpaceContext& ctx, const SpaceLimits& limits, const TuneOptions& o,
                                    parallel::Comm& control);

class Search {
 public:
  Search(const SpaceContext& ctx, const SpaceLimits& limits, const TuneOptions& o, const trainer::TrainConfig& base, parallel::Comm& control,
         const trainer::GroupFactory& make_groups, std::FILE* log, std::optional<Journal> journal,
         std::vector<Fault> faults, std::vector<SearchCandidate> candidates, TuneResult& r,
         Clock::time_point start);
  // Trials until the search stops: every rank runs each one together.
  void run();
  // The last refit over every trial and the winner, on every rank.
  void finish();

 private:
  // What rank 0 decides next: a candidate (or -1: stop) and how.
  enum class Mode : int64_t { profile = 0, from_journal = 1, confirm = 2 };
  struct Next {
    int64_t pick = -1;
    Mode mode = Mode::profile;
  };
  Next choose();              // rank 0
  TrialRecord trial(SearchCandidate& c, int64_t order, Mode mode);
  void record(const TrialRecord& t);  // rank 0: the measurement, a refit, the progress line
  void refit(bool final);
  // Every candidate's prediction under the refit constants (k_).
  void reprice();
  // Rank 0: the receive buffers the trials so far measured
  // (TuneOptions::size_buffers), as text; empty while it is too early.
  std::string measured_buffers() const;
  // Every rank: the space evaluated again with the receive buffers sized
  // from those dispatches, the candidates replaced (those profiled stay so).
  void size_buffers(const std::vector<MeasuredDispatch>& dispatches);
  // The knob corrections refit to every measured layout (cheap: after each).
  void fit_corrections();
  // A candidate's predicted step with the corrections, in log seconds, and
  // the spread of that prediction.
  double log_prediction(size_t i) const;
  // The expected shortening of the best measured step (seconds) were
  // candidate i profiled, under the corrected prediction and its spread.
  double expected_gain(size_t i, double best) const;
  double mean_of(const std::string& layout) const;
  std::vector<std::string> leaders(size_t n);
  void say(const std::string& s);

  // The tuning's context: its model's imbalance factor is what the buffers
  // were sized at (size_buffers), the caller's until then.
  SpaceContext ctx_;
  const SpaceLimits& limits_;
  const TuneOptions& o_;
  const trainer::TrainConfig& base_;
  parallel::Comm& control_;
  const trainer::GroupFactory& make_groups_;
  std::FILE* log_;
  std::optional<Journal> journal_;
  std::vector<Fault> faults_;
  std::vector<SearchCandidate> cands_;
  TuneResult& r_;
  // Parallel shapes the first trials go to, one each, best predicted first.
  static constexpr int64_t kSeedShapes = 4;
  // The search stops once no candidate is expected to shorten the best
  // measured step by this fraction (trial noise on shared machines is a few
  // percent, so smaller gains are not worth a trial).
  static constexpr double kStopGain = 0.005;
  // The least noise the corrections assume, whatever the trials' own steps say.
  static constexpr double kLeastNoise = 0.005;
  const Clock::time_point start_;  // tune()'s, which the budget counts from
  const bool rank0_;
  CostConstants k_;
  double tokens_ = 0, flops_ = 0;
  int64_t limit_ = 0, explore_ = 0;  // trials at most, and how many go to distinct shapes
  // A layout's measurement is the mean of its ok trials (the confirmation
  // phase measures the leaders twice); its peak the largest.
  // Each trial's (measured step, probe); the decisions use the steady step,
  // measured * probe_ref_ / probe, which does not move with the machine's
  // drift (trainer/profile.h), the reports the measured one.
  std::map<std::string, std::vector<std::pair<double, double>>> measured_;
  double probe_ref_ = 0;  // the median probe of the trials so far (0: none, GPU trials)
  double steady(double measured, double probe) const {
    return probe > 0 && probe_ref_ > 0 ? measured * probe_ref_ / probe : measured;
  }
  double raw_mean_of(const std::string& layout) const;
  std::map<std::string, int64_t> peak_of_;
  std::map<std::string, size_t> index_of_;  // layout text -> candidate
  Surrogate corrections_;
  std::vector<std::vector<int32_t>> knobs_;  // each candidate's knob values, encoded
  std::set<std::string> shapes_tried_, confirmed_;
  std::string main_stop_;
  size_t fitted_on_ = 0;
  double trial_seconds_ = 0;  // mean wall time of a trial, for the budget
  int64_t trials_run_ = 0, profiled_ = 0;
  bool size_buffers_ = false;  // TuneOptions::size_buffers, and ep layouts in the space
};

}  // namespace weft::tuner
