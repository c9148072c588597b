#include "tuner/tune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "core/units.h"
#include "trainer/loop.h"
#include "tuner/journal.h"

namespace weft::tuner {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Fault {
  trainer::TrialFault kind;
  int64_t trial;
  int64_t rank;
};

std::vector<Fault> faults_parse(const std::string& spec) {
  std::vector<Fault> out;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    const auto a = item.find(':'), b = item.rfind(':');
    const auto bad = [&] {
      return InputError(fmt::format("fault '{}' is not KIND:TRIAL:RANK with KIND refuse_memory, hang or die "
                                    "and TRIAL, RANK numbers",
                                    item));
    };
    if (a == std::string::npos || a == b) throw bad();
    const std::string kind = item.substr(0, a);
    Fault f{};
    if (kind == "refuse_memory") f.kind = trainer::TrialFault::refuse_memory;
    else if (kind == "hang") f.kind = trainer::TrialFault::hang;
    else if (kind == "die") f.kind = trainer::TrialFault::die;
    else throw bad();
    try {
      size_t used = 0;
      f.trial = std::stoll(item.substr(a + 1, b - a - 1), &used);
      if (used != b - a - 1) throw bad();
      f.rank = std::stoll(item.substr(b + 1), &used);
      if (used != item.size() - b - 1) throw bad();
    } catch (const std::logic_error&) {
      throw bad();
    }
    out.push_back(f);
  }
  return out;
}

}  // namespace

nlohmann::json trial_to_json(const TrialRecord& t) {
  return {{"order", t.order},
          {"layout", t.layout.to_string()},
          {"status", t.status},
          {"reason", t.reason},
          {"from_journal", t.from_journal},
          {"repeat", t.repeat},
          {"predicted_s", t.predicted_s},
          {"calibrated_s", t.calibrated_s},
          {"measured_s", t.measured_s},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"predicted_peak_bytes", t.predicted_peak},
          {"measured_peak_bytes", t.measured_peak},
          {"seconds", t.seconds}};
}

namespace {

TrialRecord record_from_json(const nlohmann::json& j, const std::string& origin) {
  try {
    TrialRecord t;
    t.order = j.at("order").get<int64_t>();
    t.layout = Layout::parse(j.at("layout").get<std::string>());
    t.status = j.at("status").get<std::string>();
    t.reason = j.value("reason", "");
    t.predicted_s = j.value("predicted_s", 0.0);
    t.calibrated_s = j.value("calibrated_s", 0.0);
    t.measured_s = j.value("measured_s", 0.0);
    t.tokens_per_s = j.value("tokens_per_s", 0.0);
    t.mfu = j.value("mfu", 0.0);
    t.predicted_peak = j.value("predicted_peak_bytes", int64_t{0});
    t.measured_peak = j.value("measured_peak_bytes", int64_t{0});
    t.seconds = j.value("seconds", 0.0);
    if (t.status != "killed") trainer::trial_status_parse(t.status);
    if (t.status == "ok" && !(t.measured_s > 0))
      throw InputError(fmt::format("an ok trial with measured_s {}", t.measured_s));
    return t;
  } catch (const std::exception& e) {
    throw FileFormatError(fmt::format("{}: trial record {} is malformed: {}", origin, j.dump(), e.what()));
  }
}

// Broadcasts rank 0's value of `v` over the control communicator.
int64_t share(parallel::Comm& control, int64_t v) {
  control.broadcast(&v, 1, 0);
  return v;
}

// Layouts that differ only in kernel knobs share a parallel shape.
std::string shape_key(const Layout& l) {
  return fmt::format("tp{}-pp{}-dp{}-mb{}-vpp{}", l.tp, l.pp, l.dp, l.mb, l.vpp);
}

}  // namespace

std::string share_text(parallel::Comm& control, const std::string& text) {
  int64_t n = int64_t(text.size());
  control.broadcast(&n, 1, 0);
  std::vector<int64_t> words(size_t((n + 7) / 8), 0);
  if (control.rank() == 0) std::memcpy(words.data(), text.data(), size_t(n));
  control.broadcast(words.data(), int64_t(words.size()), 0);
  return std::string(reinterpret_cast<const char*>(words.data()), size_t(n));
}

double duration_parse(const std::string& text) {
  const auto bad = [&] {
    return InputError(fmt::format("duration '{}' is not valid; use seconds (90), or units s, m, h as in 45s, 10m, 1h30m",
                                  text));
  };
  if (text.empty()) throw bad();
  double total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text.substr(i), &used);
    } catch (const std::logic_error&) {
      throw bad();
    }
    if (used == 0 || !(v >= 0) || !std::isfinite(v)) throw bad();
    i += used;
    double unit = 1;
    if (i < text.size()) {
      const char u = text[i];
      if (u == 's') unit = 1;
      else if (u == 'm') unit = 60;
      else if (u == 'h') unit = 3600;
      else throw bad();
      ++i;
    } else if (total > 0) {
      throw bad();  // "1h30" is ambiguous
    }
    total += v * unit;
  }
  if (!(total > 0)) throw bad();
  return total;
}

nlohmann::json tune_journal_header(const ReportContext& ctx, const SpaceLimits& limits, const TuneOptions& o) {
  (void)limits;
  return {{"model", ctx.model.name},
          {"model_hash", ctx.model.hash()},
          {"device", ctx.cluster.device.name},
          {"world", ctx.cluster.gpus},
          {"seq", ctx.run.seq},
          {"global_batch", ctx.run.global_batch},
          {"precision", to_string(ctx.run.precision)},
          {"warmup_steps", o.warmup_steps},
          {"timed_steps", o.timed_steps},
          {"min_timed_s", o.min_timed_s},
          {"weft_version", WEFT_VERSION}};
}

TuneResult tune(const ReportContext& ctx, const SpaceLimits& limits, const trainer::TrainConfig& base,
                const TuneOptions& o, parallel::Comm& control, const trainer::GroupFactory& make_groups,
                std::FILE* log) {
  const auto t_start = Clock::now();
  const bool rank0 = control.rank() == 0;
  if (o.top < 0) throw InputError(fmt::format("--tune-top {} must be at least 1", o.top));
  if (o.warmup_steps < 0 || o.timed_steps < 1)
    throw InputError(fmt::format("trial steps: warm-up {} must be >= 0 and timed {} >= 1", o.warmup_steps,
                                 o.timed_steps));
  if (!(o.silence_s > 0)) throw InputError(fmt::format("--trial-timeout {} must be positive", o.silence_s));
  const auto faults = faults_parse(o.faults);

  TuneResult r;
  const auto layouts = enumerate(ctx.model, ctx.run, ctx.cluster.gpus, limits, ctx.cluster.device.kind);
  r.space = evaluate(ctx.model, ctx.run, ctx.cluster, layouts, ctx.constants, ctx.memory);
  r.peak_flops = ctx.cluster.device.peak_flops(to_string(ctx.run.precision));

  // The candidates: fitting layouts the trainer runs, by predicted time.
  struct Cand {
    Layout layout;
    double predicted_s;
    double calibrated_s;
    int64_t peak;
    bool done = false;
  };
  std::vector<Cand> cands;
  int64_t untrainable = 0;
  for (const auto& c : r.space.candidates) {
    if (c.verdict != Verdict::fits) continue;
    try {
      trainer::check_trainable(c.layout, ctx.cluster.device.kind);
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

  // Rank 0 alone reads the journal; a bad one stops every rank with its message.
  std::optional<Journal> journal;
  int64_t bad_journal = 0;
  std::string why;
  if (rank0 && !o.journal.empty()) {
    try {
      journal.emplace(Journal::open(o.journal, tune_journal_header(ctx, limits, o)));
    } catch (const FileFormatError& e) {
      bad_journal = 2;
      why = e.what();
    } catch (const InputError& e) {
      bad_journal = 1;
      why = fmt::format("{}; --retune starts a new journal", e.what());
    }
  }
  bad_journal = share(control, bad_journal);
  if (bad_journal) {
    why = share_text(control, why);
    if (bad_journal == 2) throw FileFormatError(why);
    throw InputError(why);
  }
  const auto say = [&](const std::string& s) {
    if (log) {
      std::fputs(s.c_str(), log);
      std::fflush(log);
    }
  };
  // Trials: by default every parallel shape (up to 32) and 8 more, at least
  // 16; the first half of an explicit --tune-top explores shapes.
  std::set<std::string> all_shapes;
  for (const auto& c : cands) all_shapes.insert(shape_key(c.layout));
  const int64_t shapes = std::min<int64_t>(32, int64_t(all_shapes.size()));
  const int64_t limit = std::min<int64_t>(o.top > 0 ? o.top : std::max<int64_t>(16, shapes + 8), int64_t(cands.size()));
  const int64_t explore = o.top > 0 ? (limit + 1) / 2 : shapes;
  say(fmt::format("tuning {} on {} x {}: {} layouts evaluated, {} fit, {} candidates; profiling up to {}{} "
                  "({} warm-up + at least {} timed steps and {:g} s each)\n",
                  ctx.model.name, ctx.cluster.gpus, ctx.cluster.device.name, r.space.evaluated, r.space.fitting,
                  cands.size(), limit, o.budget_s > 0 ? fmt::format(" within {}", format_seconds(o.budget_s)) : "",
                  o.warmup_steps, o.timed_steps, o.min_timed_s));

  CostConstants k = ctx.constants;
  const double tokens = double(ctx.run.tokens_per_step());
  const double flops = model_flops_per_step(ctx.model, ctx.run);
  // A layout's measurement is the mean of its ok trials (the confirmation
  // phase measures the leaders twice).
  std::map<std::string, std::vector<double>> measured;
  auto mean_of = [&](const std::string& l) {
    const auto& v = measured.at(l);
    return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  };
  std::map<std::string, int64_t> peak_of;
  // The measured layouts by mean step, shortest first; the first is the one
  // with the least memory among those within 1% of the shortest (a tie rule
  // applied once: as a sort order it would not be transitive).
  auto leaders = [&](size_t n) {
    std::vector<std::string> ls;
    for (const auto& [l, v] : measured) ls.push_back(l);
    std::sort(ls.begin(), ls.end(), [&](const std::string& a, const std::string& b) {
      return std::make_pair(mean_of(a), a) < std::make_pair(mean_of(b), b);
    });
    if (!ls.empty()) {
      const double fastest = mean_of(ls.front());
      auto pick = ls.begin();
      for (auto it = ls.begin(); it != ls.end() && mean_of(*it) <= fastest * 1.01; ++it)
        if (peak_of[*it] < peak_of[*pick]) pick = it;
      std::rotate(ls.begin(), pick, pick + 1);
    }
    if (ls.size() > n) ls.resize(n);
    return ls;
  };
  // Refits after every measured trial at first, then whenever the measured
  // trials grew by a quarter (a fit costs time linear in them), and once at
  // the end over all of them for the report.
  size_t fitted_on = 0;
  auto refit = [&](bool final) {
    std::vector<Observation> obs;
    for (const auto& t : r.trials)
      if (t.status == "ok") obs.push_back({t.layout, t.measured_s});
    if (o.calibrate_after <= 0 || int64_t(obs.size()) < o.calibrate_after || obs.size() == fitted_on) return;
    if (!final && obs.size() > 12 && double(obs.size()) < 1.25 * double(fitted_on)) return;
    fitted_on = obs.size();
    r.calibration = calibrate(ctx.model, ctx.run, ctx.cluster, obs, ctx.constants);
    k = r.calibration->constants;
    for (auto& c : cands)
      if (!c.done) c.calibrated_s = predict(ctx.model, ctx.run, c.layout, ctx.cluster, k).step;
  };
  // The search. Layouts that share a parallel shape (tp, pp, dp, mb, vpp)
  // and differ in kernel knobs are predicted alike, so the first half of the
  // trials goes to distinct shapes, best predicted first; the rest refine the
  // three best measured shapes; then the three leaders are measured again
  // (trial noise on shared machines is several percent) and the mean decides.
  const auto& shape_of = shape_key;
  std::set<std::string> shapes_tried;
  std::set<std::string> confirmed;
  std::string main_stop;
  double trial_seconds = 0;  // mean wall time of a trial, for the budget
  int64_t trials_run = 0;

  int64_t profiled = 0;
  for (int64_t order = 1;; ++order) {
    // Rank 0 picks the next candidate (or -1 to stop) and how: 0 profile,
    // 1 the journal holds its result, 2 measure a leader again.
    int64_t pick = -1, mode = 0;
    if (rank0) {
      auto best_of = [&](auto&& allowed) {
        size_t next = cands.size();
        for (size_t i = 0; i < cands.size(); ++i)
          if (!cands[i].done && allowed(cands[i]) &&
              (next == cands.size() || cands[i].calibrated_s < cands[next].calibrated_s))
            next = i;
        return next;
      };
      const double reserve = 3 * trial_seconds;  // for the confirmations
      size_t next = cands.size();
      if (main_stop.empty()) {
        if (profiled >= limit) main_stop = fmt::format("profiled the top {}", limit);
        else if (o.budget_s > 0 && since(t_start) + reserve > o.budget_s)
          main_stop = fmt::format("time budget of {} spent", format_seconds(o.budget_s));
      }
      if (main_stop.empty()) {
        const bool exploring = profiled < explore;
        if (exploring) next = best_of([&](const Cand& c) { return !shapes_tried.count(shape_of(c.layout)); });
        if (next == cands.size()) {
          std::set<std::string> top;
          for (const auto& l : leaders(3)) top.insert(shape_of(Layout::parse(l)));
          next = best_of([&](const Cand& c) { return top.count(shape_of(c.layout)) > 0; });
        }
        if (next == cands.size()) next = best_of([](const Cand&) { return true; });
        if (next == cands.size()) {
          main_stop = "profiled every candidate";
        } else if (o.model_stop && !exploring && !measured.empty() && r.calibration && r.calibration->accepted &&
                   cands[next].calibrated_s >
                       mean_of(leaders(1)[0]) * (1 + 2 * r.calibration->rms_error_after + 0.05)) {
          main_stop = fmt::format(
              "the refit cost model (RMS error {:.1f}%) predicts the {} remaining candidates slower than the "
              "best measured by more than its error",
              100 * r.calibration->rms_error_after,
              std::count_if(cands.begin(), cands.end(), [](const Cand& c) { return !c.done; }));
          next = cands.size();
        }
      }
      if (next < cands.size()) {
        pick = int64_t(next);
        const std::string text = cands[next].layout.to_string();
        if (journal) {
          const auto unfinished = journal->unfinished();
          if (journal->result(text) || std::count(unfinished.begin(), unfinished.end(), text)) mode = 1;
        }
      } else if (o.confirm && confirmed.size() < 6 && (o.budget_s <= 0 || since(t_start) < o.budget_s)) {
        // The three leaders, then whichever layout leads after them if a
        // second measurement moved it up: the winner is never one trial.
        for (const auto& l : leaders(confirmed.size() < 3 ? 3 : 1))
          if (measured[l].size() == 1 && !confirmed.count(l)) {
            for (size_t i = 0; i < cands.size(); ++i)
              if (cands[i].layout.to_string() == l) pick = int64_t(i);
            mode = 2;
            confirmed.insert(l);
            break;
          }
      }
      if (pick < 0) r.stop_reason = main_stop;
    }
    pick = share(control, pick);
    if (pick < 0) break;
    mode = share(control, mode);
    Cand& cand = cands[size_t(pick)];
    if (mode != 2) {
      cand.done = true;
      ++profiled;
    }
    shapes_tried.insert(shape_of(cand.layout));
    TrialRecord t;
    t.order = order;
    t.layout = cand.layout;
    t.predicted_s = cand.predicted_s;
    t.calibrated_s = mode == 2 ? predict(ctx.model, ctx.run, cand.layout, ctx.cluster, k).step : cand.calibrated_s;
    t.predicted_peak = cand.peak;
    t.repeat = mode == 2;
    const std::string text = cand.layout.to_string();
    if (mode == 1) {
      if (rank0) {
        if (const auto* j = journal->result(text)) {
          t = record_from_json(*j, journal->path());
          t.order = order;
        } else {
          t.status = "killed";
          t.reason = "the process died during this trial in an earlier run (tuning journal)";
          journal->finish(trial_to_json(t));
        }
      }
      t.from_journal = true;
    } else {
      trainer::ProfileConfig pc;
      pc.train = base;
      pc.train.layout = cand.layout;
      pc.warmup_steps = o.warmup_steps;
      pc.timed_steps = o.timed_steps;
      pc.min_timed_s = o.min_timed_s;
      pc.silence_s = o.silence_s;
      pc.time_limit_s = o.trial_limit_s > 0
                            ? o.trial_limit_s
                            : 10 * cand.calibrated_s * double(o.warmup_steps + o.timed_steps) + 30;
      for (const auto& f : faults)
        if (f.trial == order && f.rank == control.rank()) pc.fault = f.kind;
      if (journal && mode == 0) journal->start(text);
      const auto m = trainer::profile_layout(pc, control, make_groups);
      t.status = trainer::to_string(m.status);
      t.reason = m.reason;
      t.measured_s = m.step_s;
      t.measured_peak = m.peak_bytes.empty() ? 0 : *std::max_element(m.peak_bytes.begin(), m.peak_bytes.end());
      t.seconds = m.seconds;
      r.profile_seconds += m.seconds;
      ++trials_run;
      trial_seconds += (m.seconds - trial_seconds) / double(trials_run);
      if (m.status == trainer::TrialStatus::ok) {
        t.tokens_per_s = tokens / m.step_s;
        t.mfu = mfu(flops / m.step_s, ctx.cluster.gpus, r.peak_flops);
      }
      if (journal && mode == 0) journal->finish(trial_to_json(t));
    }
    r.trials.push_back(t);
    if (!rank0) continue;
    const bool ok = t.status == "ok";
    if (ok) {
      measured[text].push_back(t.measured_s);
      peak_of[text] = std::max(peak_of[text], t.measured_peak);
      refit(false);
    }
    std::string line = fmt::format("[{}/{}] {:<58} ", order, limit, text);
    if (ok)
      line += fmt::format("{} /step (predicted {}) | {:.0f} tok/s | MFU {:.2f}%", format_seconds(t.measured_s),
                          format_seconds(t.calibrated_s), t.tokens_per_s, 100 * t.mfu);
    else
      line += fmt::format("{}: {}", t.status, t.reason);
    if (t.from_journal) line += " (from the journal)";
    if (t.repeat) line += " (measured again)";
    if (!measured.empty()) {
      const auto lead = leaders(1)[0];
      line += fmt::format(" | best MFU {:.2f}%", 100 * mfu(flops / mean_of(lead), ctx.cluster.gpus, r.peak_flops));
    }
    if (o.budget_s > 0) line += fmt::format(" | {} left", format_seconds(std::max(0.0, o.budget_s - since(t_start))));
    say(line + "\n");
  }
  std::optional<size_t> best;
  if (rank0) {
    refit(true);
    say(fmt::format("tuning stopped: {}\n", r.stop_reason));
    // The winner's row: its last trial, carrying the mean over its trials.
    if (!measured.empty()) {
      const auto lead = leaders(1)[0];
      for (size_t i = 0; i < r.trials.size(); ++i)
        if (r.trials[i].status == "ok" && r.trials[i].layout.to_string() == lead) best = i;
      auto& w = r.trials[*best];
      w.measured_s = mean_of(lead);
      w.measured_peak = peak_of[lead];
      w.tokens_per_s = tokens / w.measured_s;
      w.mfu = mfu(flops / w.measured_s, ctx.cluster.gpus, r.peak_flops);
      w.repeats = int64_t(measured[lead].size());
    }
  }
  // Every rank learns the winner.
  const int64_t w = share(control, best ? int64_t(*best) : -1);
  if (w >= 0) r.winner = size_t(w);
  r.seconds = since(t_start);
  return r;
}

}  // namespace weft::tuner
