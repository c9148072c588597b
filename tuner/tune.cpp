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
#include "core/json_io.h"
#include "core/units.h"
#include "memory/shapes.h"
#include "trainer/loop.h"
#include "tuner/journal.h"
#include "tuner/tune_search.h"

namespace weft::tuner {

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

nlohmann::json trial_to_json(const TrialRecord& t) {
  nlohmann::json j{{"order", t.order},
          {"layout", t.layout.to_string()},
          {"status", t.status},
          {"reason", t.reason},
          {"from_journal", t.from_journal},
          {"repeat", t.repeat},
          {"cut", t.cut},
          {"expert_imbalance", t.expert_imbalance},
          {"predicted_s", t.predicted_s},
          {"calibrated_s", t.calibrated_s},
          {"measured_s", t.measured_s},
          {"noise", t.noise},
          {"probe_s", t.probe_s},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"predicted_peak_bytes", t.predicted_peak},
          {"measured_peak_bytes", t.measured_peak},
          {"seconds", t.seconds}};
  // Only trials run by this tuning have a start in its time; the journal's
  // ran in an earlier process.
  if (t.start_s >= 0) j["start_s"] = t.start_s;
  if (!t.expert_layers.empty()) j["expert_load"] = {{"layers", t.expert_layers}, {"counts", t.expert_counts}};
  if (!t.dispatch_peaks.empty()) {
    nlohmann::json peaks = nlohmann::json::object();
    for (size_t d = 2; d < t.dispatch_peaks.size(); ++d)
      if (t.dispatch_peaks[d] > 0) peaks[std::to_string(d)] = t.dispatch_peaks[d];
    j["dispatch_peaks"] = peaks;
    j["dispatch_rows"] = t.dispatch_rows;
  }
  return j;
}

TrialRecord record_from_json(const nlohmann::json& j, const std::string& origin) {
  try {
    TrialRecord t;
    t.order = json_integer(j, "order", "trial record");
    t.layout = Layout::parse(j.at("layout").get<std::string>());
    t.status = j.at("status").get<std::string>();
    t.reason = j.value("reason", "");
    t.predicted_s = j.value("predicted_s", 0.0);
    t.calibrated_s = j.value("calibrated_s", 0.0);
    t.measured_s = j.value("measured_s", 0.0);
    t.noise = j.value("noise", 0.0);  // journals written before these have none
    t.cut = j.value("cut", false);
    t.expert_imbalance = j.value("expert_imbalance", 0.0);
    if (j.contains("dispatch_peaks")) {
      const auto& p = j.at("dispatch_peaks");
      bool ok = p.is_object();
      for (auto it = p.begin(); ok && it != p.end(); ++it) {
        size_t used = 0;
        int64_t d = 0;
        try {
          d = std::stoll(it.key(), &used);
        } catch (const std::exception&) {
          ok = false;
          break;
        }
        ok = used == it.key().size() && d >= 2 && d <= kMaxExperts && it.value().is_number() &&
             it.value().get<double>() >= 0 && std::isfinite(it.value().get<double>());
        if (!ok) break;
        t.dispatch_peaks.resize(std::max(t.dispatch_peaks.size(), size_t(d + 1)), 0.0);
        t.dispatch_peaks[size_t(d)] = it.value().get<double>();
      }
      if (!ok)
        throw InputError(fmt::format("field 'dispatch_peaks' must map ep degrees (whole numbers from 2 to {}) to "
                                     "peaks (numbers >= 0); got {}",
                                     kMaxExperts, p.dump()));
      t.dispatch_rows = json_integer(j, "dispatch_rows", "trial record");
      if (t.dispatch_rows < 1)
        throw InputError(fmt::format("field 'dispatch_rows' must be at least 1, got {}", t.dispatch_rows));
    }
    if (j.contains("expert_load")) {
      const auto& e = j.at("expert_load");
      t.expert_layers = e.at("layers").get<std::vector<int64_t>>();
      t.expert_counts = e.at("counts").get<std::vector<std::vector<int64_t>>>();
      bool ok = t.expert_counts.size() == t.expert_layers.size();
      for (size_t i = 0; ok && i < t.expert_counts.size(); ++i) {
        ok = t.expert_layers[i] >= 0 && !t.expert_counts[i].empty() &&
             t.expert_counts[i].size() == t.expert_counts[0].size();
        for (const int64_t c : t.expert_counts[i]) ok = ok && c >= 0;
      }
      if (!ok)
        throw InputError(fmt::format("field 'expert_load' must hold 'layers' (MoE layer indices) and 'counts', a "
                                     "row of every expert's tokens (whole numbers >= 0, one length) for each layer; "
                                     "got {}",
                                     e.dump()));
    }
    t.probe_s = j.value("probe_s", 0.0);
    t.tokens_per_s = j.value("tokens_per_s", 0.0);
    t.mfu = j.value("mfu", 0.0);
    t.predicted_peak = j.contains("predicted_peak_bytes") ? json_integer(j, "predicted_peak_bytes", "trial record") : 0;
    t.measured_peak = j.contains("measured_peak_bytes") ? json_integer(j, "measured_peak_bytes", "trial record") : 0;
    t.seconds = j.value("seconds", 0.0);
    if (t.status != "killed") trainer::trial_status_parse(t.status);
    for (const auto& [name, v] : {std::pair<const char*, double>{"predicted_s", t.predicted_s},
                                  {"calibrated_s", t.calibrated_s},
                                  {"measured_s", t.measured_s},
                                  {"noise", t.noise},
                                  {"expert_imbalance", t.expert_imbalance},
                                  {"probe_s", t.probe_s},
                                  {"tokens_per_s", t.tokens_per_s},
                                  {"mfu", t.mfu},
                                  {"predicted_peak_bytes", double(t.predicted_peak)},
                                  {"measured_peak_bytes", double(t.measured_peak)},
                                  {"seconds", t.seconds}})
      if (!(v >= 0 && std::isfinite(v)))
        throw InputError(fmt::format("field '{}' must be a finite number >= 0, got {}", name, v));
    // A timed step below a microsecond or above a day is not a measurement
    // (a hand edit, a damaged file): it would make its layout win, with an
    // MFU past 100%, or lose, for nothing.
    if (t.status == "ok" && !(t.measured_s >= kMinStepSeconds && t.measured_s <= kMaxStepSeconds))
      throw InputError(fmt::format("field 'measured_s' of an ok trial is {:g}; a timed step takes from {:g} to {:g} "
                                   "seconds",
                                   t.measured_s, kMinStepSeconds, kMaxStepSeconds));
    return t;
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(fmt::format("{}: trial record {} is malformed: {}", origin, j.dump(), json_error_text(e)));
  } catch (const std::exception& e) {
    throw FileFormatError(fmt::format("{}: trial record {} is malformed: {}", origin, j.dump(), e.what()));
  }
}

// Broadcasts rank 0's value of `v` over the control communicator.
int64_t share(parallel::Comm& control, int64_t v) {
  control.broadcast(&v, 1, 0);
  return v;
}

std::string shape_key(const Layout& l) {
  return fmt::format("tp{}-cp{}:{}-pp{}-dp{}{}-mb{}-vpp{}-{}{}", l.tp, l.cp, to_string(l.cp_comm), l.pp, l.dp,
                     l.ep > 1 ? fmt::format("-ep{}{}:{}", l.ep, l.ep_fold ? "fold" : "", to_string(l.dispatch)) : "", l.mb, l.vpp,
                     gemm_precision_text(l), l.uneven() ? "-split:" + split_text(l.split) : "");
}

std::string share_text(parallel::Comm& control, const std::string& text) {
  int64_t n = int64_t(text.size());
  control.broadcast(&n, 1, 0);
  std::vector<int64_t> words(size_t((n + 7) / 8), 0);
  if (n == 0) return {};  // nothing to send (and memcpy from an empty vector's null data is undefined)
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

nlohmann::json tune_journal_header(const SpaceContext& ctx, const SpaceLimits& limits, const TuneOptions& o) {
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

TuneResult tune(const SpaceContext& ctx, const SpaceLimits& limits, const trainer::TrainConfig& base,
                const TuneOptions& o, parallel::Comm& control, const trainer::GroupFactory& make_groups,
                std::FILE* log) {
  const auto t_start = Clock::now();
  if (o.top < 0) throw InputError(fmt::format("--tune-top {} must be at least 1", o.top));
  if (o.warmup_steps < 0 || o.timed_steps < 1)
    throw InputError(fmt::format("trial steps: warm-up {} must be >= 0 and timed {} >= 1", o.warmup_steps,
                                 o.timed_steps));
  if (!(o.silence_s > 0)) throw InputError(fmt::format("--trial-timeout {} must be positive", o.silence_s));
  const auto faults = faults_parse(o.faults);

  TuneResult r;
  auto candidates = search_candidates(ctx, limits, r);
  auto journal = open_journal(ctx, limits, o, control);
  Search search(ctx, limits, o, base, control, make_groups, log, std::move(journal), faults,
                std::move(candidates), r, t_start);
  search.run();
  search.finish();
  r.seconds = since(t_start);
  return r;
}

std::vector<MeasuredDispatch> measured_dispatches(const std::vector<TrialRecord>& trials) {
  std::map<std::pair<int64_t, int64_t>, double> most;  // (rows, ep) -> peak
  for (const auto& t : trials) {
    if (t.status != "ok") continue;
    for (size_t d = 2; d < t.dispatch_peaks.size(); ++d)
      if (t.dispatch_peaks[d] > 0) {
        double& p = most[{t.dispatch_rows, int64_t(d)}];
        p = std::max(p, t.dispatch_peaks[d]);
      }
  }
  std::vector<MeasuredDispatch> out;
  for (const auto& [at, peak] : most)
    out.push_back({at.first, at.second, std::clamp(std::ceil(100 * kBufferMargin * peak) / 100, 1.0, kMaxImbalance)});
  return out;
}

double run_buffer_factor(const SpaceContext& ctx, const Layout& l, double sized) {
  if (sized <= 0 || l.ep <= 1) return sized;
  ModelSpec m = model_for(ctx.model, l);
  m.moe.measured.clear();
  const int64_t rows = memory::moe_routed_rows(m, ctx.run, l);
  if (rows <= 0) return sized;
  // In hundredths: the worst case's factor, rounded up (it caps the rows).
  const int64_t worst = int64_t(std::ceil(100.0 * double(m.moe.received_rows_worst(rows, l.ep)) /
                                          double(rows * m.moe.top_k)));
  const auto fits = [&](int64_t hundredths) {
    m.moe.imbalance = double(hundredths) / 100;
    return evaluate_one(m, ctx.run, ctx.cluster, l, ctx.constants, ctx.memory).verdict == Verdict::fits;
  };
  int64_t lo = int64_t(std::llround(100 * sized)), hi = worst;
  if (hi <= lo) return sized;
  if (fits(hi)) return double(hi) / 100;
  // More buffer never takes less memory: lo fits (the winner's trials ran
  // at it), hi does not.
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return std::max(sized, double(lo) / 100);
}

Recipe tune_recipe(const TuneResult& r, const SpaceContext& ctx, const std::string& machine) {
  if (!r.winner) throw InputError("no trial succeeded, so there is no layout to save as a recipe");
  if (r.stopped)
    throw InputError(fmt::format("the tuning was {} after {} trials, so its best layout is no recipe to reuse",
                                 r.stop_reason, r.trials.size()));
  const auto& w = r.trials[*r.winner];
  ModelSpec m = model_for(ctx.model, w.layout);
  if (r.moe_imbalance > 0) m.moe.imbalance = r.moe_imbalance;  // (the buffers the tuning sized)
  m.moe.measured.clear();
  Recipe rc = recipe_for(m, ctx.cluster, ctx.run, w.layout, "profiled");
  rc.machine = machine;
  // The run's memory: more than the winner's trials where its receive
  // buffers hold more (run_buffer_factor).
  const int64_t peak = r.moe_imbalance > r.moe_sized_imbalance && r.moe_sized_imbalance > 0
                           ? evaluate_one(m, ctx.run, ctx.cluster, w.layout, ctx.constants, ctx.memory).memory.peak()
                           : w.predicted_peak;
  rc.predicted = {{"step_s", w.predicted_s},
                  {"step_s_refit", w.calibrated_s},
                  {"peak_bytes", peak}};
  rc.measured = {{"step_s", w.measured_s},
                 {"tokens_per_s", w.tokens_per_s},
                 {"mfu", w.mfu},
                 {"peak_flops", r.peak_flops},
                 {"peak_bytes", w.measured_peak}};
  int64_t ok = 0;
  for (const auto& t : r.trials) ok += t.status == "ok";
  rc.tuning = {{"evaluated", r.space.evaluated},
               {"fitting", r.space.fitting},
               {"candidates", r.candidates},
               {"pruned", r.space.pruned},
               {"trials", r.trials.size()},
               {"trials_ok", ok},
               {"profile_seconds", r.profile_seconds},
               {"stop_reason", r.stop_reason}};
  if (r.moe_imbalance > 0)
    rc.tuning["moe_buffers"] = {{"imbalance", r.moe_imbalance},
                                {"sized", r.moe_sized_imbalance},
                                {"trials", r.moe_sizing_trials},
                                {"margin", kBufferMargin}};
  if (r.calibration)
    rc.tuning["cost_model_rms_error"] = {{"before", r.calibration->rms_error_before},
                                         {"after", r.calibration->rms_error_after}};
  return rc;
}

}  // namespace weft::tuner
