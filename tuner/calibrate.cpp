// Least-squares calibration of the cost constants. The residual of an
// observation is log(predicted / measured): step times span orders of
// magnitude across layouts, and a relative residual weighs a 10 ms and a 10 s
// step alike. predict() is a few hundred nanoseconds, so a fit of tens of
// observations over hundreds of evaluations takes milliseconds.
#include "tuner/calibrate.h"

#include <algorithm>
#include <deque>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlopt.hpp>

#include "core/error.h"

namespace weft::tuner {

const std::vector<CalibrationParam>& calibration_params() {
  // Ordered by how much of a typical step each constant scales: GEMMs
  // dominate, then attention, streaming kernels, intra-node collectives, the
  // per-kernel launch cost, inter-node collectives, and the overlap terms
  // that only shift the exposed part of communication.
  static const std::vector<CalibrationParam> params = {
      {"gemm_efficiency", &CostConstants::gemm_efficiency, 0.01, 1.0, true},
      {"flash_efficiency", &CostConstants::flash_efficiency, 0.01, 1.0, true},
      {"cudnn_efficiency", &CostConstants::cudnn_efficiency, 0.01, 1.0, true},
      {"memory_efficiency", &CostConstants::memory_efficiency, 0.01, 1.0, true},
      {"intra_efficiency", &CostConstants::intra_efficiency, 0.01, 1.0, true},
      {"launch_overhead", &CostConstants::launch_overhead, 1e-7, 1e-3, true},
      {"inter_efficiency", &CostConstants::inter_efficiency, 0.01, 1.0, true},
      {"dp_overlap", &CostConstants::dp_overlap, 0.0, 1.0, false},
      {"tp_overlap", &CostConstants::tp_overlap, 0.0, 1.0, false},
      {"overlap_cost", &CostConstants::overlap_cost, 0.0, 1.0, false},
      {"fp8_gemm_efficiency", &CostConstants::fp8_gemm_efficiency, 0.01, 1.0, true},
      {"expert_gemm_efficiency", &CostConstants::expert_gemm_efficiency, 0.1, 1.0, true},
      {"fp8_expert_gemm_efficiency", &CostConstants::fp8_expert_gemm_efficiency, 0.1, 1.0, true},
      {"dispatch_efficiency", &CostConstants::dispatch_efficiency, 0.1, 2.0, true},
  };
  return params;
}

namespace {

// Initial trust-region steps in the optimizer's coordinates: ~20% of a rate
// in log space, a tenth of a fraction's range.
constexpr double kLogStep = 0.2;
constexpr double kLinearStep = 0.1;
// Probe used to find the constants that move no prediction.
constexpr double kProbe = 0.05;
// A constant whose probe changes no log prediction by more than this per
// unit of its coordinate is left out of the fit.
constexpr double kMinInfluence = 1e-6;
// Restarts of the optimizer from its best point, and the relative fall of
// the objective a restart must bring for the next to run. Each start gets
// an equal share of the budget: a start that spends it crawling along a
// plateau of the piecewise objective is cut, and the next one starts from
// its best point with fresh trust-region steps (one start with the whole
// budget left a fit at 3.4% RMS where three reach the noise).
constexpr int kRestarts = 2;
constexpr double kRestartGain = 1e-4;
// The evaluations a fit may take: a base and more per fitted constant.
constexpr int kBaseEvaluations = 100;
constexpr int kEvaluationsPerConstant = 100;

double to_coord(const CalibrationParam& p, double v) {
  v = std::clamp(v, p.lower, p.upper);
  return p.log_space ? std::log(v) : v;
}
double from_coord(const CalibrationParam& p, double u) {
  return std::clamp(p.log_space ? std::exp(u) : u, p.lower, p.upper);
}

struct Problem {
  Problem(const std::vector<MeasuredStep>& obs, const CostConstants& base) : obs(obs), base(base) {}

  const std::vector<MeasuredStep>& obs;
  CostConstants base;                           // constants not being fitted
  std::vector<const CalibrationParam*> params;  // the fitted ones
  int evaluations = 0;
  double best_f = std::numeric_limits<double>::infinity();
  std::vector<double> best_x;

  CostConstants constants(const std::vector<double>& x) const {
    CostConstants k = base;
    for (size_t j = 0; j < params.size(); ++j) k.*(params[j]->field) = from_coord(*params[j], x[j]);
    return k;
  }
};

double predicted_step(const MeasuredStep& o, const CostConstants& k) {
  if (o.tp_comm_overlapped) {
    CostConstants overlapped = k;
    overlapped.tp_overlap = 1;
    return predict(*o.model, *o.run, o.layout, *o.cluster, overlapped).step;
  }
  return predict(*o.model, *o.run, o.layout, *o.cluster, k).step;
}

double log_ratio(const Problem& /*p*/, const MeasuredStep& o, const CostConstants& k) {
  return std::log(predicted_step(o, k) / o.measured_step_s);
}

// Sum of squared log ratios; a non-finite prediction (none within the
// bounds) scores worse than any finite one.
double objective(const Problem& p, const CostConstants& k) {
  double f = 0;
  for (const auto& o : p.obs) {
    const double r = log_ratio(p, o, k);
    f += r * r;
  }
  return std::isfinite(f) ? f : std::numeric_limits<double>::max();
}

double nlopt_objective(const std::vector<double>& x, std::vector<double>& /*grad*/, void* data) {
  auto& p = *static_cast<Problem*>(data);
  ++p.evaluations;
  const double f = objective(p, p.constants(x));
  if (f < p.best_f) {
    p.best_f = f;
    p.best_x = x;
  }
  return f;
}

std::vector<double> relative_errors(const Problem& p, const CostConstants& k) {
  std::vector<double> e;
  e.reserve(p.obs.size());
  for (const auto& o : p.obs)
    e.push_back(predicted_step(o, k) / o.measured_step_s - 1.0);
  return e;
}

double rms(const std::vector<double>& e) {
  double s = 0;
  for (double v : e) s += v * v;
  return std::sqrt(s / double(e.size()));
}

// Largest change of any observation's log prediction per unit of the
// constant's coordinate, probed on both sides within its bounds (a constant
// at a bound, such as dp_overlap = 1, can only move inwards).
double influence(const Problem& p, const CalibrationParam& param, const CostConstants& k,
                 const std::vector<double>& base_log) {
  const double lo = to_coord(param, param.lower), hi = to_coord(param, param.upper);
  const double u = to_coord(param, k.*(param.field));
  double worst = 0;
  for (double du : {kProbe, -kProbe}) {
    const double v = std::clamp(u + du, lo, hi);
    if (v == u) continue;
    CostConstants probe = k;
    probe.*(param.field) = from_coord(param, v);
    for (size_t i = 0; i < p.obs.size(); ++i) {
      const double d = std::abs(log_ratio(p, p.obs[i], probe) - base_log[i]) / std::abs(v - u);
      if (std::isfinite(d)) worst = std::max(worst, d);
    }
  }
  return worst;
}

void check_observations(const std::vector<MeasuredStep>& obs) {
  if (obs.empty())
    throw InputError("calibration needs at least one measured step; got 0 observations");
  for (size_t i = 0; i < obs.size(); ++i) {
    const auto& o = obs[i];
    if (!(std::isfinite(o.measured_step_s) && o.measured_step_s > 0))
      throw InputError(fmt::format(
          "observation {} ({}): measured step time {} s must be a positive, finite number of "
          "seconds",
          i, o.layout.to_string(), o.measured_step_s));
    const auto broken = o.layout.violations(*o.model, *o.run, o.cluster->gpus);
    if (!broken.empty())
      throw InputError(fmt::format("observation {} ({}): layout cannot run on {} ranks: {}", i,
                                   o.layout.to_string(), o.cluster->gpus, fmt::join(broken, "; ")));
  }
}

}  // namespace

CalibrationResult calibrate(const ModelSpec& m, const RunSpec& run, const ClusterSpec& cluster,
                            const std::vector<Observation>& obs, const CostConstants& start) {
  std::vector<MeasuredStep> steps;
  steps.reserve(obs.size());
  // A layout of another capacity factor than the model's (a searched one)
  // is priced with the model dropping at it (model_for); one copy a factor.
  std::deque<ModelSpec> copies;
  for (const auto& o : obs) {
    const ModelSpec* model = &m;
    if (m.moe.enabled() && o.layout.capacity_factor != m.moe.capacity_factor) {
      auto it = std::find_if(copies.begin(), copies.end(), [&](const ModelSpec& c) {
        return c.moe.capacity_factor == o.layout.capacity_factor;
      });
      if (it == copies.end()) it = copies.insert(copies.end(), model_for(m, o.layout));
      model = &*it;
    }
    steps.push_back({model, &run, &cluster, o.layout, o.measured_step_s});
  }
  return calibrate(steps, start);
}

CalibrationResult calibrate(const std::vector<MeasuredStep>& obs, const CostConstants& start,
                            int max_evaluations, const std::vector<CalibrationParam>* params) {
  const auto& fittable = params ? *params : calibration_params();
  check_observations(obs);

  Problem p(obs, start);
  CalibrationResult r;
  r.constants = start;
  r.error_before = relative_errors(p, start);
  r.rms_error_before = rms(r.error_before);
  r.error_after = r.error_before;
  r.rms_error_after = r.rms_error_before;
  const double start_f = objective(p, start);

  // The starting point, clamped into the bounds, and the constants it moves.
  CostConstants x0 = start;
  for (const auto& param : fittable)
    x0.*(param.field) = std::clamp(start.*(param.field), param.lower, param.upper);
  std::vector<double> base_log;
  for (const auto& o : obs) base_log.push_back(log_ratio(p, o, x0));
  for (const auto& param : fittable) {
    if (p.params.size() == obs.size()) break;
    if (influence(p, param, x0, base_log) > kMinInfluence) p.params.push_back(&param);
  }
  if (p.params.empty()) return r;
  p.base = x0;

  const size_t n = p.params.size();
  std::vector<double> x(n), lower(n), upper(n), step(n);
  for (size_t j = 0; j < n; ++j) {
    const auto& param = *p.params[j];
    x[j] = to_coord(param, x0.*(param.field));
    lower[j] = to_coord(param, param.lower);
    upper[j] = to_coord(param, param.upper);
    step[j] = param.log_space ? kLogStep : kLinearStep;
    r.fitted.push_back(param.name);
  }

  // BOBYQA fits a quadratic model of the objective around its start; on
  // this piecewise objective (maxima of overlapped terms, clamps) a run can
  // end on its tolerances short of the fit, so it starts again from the best
  // point, with fresh trust-region steps, while the budget lasts and the
  // last start still lowered the objective. Each start takes at most its
  // share of the budget.
  const int budget = max_evaluations > 0 ? max_evaluations : kBaseEvaluations + kEvaluationsPerConstant * int(n);
  for (int start_no = 0; start_no <= kRestarts && p.evaluations < budget; ++start_no) {
    nlopt::opt opt(nlopt::LN_BOBYQA, unsigned(n));
    opt.set_lower_bounds(lower);
    opt.set_upper_bounds(upper);
    opt.set_initial_step(step);
    opt.set_ftol_rel(1e-10);
    opt.set_xtol_abs(1e-7);
    opt.set_maxeval(std::min(budget - p.evaluations, budget / (kRestarts + 1)));
    opt.set_min_objective(nlopt_objective, &p);
    if (start_no > 0) x = p.best_x;
    const double before = p.best_f;
    double f = 0;
    try {
      opt.optimize(x, f);
    } catch (const std::runtime_error&) {
      // Round-off limits and other early stops still leave the best point
      // evaluated so far, which is all the fit needs.
    }
    if (start_no > 0 && !(p.best_f < before * (1 - kRestartGain))) break;
  }
  r.evaluations = p.evaluations;

  // The log objective and the reported relative error can disagree when the
  // residuals are large and inconsistent; the fit is kept only when it is
  // better by both, so that calibration never makes the model worse.
  if (!p.best_x.empty() && p.best_f < start_f) {
    const CostConstants fitted = p.constants(p.best_x);
    auto errors = relative_errors(p, fitted);
    const double after = rms(errors);
    if (after <= r.rms_error_before) {
      r.constants = fitted;
      r.accepted = true;
      r.error_after = std::move(errors);
      r.rms_error_after = after;
    }
  }
  return r;
}

}  // namespace weft::tuner
