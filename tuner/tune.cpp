#include "tuner/tune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
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

nlohmann::json record_to_json(const TrialRecord& t) {
  return {{"order", t.order},
          {"layout", t.layout.to_string()},
          {"status", t.status},
          {"reason", t.reason},
          {"predicted_s", t.predicted_s},
          {"calibrated_s", t.calibrated_s},
          {"measured_s", t.measured_s},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"predicted_peak_bytes", t.predicted_peak},
          {"measured_peak_bytes", t.measured_peak},
          {"seconds", t.seconds}};
}

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
  if (o.top < 1) throw InputError(fmt::format("--tune-top {} must be at least 1", o.top));
  if (o.warmup_steps < 0 || o.timed_steps < 1)
    throw InputError(fmt::format("trial steps: warm-up {} must be >= 0 and timed {} >= 1", o.warmup_steps,
                                 o.timed_steps));
  if (!(o.silence_s > 0)) throw InputError(fmt::format("--trial-timeout {} must be positive", o.silence_s));
  const auto faults = faults_parse(o.faults);

  TuneResult r;
  const auto layouts = enumerate(ctx.model, ctx.run, ctx.cluster.gpus, limits);
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
      trainer::check_trainable(c.layout, ctx.model);
    } catch (const LayoutError&) {
      ++untrainable;
      continue;
    }
    cands.push_back({c.layout, c.cost.step, c.cost.step, c.memory.peak()});
  }
  r.candidates = int64_t(cands.size());
  if (cands.empty())
    throw InputError(fmt::format("no layout of {} on {} x {} fits and is trainable ({} evaluated, {} fit, {} "
                                 "need trainer features not built yet); see `weft tune --dry-run`",
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
  const int64_t limit = std::min<int64_t>(o.top, int64_t(cands.size()));
  say(fmt::format("tuning {} on {} x {}: {} layouts evaluated, {} fit, {} candidates; profiling up to {}{} "
                  "({} warm-up + at least {} timed steps and {:g} s each)\n",
                  ctx.model.name, ctx.cluster.gpus, ctx.cluster.device.name, r.space.evaluated, r.space.fitting,
                  cands.size(), limit, o.budget_s > 0 ? fmt::format(" within {}", format_seconds(o.budget_s)) : "",
                  o.warmup_steps, o.timed_steps, o.min_timed_s));

  CostConstants k = ctx.constants;
  std::optional<size_t> best;  // index into r.trials
  const double tokens = double(ctx.run.tokens_per_step());
  const double flops = model_flops_per_step(ctx.model, ctx.run);
  auto better = [&](const TrialRecord& a, const TrialRecord& b) {
    // Highest MFU (the shortest step); within 1%, the one with less memory.
    if (a.measured_s < b.measured_s * 0.99) return true;
    if (b.measured_s < a.measured_s * 0.99) return false;
    return a.measured_peak < b.measured_peak;
  };
  auto refit = [&] {
    std::vector<Observation> obs;
    for (const auto& t : r.trials)
      if (t.status == "ok") obs.push_back({t.layout, t.measured_s});
    if (int64_t(obs.size()) < o.calibrate_after || o.calibrate_after <= 0) return;
    r.calibration = calibrate(ctx.model, ctx.run, ctx.cluster, obs, ctx.constants);
    k = r.calibration->constants;
    for (auto& c : cands)
      if (!c.done) c.calibrated_s = predict(ctx.model, ctx.run, c.layout, ctx.cluster, k).step;
  };

  int64_t profiled = 0;
  for (int64_t order = 1;; ++order) {
    // Rank 0 picks the next candidate (or -1 to stop) and whether the journal
    // already holds its result (then nobody runs it).
    int64_t pick = -1, known = 0;
    if (rank0) {
      size_t next = cands.size();
      for (size_t i = 0; i < cands.size(); ++i)
        if (!cands[i].done && (next == cands.size() || cands[i].calibrated_s < cands[next].calibrated_s)) next = i;
      if (profiled >= limit) {
        r.stop_reason = fmt::format("profiled the top {}", limit);
      } else if (next == cands.size()) {
        r.stop_reason = "profiled every candidate";
      } else if (o.budget_s > 0 && since(t_start) > o.budget_s) {
        r.stop_reason = fmt::format("time budget of {} spent", format_seconds(o.budget_s));
      } else if (best && r.calibration && r.calibration->accepted &&
                 cands[next].calibrated_s >
                     r.trials[*best].measured_s * (1 + 2 * r.calibration->rms_error_after + 0.05)) {
        r.stop_reason = fmt::format(
            "the refit cost model (RMS error {:.1f}%) predicts the {} remaining candidates slower than the best "
            "measured by more than its error",
            100 * r.calibration->rms_error_after,
            std::count_if(cands.begin(), cands.end(), [](const Cand& c) { return !c.done; }));
      } else {
        pick = int64_t(next);
        const std::string text = cands[next].layout.to_string();
        if (journal) {
          const auto unfinished = journal->unfinished();
          if (journal->result(text) || std::count(unfinished.begin(), unfinished.end(), text)) known = 1;
        }
      }
    }
    pick = share(control, pick);
    if (pick < 0) break;
    known = share(control, known);
    Cand& cand = cands[size_t(pick)];
    cand.done = true;
    ++profiled;
    TrialRecord t;
    t.order = order;
    t.layout = cand.layout;
    t.predicted_s = cand.predicted_s;
    t.calibrated_s = cand.calibrated_s;
    t.predicted_peak = cand.peak;
    const std::string text = cand.layout.to_string();
    if (known) {
      if (rank0) {
        if (const auto* j = journal->result(text)) {
          t = record_from_json(*j, journal->path());
          t.order = order;
        } else {
          t.status = "killed";
          t.reason = "the process died during this trial in an earlier run (tuning journal)";
          journal->finish(record_to_json(t));
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
      if (journal) journal->start(text);
      const auto m = trainer::profile_layout(pc, control, make_groups);
      t.status = trainer::to_string(m.status);
      t.reason = m.reason;
      t.measured_s = m.step_s;
      t.measured_peak = m.peak_bytes.empty() ? 0 : *std::max_element(m.peak_bytes.begin(), m.peak_bytes.end());
      t.seconds = m.seconds;
      r.profile_seconds += m.seconds;
      if (m.status == trainer::TrialStatus::ok) {
        t.tokens_per_s = tokens / m.step_s;
        t.mfu = mfu(flops / m.step_s, ctx.cluster.gpus, r.peak_flops);
      }
      if (journal) journal->finish(record_to_json(t));
    }
    r.trials.push_back(t);
    if (!rank0) continue;
    const bool ok = t.status == "ok";
    if (ok && (!best || better(t, r.trials[*best]))) best = r.trials.size() - 1;
    if (ok) refit();
    std::string line = fmt::format("[{}/{}] {:<58} ", order, limit, text);
    if (ok)
      line += fmt::format("{} /step (predicted {}) | {:.0f} tok/s | MFU {:.2f}%", format_seconds(t.measured_s),
                          format_seconds(t.calibrated_s), t.tokens_per_s, 100 * t.mfu);
    else
      line += fmt::format("{}: {}", t.status, t.reason);
    if (t.from_journal) line += " (from the journal)";
    if (best) line += fmt::format(" | best MFU {:.2f}%", 100 * r.trials[*best].mfu);
    if (o.budget_s > 0) line += fmt::format(" | {} left", format_seconds(std::max(0.0, o.budget_s - since(t_start))));
    say(line + "\n");
  }
  if (rank0) say(fmt::format("tuning stopped: {}\n", r.stop_reason));
  // Every rank learns the winner.
  const int64_t w = share(control, best ? int64_t(*best) : -1);
  if (w >= 0) r.winner = size_t(w);
  r.seconds = since(t_start);
  return r;
}

}  // namespace weft::tuner
