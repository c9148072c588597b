// The tuning report and the recipe of its winner.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/units.h"
#include "report/tune_report.h"

#include "core/flops.h"

namespace weft::report {

using namespace weft::tuner;  // the spaces, trials and contexts a report describes

namespace {

std::string percent_error(double predicted, double measured) {
  if (!(measured > 0) || !(predicted > 0)) return "";
  return fmt::format("{:+.1f}%", 100 * (predicted / measured - 1));
}

}  // namespace

std::string tune_report_md(const TuneResult& r, const SpaceContext& ctx) {
  std::string s = fmt::format("# Tuning {} on {} x {}\n\n", ctx.model.name, ctx.cluster.gpus,
                              ctx.cluster.device.summary());
  s += fmt::format("seq {}, global batch {}, {}; MFU against {:.1f} GFLOP/s per device{}.\n\n", ctx.run.seq,
                   ctx.run.global_batch, to_string(ctx.run.precision), r.peak_flops / 1e9,
                   ctx.cluster.device.has_fp8() ? fmt::format(" (the dense bf16 peak, for FP8 layouts too: not the {:.0f} "
                                                              "GFLOP/s FP8 peak)",
                                                              ctx.cluster.device.peak_fp8_flops / 1e9)
                                                : "");
  if (ctx.run.lora.enabled())
    s += lora_summary(ctx.model, ctx.run.lora) + "; MFU counts the FLOPs a LoRA step needs (4N, no weight gradients of "
         "frozen weights, plus the attention and the adapters).\n\n";
  s += fmt::format("{} layouts evaluated, {} fit the memory model, {} candidates the trainer runs; "
                   "{} trials in {} (tuning {} in all): {} of the candidates profiled{}{}. Stopped: {}.\n\n",
                   r.space.evaluated, r.space.fitting, r.candidates, r.trials.size(),
                   format_seconds(r.profile_seconds), format_seconds(r.seconds), r.profiled,
                   r.repeats > 0 ? fmt::format(", {} leaders measured again", r.repeats) : "",
                   r.journal_seconds > 0
                       ? fmt::format(", trials taken from the journal took {} when they ran",
                                     format_seconds(r.journal_seconds))
                       : "",
                   r.stop_reason);
  if (!r.space.pruned.empty()) {
    s += "Pruned before profiling:\n\n| reason | layouts |\n|---|---:|\n";
    for (const auto& [why, n] : r.space.pruned) s += fmt::format("| {} | {} |\n", why, n);
    s += "\n";
  }
  s += "Columns: *predicted* is the cost model with the device's constants; *refit* is the model refit to the "
       "trials measured before this one, which chose the order; *error* is refit / measured - 1, so + means "
       "the model expected a slower step than was measured.\n\n";
  s += "| # | layout | GEMMs | status | predicted | refit | measured | error | tokens/s | MFU | memory predicted | "
       "memory measured |\n|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < r.trials.size(); ++i) {
    const auto& t = r.trials[i];
    const bool ok = t.status == "ok";
    s += fmt::format("| {} | `{}`{} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} |\n", t.order,
                     t.layout.to_string(), r.winner && *r.winner == i ? " **winner**" : "", (t.layout.fp8 == Fp8Recipe::off ? std::string(to_string(ctx.run.precision)) : gemm_precision_text(t.layout)),
                     t.repeat ? t.status + " (again)" : t.cut ? t.status + " (cut: one timed step)" : t.status,
                     t.status == "ok" || t.reason.empty() ? "" : ": " + t.reason, format_seconds(t.predicted_s),
                     format_seconds(t.calibrated_s), ok ? format_seconds(t.measured_s) : "-",
                     ok ? percent_error(t.calibrated_s, t.measured_s) : "-",
                     ok ? fmt::format("{:.0f}", t.tokens_per_s) : "-",
                     ok ? fmt::format("{:.2f}%", 100 * t.mfu) : "-", format_bytes(double(t.predicted_peak)),
                     t.measured_peak > 0 ? format_bytes(double(t.measured_peak)) : "-");
  }
  s += "\n";
  if (ctx.model.moe.enabled()) {
    // How unevenly the routers spread the trials' tokens: what sizes an
    // expert's rows past the balanced share (and what a capacity drops).
    std::vector<double> v;
    const TrialRecord* worst = nullptr;
    for (const auto& t : r.trials)
      if (t.status == "ok" && t.expert_imbalance > 0) {
        v.push_back(t.expert_imbalance);
        if (!worst || t.expert_imbalance > worst->expert_imbalance) worst = &t;
      }
    if (worst) {
      std::sort(v.begin(), v.end());
      s += fmt::format("Experts' loads in the trials: in the worst MoE layer the busiest expert took {:.2f}x its "
                       "layer's mean tokens at the median trial, {:.2f}x at most (trial {}); balanced routing is "
                       "1x.\n\n",
                       v[v.size() / 2], worst->expert_imbalance, worst->order);
    }
    if (!r.moe_dispatches.empty()) {
      std::vector<std::string> by_ep;
      for (const MeasuredDispatch& d : r.moe_dispatches)
        by_ep.push_back(fmt::format("ep{} at {} rows a rank {:g}x", d.ep, d.rows, d.factor));
      const TrialRecord* w = r.winner ? &r.trials[*r.winner] : nullptr;
      s += fmt::format(
          "Expert-parallel receive buffers: sized from the dispatches of the first {} trials, {:g} x the most "
          "choices of one micro-batch that an ep rank's experts took, over the balanced share, instead of the "
          "worst case (every choice a rank can receive): {}. A layout routing fewer rows a rank than every "
          "trial at its ep degree keeps the worst case. {} candidates fit so, {} with the worst case's buffers; "
          "the later trials ran with them. {} A micro-batch routed past the buffers stops the run with its count "
          "(`--moe-imbalance` pins one factor, 0 the worst case).\n\n",
          r.moe_sizing_trials, kBufferMargin, fmt::join(by_ep, ", "), r.candidates, r.moe_worst_candidates,
          r.moe_imbalance > r.moe_sized_imbalance
              ? fmt::format("The winner's trials held {:g}x; the run holds {:g}x, the most its memory leaves room for "
                            "up to the worst case, since routing moves further as the routers learn.",
                            r.moe_sized_imbalance, r.moe_imbalance)
          : r.moe_imbalance > 0 ? fmt::format("The run holds the winner's, {:g}x (its memory has no room for more).",
                                              r.moe_imbalance)
          : w && w->layout.ep > 1 ? std::string("No trial routed as few rows as the winner, so the run keeps the worst case.")
                                  : std::string("The winner has no expert parallelism."));
    }
    // The winner's own: each MoE layer's busiest expert over its mean.
    const TrialRecord* w = r.winner ? &r.trials[*r.winner] : nullptr;
    if (w && !w->expert_layers.empty()) {
      std::vector<std::string> per_layer;
      for (size_t i = 0; i < w->expert_layers.size(); ++i) {
        const auto& c = w->expert_counts[i];
        int64_t sum = 0, most = 0;
        for (const int64_t n : c) {
          sum += n;
          most = std::max(most, n);
        }
        per_layer.push_back(fmt::format("{} {}", w->expert_layers[i],
                                        sum > 0 ? fmt::format("{:.2f}x", double(most) * double(c.size()) / double(sum))
                                                : std::string("-")));
      }
      s += fmt::format("The winner's trial, busiest expert over its layer's mean, by MoE layer: {}.\n\n",
                       fmt::join(per_layer, ", "));
    }
  }
  if (r.calibration) {
    const auto& c = *r.calibration;
    s += fmt::format("Cost model against all {} measured steps, refit once more at the end: RMS error {:.1f}% "
                     "with the device defaults, {:.1f}% after the least-squares refit of {} ({}). (A figure "
                     "printed while tuning covers the trials measured by then.)\n\n",
                     c.error_before.size(), 100 * c.rms_error_before, 100 * c.rms_error_after,
                     fmt::join(c.fitted, ", "), c.accepted ? "accepted" : "rejected: no better than the defaults");
  } else {
    s += "Cost model: too few measured trials to refit.\n\n";
  }
  if (!r.knob_effects.empty()) {
    // The five largest, as the factor each knob value's steps took against
    // the refit model's prediction.
    std::vector<std::string> effects;
    for (size_t i = 0; i < r.knob_effects.size() && i < 5; ++i)
      effects.push_back(fmt::format("{} {:+.1f}%", r.knob_effects[i].first,
                                    100 * std::expm1(r.knob_effects[i].second)));
    s += fmt::format("Corrections learnt per knob value on top of the refit (measured against predicted, the "
                     "largest): {}; spread left {:.1f}%.\n\n",
                     fmt::join(effects, ", "), 100 * r.correction_noise);
  }
  if (r.stopped) {
    s += fmt::format("The tuning was {} before it finished: no recipe was saved. Running the same command again "
                     "continues it from the journal.\n\n",
                     r.stop_reason);
  }
  if (r.winner) {
    const auto& w = r.trials[*r.winner];
    s += fmt::format("{}: `{}` (GEMMs {}): {} per step ({}), {:.0f} tokens/s, MFU {:.2f}%, peak memory {} "
                     "per rank.\n",
                     r.stopped ? "Best so far" : "Winner", w.layout.to_string(), (w.layout.fp8 == Fp8Recipe::off ? std::string(to_string(ctx.run.precision)) : gemm_precision_text(w.layout)),
                     format_seconds(w.measured_s),
                     w.repeats == 1 ? std::string("one trial") : fmt::format("mean of {} trials", w.repeats), w.tokens_per_s, 100 * w.mfu,
                     format_bytes(double(w.measured_peak)));
  } else {
    s += "No trial succeeded.\n";
  }
  return s;
}

nlohmann::json tune_report_json(const TuneResult& r, const SpaceContext& ctx) {
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : r.trials) {
    trials.push_back(trial_to_json(t));
    trials.back()["gemm_precision"] = (t.layout.fp8 == Fp8Recipe::off ? std::string(to_string(ctx.run.precision)) : gemm_precision_text(t.layout));
  }
  nlohmann::json j{{"model", ctx.model.name},
                   {"model_hash", ctx.model.hash()},
                   {"device", ctx.cluster.device.name},
                   {"world", ctx.cluster.gpus},
                   {"seq", ctx.run.seq},
                   {"global_batch", ctx.run.global_batch},
                   {"peak_flops", r.peak_flops},
                   {"evaluated", r.space.evaluated},
                   {"fitting", r.space.fitting},
                   {"candidates", r.candidates},
                   {"pruned", r.space.pruned},
                   {"trials", trials},
                   {"stop_reason", r.stop_reason},
                   {"stopped", r.stopped},
                   {"profiled", r.profiled},
                   {"repeats", r.repeats},
                   {"profile_seconds", r.profile_seconds},
                   {"journal_seconds", r.journal_seconds},
                   {"correction_noise", r.correction_noise},
                   {"knob_effects", r.knob_effects},
                   {"seconds", r.seconds},
                   {"winner", r.winner ? nlohmann::json(r.trials[*r.winner].layout.to_string()) : nlohmann::json()}};
  if (!r.moe_dispatches.empty()) {
    nlohmann::json d = nlohmann::json::array();
    for (const MeasuredDispatch& m : r.moe_dispatches) d.push_back({{"rows", m.rows}, {"ep", m.ep}, {"factor", m.factor}});
    j["moe_buffers"] = {{"dispatches", d},
                        {"imbalance", r.moe_imbalance},
                        {"sized", r.moe_sized_imbalance},
                        {"trials", r.moe_sizing_trials},
                        {"margin", kBufferMargin},
                        {"candidates_worst_case", r.moe_worst_candidates}};
  }
  if (r.calibration) {
    const auto& c = *r.calibration;
    j["calibration"] = {{"observations", c.error_before.size()},
                        {"rms_error_before", c.rms_error_before},
                        {"rms_error_after", c.rms_error_after},
                        {"fitted", c.fitted},
                        {"accepted", c.accepted},
                        {"constants", c.constants}};
  }
  return j;
}

}  // namespace weft::report
