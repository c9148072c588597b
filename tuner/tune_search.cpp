#include "tuner/tune_search.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "core/stop.h"
#include "core/units.h"
#include "memory/shapes.h"
#include "trainer/loop.h"

namespace weft::tuner {

namespace {

// The (upper) median of `v`, which it reorders; v must not be empty.
double median_of(std::vector<double>& v) {
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<SearchCandidate> search_candidates(const SpaceContext& ctx, const SpaceLimits& limits, TuneResult& r) {
  const auto layouts = enumerate(ctx.model, ctx.run, ctx.cluster.gpus, limits, ctx.cluster);
  r.space = evaluate(ctx.model, ctx.run, ctx.cluster, layouts, ctx.constants, ctx.memory);
  r.peak_flops = ctx.cluster.device.peak_flops(to_string(ctx.run.precision));
  std::vector<SearchCandidate> cands;
  int64_t untrainable = 0;
  for (const auto& c : r.space.candidates) {
    if (c.verdict != Verdict::fits) continue;
    try {
      trainer::check_trainable(ctx.model, c.layout, ctx.cluster.device.kind, trainer::Trainable::here, ctx.run.seq);
    } catch (const LayoutError&) {
      ++untrainable;
      continue;
    }
    cands.push_back({c.layout, c.cost.step, c.cost.step, c.memory.peak()});
  }
  r.candidates = int64_t(cands.size());
  if (cands.empty())
    throw InputError(fmt::format("no layout of {} on {} x {} fits and is trainable ({} evaluated, {} fit, {} "
                                 "need trainer features or kernels this build lacks); see `weft tune --dry-run`",
                                 ctx.model.name, ctx.cluster.gpus, ctx.cluster.device.name, r.space.evaluated,
                                 r.space.fitting, untrainable));
  return cands;
}

std::optional<Journal> open_journal(const SpaceContext& ctx, const SpaceLimits& limits, const TuneOptions& o,
                                    parallel::Comm& control) {
  std::optional<Journal> journal;
  int64_t bad = 0;
  std::string why;
  if (control.rank() == 0 && !o.journal.empty()) {
    try {
      journal.emplace(Journal::open(o.journal, tune_journal_header(ctx, limits, o)));
      // Every record is read now, so that a bad one refuses the tuning
      // before any trial instead of in the middle of it.
      for (const auto& result : journal->results()) (void)record_from_json(result, o.journal);
    } catch (const FileFormatError& e) {
      bad = 2;
      why = e.what();
    } catch (const InputError& e) {
      bad = 1;
      why = fmt::format("{}; --retune starts a new journal", e.what());
    }
  }
  bad = share(control, bad);
  if (bad) {
    why = share_text(control, why);
    if (bad == 2) throw FileFormatError(why);
    throw InputError(why);
  }
  return journal;
}

Search::Search(const SpaceContext& ctx, const SpaceLimits& limits, const TuneOptions& o,
               const trainer::TrainConfig& base, parallel::Comm& control, const trainer::GroupFactory& make_groups,
               std::FILE* log, std::optional<Journal> journal, std::vector<Fault> faults,
               std::vector<SearchCandidate> candidates, TuneResult& r, Clock::time_point start)
    : ctx_(ctx), limits_(limits), o_(o), base_(base), control_(control), make_groups_(make_groups), log_(log),
      journal_(std::move(journal)), faults_(std::move(faults)), cands_(std::move(candidates)), r_(r), start_(start),
      rank0_(control.rank() == 0), k_(ctx.constants) {
  tokens_ = double(ctx.run.tokens_per_step());
  flops_ = model_flops_per_step(ctx.model, ctx.run);
  std::set<std::string> all_shapes;
  for (size_t i = 0; i < cands_.size(); ++i) {
    all_shapes.insert(shape_key(cands_[i].layout));
    index_of_[cands_[i].layout.to_string()] = i;
    knobs_.push_back(corrections_.encode(cands_[i].layout));
  }
  // Trials: 2% of the candidates, at least 16 and at most 96 (the stopping
  // rule usually ends the search well before); the first few go to distinct
  // parallel shapes, so that the first refit has steps of different shapes
  // to fit.
  const int64_t n = int64_t(cands_.size());
  limit_ = std::min<int64_t>(o.top > 0 ? o.top : std::clamp<int64_t>(n / 50, 16, 96), n);
  explore_ = std::min<int64_t>({kSeedShapes, int64_t(all_shapes.size()), limit_});
  // Sizing the buffers can only matter where the space has ep layouts
  // (whether or not they fit the worst case's buffers).
  size_buffers_ = o.size_buffers && ctx.model.moe.enabled() && ctx.model.moe.imbalance == 0 &&
                  std::any_of(r.space.candidates.begin(), r.space.candidates.end(),
                              [](const auto& c) { return c.layout.ep > 1; });
  say(fmt::format("tuning {} on {} x {}: {} layouts evaluated, {} fit, {} candidates; profiling up to {}{} "
                  "({} warm-up + at least {} timed steps and {:g} s each)\n",
                  ctx.model.name, ctx.cluster.gpus, ctx.cluster.device.name, r.space.evaluated, r.space.fitting,
                  cands_.size(), limit_, o.budget_s > 0 ? fmt::format(" within {}", format_seconds(o.budget_s)) : "",
                  o.warmup_steps, o.timed_steps, o.min_timed_s));
}

void Search::say(const std::string& s) {
  if (log_) {
    std::fputs(s.c_str(), log_);
    std::fflush(log_);
  }
}

double Search::mean_of(const std::string& l) const {
  double sum = 0;
  for (const auto& [m, probe] : measured_.at(l)) sum += steady(m, probe);
  return sum / double(measured_.at(l).size());
}

double Search::raw_mean_of(const std::string& l) const {
  double sum = 0;
  for (const auto& [m, probe] : measured_.at(l)) sum += m;
  return sum / double(measured_.at(l).size());
}

// The measured layouts by mean step, shortest first; the first is the one
// with the least memory among those within 1% of the shortest (a tie rule
// applied once: as a sort order it would not be transitive).
std::vector<std::string> Search::leaders(size_t n) {
  // Each mean once (a brute force over thousands of layouts asks after every
  // trial; comparing by mean_of, a map lookup each, made that quadratic in
  // string compares), then only the front ordered.
  std::vector<std::pair<double, const std::string*>> by_mean;
  by_mean.reserve(measured_.size());
  for (const auto& [l, v] : measured_) by_mean.emplace_back(mean_of(l), &l);
  const auto less = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : *a.second < *b.second;
  };
  if (by_mean.empty()) return {};
  const double fastest = std::min_element(by_mean.begin(), by_mean.end(), less)->first;
  // The ties within 1% of the fastest, and n more, are all the order needs.
  const auto tied =
      std::count_if(by_mean.begin(), by_mean.end(), [&](const auto& m) { return m.first <= fastest * 1.01; });
  const size_t front = std::min(by_mean.size(), size_t(tied) + n);
  std::partial_sort(by_mean.begin(), by_mean.begin() + ptrdiff_t(front), by_mean.end(), less);
  auto pick = by_mean.begin();
  for (auto it = by_mean.begin(); it != by_mean.end() && it->first <= fastest * 1.01; ++it)
    if (peak_of_[*it->second] < peak_of_[*pick->second]) pick = it;
  std::rotate(by_mean.begin(), pick, pick + 1);
  std::vector<std::string> ls;
  for (size_t i = 0; i < std::min(n, by_mean.size()); ++i) ls.push_back(*by_mean[i].second);
  return ls;
}

// Refits after every measured trial at first, then whenever the measured
// trials grew by a quarter (a fit costs time linear in them), and once at the
// end over all of them for the report.
void Search::refit(bool final) {
  std::vector<Observation> obs;
  for (const auto& t : r_.trials)
    if (t.status == "ok") obs.push_back({t.layout, steady(t.measured_s, t.probe_s)});
  if (o_.calibrate_after <= 0 || int64_t(obs.size()) < o_.calibrate_after || obs.size() == fitted_on_) return;
  if (!final && obs.size() > 12 && double(obs.size()) < 1.25 * double(fitted_on_)) return;
  fitted_on_ = obs.size();
  r_.calibration = calibrate(ctx_.model, ctx_.run, ctx_.cluster, obs, ctx_.constants);
  k_ = r_.calibration->constants;
  reprice();
}

void Search::reprice() {
  // Profiled candidates too: the corrections are fitted to their residuals
  // against these constants.
  for (auto& c : cands_) {
    const bool own = c.layout.capacity_factor == ctx_.model.moe.capacity_factor;
    c.calibrated_s =
        predict(own ? ctx_.model : model_for(ctx_.model, c.layout), ctx_.run, c.layout, ctx_.cluster, k_).step;
  }
}

// The buffers are sized once the seed trials (distinct parallel shapes) have
// run and one of them measured a dispatch; each (rows, ep, factor) as text,
// so that every rank takes the same bits.
std::string Search::measured_buffers() const {
  if (!size_buffers_ || !r_.moe_dispatches.empty() || profiled_ < explore_) return {};
  // (Only the ep degrees the space holds.)
  std::set<int64_t> eps;
  for (const auto& c : r_.space.candidates) eps.insert(c.layout.ep);
  std::string text;
  for (const MeasuredDispatch& d : measured_dispatches(r_.trials))
    if (eps.count(d.ep)) text += fmt::format("{} {} {:.17g}\n", d.rows, d.ep, d.factor);
  return text;
}

void Search::size_buffers(const std::vector<MeasuredDispatch>& dispatches) {
  std::set<std::string> done;
  for (const auto& c : cands_)
    if (c.done) done.insert(c.layout.to_string());
  const int64_t before = int64_t(cands_.size());
  ctx_.model.moe.measured = dispatches;
  std::vector<SearchCandidate> fresh = search_candidates(ctx_, limits_, r_);
  // Smaller buffers only shrink every layout's memory, so each candidate is
  // still one; a profiled layout the evaluation lost all the same stays.
  std::set<std::string> kept;
  for (auto& c : fresh) {
    kept.insert(c.layout.to_string());
    c.done = done.count(c.layout.to_string()) > 0;
  }
  for (const auto& c : cands_)
    if (c.done && !kept.count(c.layout.to_string())) fresh.push_back(c);
  cands_ = std::move(fresh);
  index_of_.clear();
  knobs_.clear();
  for (size_t i = 0; i < cands_.size(); ++i) {
    index_of_[cands_[i].layout.to_string()] = i;
    knobs_.push_back(corrections_.encode(cands_[i].layout));
  }
  r_.candidates = int64_t(cands_.size());
  if (o_.top <= 0)
    limit_ = std::min(std::max(limit_, std::clamp<int64_t>(int64_t(cands_.size()) / 50, 16, 96)),
                      int64_t(cands_.size()));
  if (r_.calibration) reprice();
  r_.moe_dispatches = dispatches;
  r_.moe_worst_candidates = before;
  r_.moe_sizing_trials = int64_t(r_.trials.size());
  if (!rank0_) return;
  fit_corrections();
  std::vector<std::string> by_ep;
  for (const MeasuredDispatch& d : dispatches) by_ep.push_back(fmt::format("ep{} {} rows {:g}x", d.ep, d.rows, d.factor));
  say(fmt::format("MoE routing measured in {} trials: the expert-parallel receive buffers now hold {:g} x the most "
                  "uneven dispatch at each ep degree and rows routed per rank ({}; where no trial routed as few "
                  "rows, the worst case), and {} candidates fit where the worst case's buffers left {}; the later "
                  "trials use them, the run those or more where its memory leaves room (--moe-imbalance pins one "
                  "factor)\n",
                  r_.moe_sizing_trials, kBufferMargin, fmt::join(by_ep, ", "), cands_.size(), before));
}

void Search::fit_corrections() {
  // No correction is finer than the trials can tell: the noise floor is the
  // median trial's own (the standard error of its median step).
  std::vector<double> noises;
  for (const auto& t : r_.trials)
    if (t.status == "ok" && t.noise > 0) noises.push_back(t.noise);
  if (!noises.empty()) corrections_.set_noise_floor(std::max(kLeastNoise, median_of(noises)));
  std::vector<std::vector<int32_t>> rows;
  std::vector<double> y;
  for (const auto& [l, v] : measured_) {
    const size_t i = index_of_.at(l);
    rows.push_back(knobs_[i]);
    y.push_back(std::log(mean_of(l) / cands_[i].calibrated_s));
  }
  corrections_.fit(rows, y);
}

double Search::log_prediction(size_t i) const {
  return std::log(cands_[i].calibrated_s) + corrections_.mean(knobs_[i]);
}

// E[max(0, best - T)] for a log-normal T with log mean mu and spread s:
// best * Phi(z) - exp(mu + s^2 / 2) * Phi(z - s), z = (log best - mu) / s.
double Search::expected_gain(size_t i, double best) const {
  const double mu = log_prediction(i), sd = corrections_.spread(knobs_[i]);
  const auto phi = [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); };
  const double z = (std::log(best) - mu) / sd;
  return std::max(0.0, best * phi(z) - std::exp(mu + sd * sd / 2) * phi(z - sd));
}

// Layouts that share a parallel shape (tp, pp, dp, mb, vpp) and differ in
// kernel knobs are predicted alike, so the first trials go to distinct
// shapes, best predicted first; the rest refine the three best measured
// shapes; then the three leaders are measured again (trial noise on shared
// machines is several percent) and the mean decides.
Search::Next Search::choose() {
  auto best_of = [&](auto&& allowed) {
    size_t next = cands_.size();
    for (size_t i = 0; i < cands_.size(); ++i)
      if (!cands_[i].done && allowed(cands_[i]) &&
          (next == cands_.size() || cands_[i].calibrated_s < cands_[next].calibrated_s))
        next = i;
    return next;
  };
  const double reserve = 3 * trial_seconds_;  // for the confirmations
  size_t next = cands_.size();
  if (main_stop_.empty()) {
    if (profiled_ >= limit_) main_stop_ = fmt::format("profiled the top {}", limit_);
    else if (o_.budget_s > 0 && since(start_) + reserve > o_.budget_s)
      main_stop_ = fmt::format("time budget of {} spent", format_seconds(o_.budget_s));
  }
  if (main_stop_.empty()) {
    const bool exploring = profiled_ < explore_;
    if (exploring) next = best_of([&](const SearchCandidate& c) { return !shapes_tried_.count(shape_key(c.layout)); });
    if (next == cands_.size() && measured_.empty()) next = best_of([](const SearchCandidate&) { return true; });
    if (next == cands_.size() && !measured_.empty()) {
      // The candidate that promises the most: the largest expected
      // shortening of the best step, under the corrected prediction and its
      // spread. A knob value never measured keeps the prior's spread, so
      // each one is tried once while its layouts could still win.
      const double best = mean_of(leaders(1)[0]);
      double gain = -1;
      for (size_t i = 0; i < cands_.size(); ++i) {
        if (cands_[i].done) continue;
        const double g = expected_gain(i, best);
        if (g > gain || (g == gain && log_prediction(i) < log_prediction(next))) {
          gain = g;
          next = i;
        }
      }
      if (next < cands_.size() && o_.model_stop && !exploring && gain < kStopGain * best) {
        main_stop_ = fmt::format(
            "no remaining candidate is expected to shorten the best step by {:.1f}% or more (the {} left, "
            "predicted by the cost model refit to {} trials and corrected per knob value, spread {:.1f}%)",
            100 * kStopGain,
            std::count_if(cands_.begin(), cands_.end(), [](const SearchCandidate& c) { return !c.done; }),
            measured_.size(), 100 * corrections_.noise());
        next = cands_.size();
      }
    }
    if (next == cands_.size() && main_stop_.empty()) main_stop_ = "profiled every candidate";
  }
  Next n;
  if (next < cands_.size()) {
    n.pick = int64_t(next);
    const std::string text = cands_[next].layout.to_string();
    if (journal_) {
      const auto unfinished = journal_->unfinished();
      if (journal_->result(text) || std::count(unfinished.begin(), unfinished.end(), text))
        n.mode = Mode::from_journal;
    }
  } else if (o_.confirm && confirmed_.size() < 6 && (o_.budget_s <= 0 || since(start_) < o_.budget_s)) {
    // The three leaders, then whichever layout leads after them if a second
    // measurement moved it up: the winner is never one trial.
    for (const auto& l : leaders(confirmed_.size() < 3 ? 3 : 1))
      if (measured_[l].size() == 1 && !confirmed_.count(l)) {
        for (size_t i = 0; i < cands_.size(); ++i)
          if (cands_[i].layout.to_string() == l) n.pick = int64_t(i);
        n.mode = Mode::confirm;
        confirmed_.insert(l);
        break;
      }
  }
  if (n.pick < 0) r_.stop_reason = main_stop_;
  return n;
}

TrialRecord Search::trial(SearchCandidate& cand, int64_t order, Mode mode) {
  TrialRecord t;
  t.order = order;
  t.layout = cand.layout;
  t.predicted_s = cand.predicted_s;
  t.calibrated_s = std::exp(log_prediction(index_of_.at(cand.layout.to_string())));
  t.predicted_peak = cand.peak;
  t.repeat = mode == Mode::confirm;
  const std::string text = cand.layout.to_string();
  if (mode == Mode::from_journal) {
    if (rank0_) {
      if (const auto* j = journal_->result(text)) {
        t = record_from_json(*j, journal_->path());
        t.order = order;
        // Figures derived from the measured step are derived again, not
        // taken from the file.
        if (t.status == "ok") {
          t.tokens_per_s = tokens_ / t.measured_s;
          t.mfu = mfu(flops_ / t.measured_s, ctx_.cluster.gpus, r_.peak_flops);
        }
      } else {
        t.status = "killed";
        t.reason = "the process died during this trial in an earlier run (tuning journal)";
        journal_->finish(trial_to_json(t));
      }
    }
    t.from_journal = true;
    r_.journal_seconds += t.seconds;
    return t;
  }
  trainer::ProfileConfig pc;
  pc.train = base_;
  pc.train.layout = cand.layout;
  pc.train.model = model_for(base_.model, cand.layout);  // (dropping at the layout's capacity factor)
  pc.train.model.moe.measured = ctx_.model.moe.measured;  // (the receive buffers as sized so far)
  pc.warmup_steps = o_.warmup_steps;
  pc.timed_steps = o_.timed_steps;
  pc.min_timed_s = o_.min_timed_s;
  pc.silence_s = o_.silence_s;
  pc.probe = o_.probe;
  if (mode == Mode::profile && o_.cut_factor > 0 && !measured_.empty())
    pc.cut_above_s = o_.cut_factor * raw_mean_of(leaders(1)[0]);
  pc.time_limit_s = o_.trial_limit_s > 0 ? o_.trial_limit_s
                                         : 10 * cand.calibrated_s * double(o_.warmup_steps + o_.timed_steps) + 30;
  for (const auto& f : faults_)
    if (f.trial == order && f.rank == control_.rank()) pc.fault = f.kind;
  const bool journaled = journal_ && mode == Mode::profile;
  if (journaled) journal_->start(text);
  t.start_s = since(start_);
  const auto m = trainer::profile_layout(pc, control_, make_groups_);
  t.status = trainer::to_string(m.status);
  t.reason = m.reason;
  t.measured_s = m.step_s;
  t.noise = m.step_noise;
  t.cut = m.cut;
  t.expert_imbalance = m.expert_imbalance;
  if (!m.dispatch_peaks.empty()) {
    t.dispatch_peaks = m.dispatch_peaks;
    t.dispatch_rows = memory::moe_routed_rows(pc.train.model, pc.train.run, cand.layout);
  }
  if (!m.expert_load.empty()) {
    const int64_t E = ctx_.model.moe.experts;
    for (int64_t i = 0; i < ctx_.model.layers; ++i)
      if (ctx_.model.moe_layer(i)) {
        t.expert_layers.push_back(i);
        t.expert_counts.emplace_back(m.expert_load.begin() + i * E, m.expert_load.begin() + (i + 1) * E);
      }
  }
  t.probe_s = m.probe_s;
  t.measured_peak = m.peak_bytes.empty() ? 0 : *std::max_element(m.peak_bytes.begin(), m.peak_bytes.end());
  t.seconds = m.seconds;
  r_.profile_seconds += m.seconds;
  ++trials_run_;
  trial_seconds_ += (m.seconds - trial_seconds_) / double(trials_run_);
  if (m.status == trainer::TrialStatus::ok) {
    t.tokens_per_s = tokens_ / m.step_s;
    t.mfu = mfu(flops_ / m.step_s, ctx_.cluster.gpus, r_.peak_flops);
  }
  if (journaled) {
    if (m.status == trainer::TrialStatus::stopped) journal_->abandon(text);
    else journal_->finish(trial_to_json(t));
  }
  return t;
}

void Search::record(const TrialRecord& t) {
  const std::string text = t.layout.to_string();
  const bool ok = t.status == "ok";
  if (ok) {
    measured_[text].emplace_back(t.measured_s, t.probe_s);
    std::vector<double> probes;
    for (const auto& x : r_.trials)
      if (x.status == "ok" && x.probe_s > 0) probes.push_back(x.probe_s);
    if (!probes.empty()) probe_ref_ = median_of(probes);
    peak_of_[text] = std::max(peak_of_[text], t.measured_peak);
    refit(false);
    fit_corrections();
  }
  // Confirmations come after the profiled trials: they are counted apart,
  // so the counter never reads past its total.
  std::string line = t.repeat ? fmt::format("[again {}] {:<58} ", confirmed_.size(), text)
                              : fmt::format("[{}/{}] {:<58} ", profiled_, limit_, text);
  if (ok)
    line += fmt::format("{} /step (predicted {}) | {:.0f} tok/s | MFU {:.2f}%", format_seconds(t.measured_s),
                        format_seconds(t.calibrated_s), t.tokens_per_s, 100 * t.mfu);
  else
    line += fmt::format("{}: {}", t.status, t.reason);
  if (t.from_journal) line += " (from the journal)";
  if (t.repeat) line += " (measured again)";
  if (t.cut) line += fmt::format(" (cut after one timed step: over {:g}x the best)", o_.cut_factor);
  if (ok && t.expert_imbalance > 0) line += fmt::format(" | experts max/mean {:.2f}", t.expert_imbalance);
  if (!measured_.empty())
    line += fmt::format(" | best MFU {:.2f}%",
                        100 * mfu(flops_ / mean_of(leaders(1)[0]), ctx_.cluster.gpus, r_.peak_flops));
  if (o_.budget_s > 0)
    line += fmt::format(" | {} left", format_seconds(std::max(0.0, o_.budget_s - since(start_))));
  say(line + "\n");
  if (o_.progress) o_.progress(profiled_, limit_);
}

void Search::run() {
  for (int64_t order = 1;; ++order) {
    // Rank 0 decides; every rank follows, so that clocks and files that
    // differ between ranks cannot split them.
    Next n;
    if (rank0_ && stop_requested()) {
      r_.stop_reason = fmt::format("stopped by {}", stop_signal_name());
      r_.stopped = true;
    }
    else if (rank0_) n = choose();
    n.pick = share(control_, n.pick);
    if (n.pick < 0) break;
    n.mode = Mode(share(control_, int64_t(n.mode)));
    SearchCandidate& cand = cands_[size_t(n.pick)];
    if (n.mode != Mode::confirm) {
      cand.done = true;
      ++profiled_;
      r_.profiled = profiled_;
    } else {
      ++r_.repeats;
    }
    shapes_tried_.insert(shape_key(cand.layout));
    r_.trials.push_back(trial(cand, order, n.mode));
    if (rank0_) record(r_.trials.back());
    if (size_buffers_ && r_.moe_dispatches.empty()) {
      // Rank 0's measurements, so that every rank evaluates the same space.
      const std::string text = share_text(control_, rank0_ ? measured_buffers() : std::string());
      std::vector<MeasuredDispatch> dispatches;
      std::istringstream in(text);
      for (MeasuredDispatch d; in >> d.rows >> d.ep >> d.factor;) dispatches.push_back(d);
      if (!dispatches.empty()) size_buffers(dispatches);
    }
  }
}

void Search::finish() {
  std::optional<size_t> best;
  if (rank0_) {
    refit(true);
    fit_corrections();
    r_.correction_noise = corrections_.noise();
    for (const auto& [l, v] : measured_)
      for (int32_t k : knobs_[index_of_.at(l)]) {
        const std::string& name = corrections_.values()[size_t(k)];
        if (std::none_of(r_.knob_effects.begin(), r_.knob_effects.end(),
                         [&](const auto& e) { return e.first == name; }))
          r_.knob_effects.emplace_back(name, corrections_.effect(name));
      }
    std::sort(r_.knob_effects.begin(), r_.knob_effects.end(),
              [](const auto& a, const auto& b) { return std::abs(a.second) > std::abs(b.second); });
    say(fmt::format("tuning stopped: {}\n", r_.stop_reason));
    // The winner's row: its last trial, carrying the mean over its trials.
    if (!measured_.empty()) {
      const auto lead = leaders(1)[0];
      for (size_t i = 0; i < r_.trials.size(); ++i)
        if (r_.trials[i].status == "ok" && r_.trials[i].layout.to_string() == lead) best = i;
      auto& w = r_.trials[*best];
      w.measured_s = raw_mean_of(lead);
      // Its memory as the buffers it ran with last: trials before the MoE
      // receive buffers were sized held the worst case's. (Read before w's
      // own is replaced.)
      int64_t peak = peak_of_[lead];
      if (!r_.moe_dispatches.empty() && *best >= size_t(r_.moe_sizing_trials)) {
        peak = 0;
        for (size_t i = size_t(r_.moe_sizing_trials); i < r_.trials.size(); ++i)
          if (r_.trials[i].status == "ok" && r_.trials[i].layout.to_string() == lead)
            peak = std::max(peak, r_.trials[i].measured_peak);
      }
      w.measured_peak = peak;
      w.tokens_per_s = tokens_ / w.measured_s;
      w.mfu = mfu(flops_ / w.measured_s, ctx_.cluster.gpus, r_.peak_flops);
      w.repeats = int64_t(measured_[lead].size());
    }
  }
  // Every rank learns the winner, and whether the tuning was stopped.
  r_.stopped = share(control_, r_.stopped ? 1 : 0) != 0;
  const int64_t w = share(control_, best ? int64_t(*best) : -1);
  if (w >= 0) r_.winner = size_t(w);
  // The winner's receive buffers as its trials held them, and the run's:
  // those, or more where its memory leaves room (every rank computes the
  // same).
  if (w >= 0 && !r_.moe_dispatches.empty()) {
    const Layout& l = r_.trials[size_t(w)].layout;
    r_.moe_sized_imbalance = ctx_.model.moe.imbalance_for(memory::moe_routed_rows(ctx_.model, ctx_.run, l), l.ep);
    r_.moe_imbalance = run_buffer_factor(ctx_, l, r_.moe_sized_imbalance);
  }
}

}  // namespace weft::tuner
