#include "calibration/fidelity.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/flops.h"
#include "memory/estimate.h"

namespace weft::calibration {

using namespace weft::tuner;  // the cost and memory models judged here

namespace {

std::vector<double> ranks(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * double(i + j);
    i = j + 1;
  }
  return r;
}

bool in_split(const PublicRun& r, Split s) {
  return s == Split::all || (s == Split::held_out) == r.held_out;
}

}  // namespace

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = a.size();
  if (n < 3 || b.size() != n) return std::numeric_limits<double>::quiet_NaN();
  const auto ra = ranks(a), rb = ranks(b);
  const double mean = 0.5 * double(n - 1);
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (ra[i] - mean) * (rb[i] - mean);
    saa += (ra[i] - mean) * (ra[i] - mean);
    sbb += (rb[i] - mean) * (rb[i] - mean);
  }
  if (saa == 0 || sbb == 0) return std::numeric_limits<double>::quiet_NaN();
  return sab / std::sqrt(saa * sbb);
}

Fidelity fidelity_evaluate(const std::vector<PublicRun>& runs, Split split, const ConstantsFor& constants) {
  Fidelity f;
  std::map<std::string, CostConstants> cache;
  for (const auto& r : runs) {
    if (!in_split(r, split)) continue;
    const std::string& dev = r.cluster.device.name;
    auto it = cache.find(dev);
    if (it == cache.end()) it = cache.emplace(dev, constants(r.cluster.device)).first;
    CostConstants k = it->second;
    if (r.tp_comm_overlapped) k.tp_overlap = 1;
    const auto cost = predict(r.model, r.run, r.layout, r.cluster, k);
    const auto mem = memory::estimate(r.model, r.run, r.layout, r.cluster.device);
    f.rows.push_back({&r, cost.mfu, cost.step, mem.fits, double(mem.peak())});
  }

  auto add = [](FidelityStats& s, const FidelityRow& x) {
    if (x.run->oom) {
      ++s.oom;
      s.oom_predicted += x.predicted_fits ? 0 : 1;
      return;
    }
    ++s.measured;
    const double d = 100 * (x.predicted_mfu - x.run->measured_mfu);
    s.mae_points += std::abs(d);
    s.bias_points += d;
    s.fit_predicted += x.predicted_fits ? 1 : 0;
  };
  for (const auto& x : f.rows) {
    add(f.by_source[x.run->source], x);
    add(f.total, x);
    if (x.run->layout.cp > 1) add(f.context_parallel, x);
    if (x.run->layout.fp8 != Fp8Recipe::off && !x.run->model.moe.enabled()) add(f.fp8, x);
    if (x.run->model.moe.enabled()) add(f.moe, x);
  }

  // Sweeps, in the order they first appear.
  std::vector<std::string> names;
  std::map<std::string, std::vector<const FidelityRow*>> members;
  for (const auto& x : f.rows) {
    if (x.run->oom) continue;
    auto& v = members[x.run->sweep];
    if (v.empty()) names.push_back(x.run->sweep);
    v.push_back(&x);
  }
  for (const auto& name : names) {
    const auto& v = members[name];
    SweepFidelity s;
    s.sweep = name;
    s.measured = int64_t(v.size());
    std::vector<double> pred, meas;
    const FidelityRow *best = v.front(), *picked = v.front();
    for (const auto* x : v) {
      pred.push_back(x->predicted_mfu);
      meas.push_back(x->run->measured_mfu);
      if (x->run->measured_mfu > best->run->measured_mfu) best = x;
      if (x->predicted_mfu > picked->predicted_mfu) picked = x;
    }
    s.spearman = spearman(pred, meas);
    s.best_measured_mfu = best->run->measured_mfu;
    s.picked_measured_mfu = picked->run->measured_mfu;
    s.best = best->run->layout.to_string();
    s.picked = picked->run->layout.to_string();
    if (s.measured >= kMinSweepRows) {
      std::vector<FidelityStats*> stats{&f.by_source[v.front()->run->source], &f.total};
      if (std::all_of(v.begin(), v.end(), [](const FidelityRow* x) { return x->run->layout.cp > 1; }))
        stats.push_back(&f.context_parallel);
      if (std::all_of(v.begin(), v.end(), [](const FidelityRow* x) { return x->run->layout.fp8 != Fp8Recipe::off; }))
        stats.push_back(&f.fp8);
      if (v.front()->run->model.moe.enabled()) stats.push_back(&f.moe);  // (a sweep is one model)
      for (FidelityStats* st : stats) {
        ++st->sweeps;
        st->mean_spearman += std::isfinite(s.spearman) ? s.spearman : 0;
        st->best_within_2 += s.best_measured_mfu - s.picked_measured_mfu <= 0.02 ? 1 : 0;
      }
    }
    f.sweeps.push_back(std::move(s));
  }
  for (FidelityStats* st : [&] {
         std::vector<FidelityStats*> all{&f.total, &f.context_parallel, &f.fp8, &f.moe};
         for (auto& [k, v] : f.by_source) all.push_back(&v);
         return all;
       }()) {
    if (st->measured > 0) {
      st->mae_points /= double(st->measured);
      st->bias_points /= double(st->measured);
    }
    if (st->sweeps > 0) st->mean_spearman /= double(st->sweeps);
  }
  return f;
}

namespace {

bool is_moe_param(const CalibrationParam& p) {
  const std::string n = p.name;
  return n == "expert_gemm_efficiency" || n == "fp8_expert_gemm_efficiency" || n == "dispatch_efficiency";
}

// One stage of the fit: `params` alone on `steps`, from the constants the
// stages before fitted, which it moves on.
CalibrationResult fit_stage(const std::vector<MeasuredStep>& steps, const std::vector<CalibrationParam>& params,
                            int budget, CalibrationResult& fit) {
  CalibrationResult r = calibrate(steps, fit.constants, budget, &params);
  fit.constants = r.constants;
  fit.fitted.insert(fit.fitted.end(), r.fitted.begin(), r.fitted.end());
  return r;
}

void fit_fp8(const std::vector<MeasuredStep>& fp8_steps, CalibrationResult& fit) {
  // The FP8 GEMM efficiency alone, bounded by what cuBLASLt reaches on the
  // largest shapes (0.81 of the dense FP8 peak; SOURCES.md, "FP8"): left
  // free it runs to 1.0, buying with the GEMMs what the bf16 fit prices too
  // dear in these rows (their frameworks' attention kernels and overlapped
  // tensor-parallel communication), which would overstate every FP8 gain.
  static const std::vector<CalibrationParam> fp8_params = [] {
    std::vector<CalibrationParam> v;
    for (auto p : calibration_params())
      if (std::string(p.name) == "fp8_gemm_efficiency") {
        p.upper = 0.85;
        v.push_back(p);
      }
    return v;
  }();
  const CalibrationResult f8 = fit_stage(fp8_steps, fp8_params, 400, fit);
  fit.fp8_rms_error_before = f8.rms_error_before;
  fit.fp8_rms_error_after = f8.rms_error_after;
}

// The MoE constants alone (CostConstants: the routed experts' grouped GEMMs,
// their FP8 ones, the expert-parallel dispatch) on the MoE rows, from the
// dense and FP8 fits: every other term of an MoE block is a dense block's.
void fit_moe(const std::vector<MeasuredStep>& moe_steps, CalibrationResult& fit) {
  static const std::vector<CalibrationParam> moe_params = [] {
    std::vector<CalibrationParam> v;
    for (const auto& p : calibration_params())
      if (is_moe_param(p)) v.push_back(p);
    return v;
  }();
  const CalibrationResult fm = fit_stage(moe_steps, moe_params, 600, fit);
  fit.moe_rms_error_before = fm.rms_error_before;
  fit.moe_rms_error_after = fm.rms_error_after;
}

}  // namespace

CalibrationResult fidelity_fit(const std::vector<PublicRun>& runs, const std::string& family,
                               const CostConstants& start) {
  std::vector<MeasuredStep> steps, fp8_steps, moe_steps;
  // The MoE rows fit the MoE constants alone, last (below): the rest of
  // their blocks is priced from the dense rows' constants.
  for (const auto& r : runs)
    if (!r.oom && !r.held_out && device_family_name(r.cluster.device) == family)
      (r.model.moe.enabled() ? moe_steps : r.layout.fp8 != Fp8Recipe::off ? fp8_steps : steps)
          .push_back({&r.model, &r.run, &r.cluster, r.layout, r.measured_step_s, r.tp_comm_overlapped});
  // The public runs that overlap tensor-parallel communication with compute
  // say so (tp_comm_overlapped: priced with tp_overlap 1), the others do
  // not (Megatron-style TP, FSDP without TP), and their kernels launch in a
  // few microseconds: left free, tp_overlap and launch_overhead
  // soak up what other terms miss (a fit put them at 0.8 and 70 us, which
  // inverted the micro-batch and tp-against-pp rankings of the S9 sweeps).
  static const std::vector<CalibrationParam> params = [] {
    std::vector<CalibrationParam> v;
    for (auto p : calibration_params()) {
      if (std::string(p.name) == "tp_overlap" || std::string(p.name).rfind("fp8_", 0) == 0 || is_moe_param(p))
        continue;
      if (std::string(p.name) == "launch_overhead") p.upper = 5e-6;
      v.push_back(p);
    }
    return v;
  }();
  CalibrationResult fit = calibrate(steps, start, 4000, &params);
  // A device without a measurement of cuDNN's attention prices it as flash
  // (datasheet_constants); where no row fitted it, it follows flash's fit.
  if (start.cudnn_efficiency == start.flash_efficiency &&
      std::find(fit.fitted.begin(), fit.fitted.end(), "cudnn_efficiency") == fit.fitted.end())
    fit.constants.cudnn_efficiency = fit.constants.flash_efficiency;
  if (!fp8_steps.empty()) fit_fp8(fp8_steps, fit);
  if (!moe_steps.empty()) fit_moe(moe_steps, fit);
  return fit;
}

DeviceProfile fidelity_profile(const PublicRunSet& set, const std::string& family, const std::string& csv) {
  const char* preset = family == "a100" ? "a100-80gb" : family == "hopper" ? "h100" : family.c_str();
  const auto fit = fidelity_fit(set.runs, family, datasheet_constants(device_preset(preset)));
  DeviceProfile p;
  p.device = family;
  p.origin = ProfileOrigin::fitted;
  p.constants = fit.constants;
  // The rows of each stage apart: the FP8 rows fit only the FP8 GEMM
  // efficiency, the MoE rows only the MoE constants, and the RMS errors are
  // each stage's own.
  std::map<std::string, int64_t> rows, held, fp8_rows, fp8_held, moe_rows, moe_held;
  for (const auto& r : set.runs)
    if (!r.oom && device_family_name(r.cluster.device) == family) {
      if (r.model.moe.enabled()) {
        ++(r.held_out ? moe_held : moe_rows)[r.source];
        continue;
      }
      const bool fp8 = r.layout.fp8 != Fp8Recipe::off;
      ++(r.held_out ? (fp8 ? fp8_held : held) : (fp8 ? fp8_rows : rows))[r.source];
    }
  p.provenance = {{"csv", csv},
                  {"fitted_rows", rows},
                  {"held_out_rows", held},
                  {"fitted", fit.fitted},
                  {"rms_error_before", fit.rms_error_before},
                  {"rms_error_after", fit.rms_error_after},
                  {"method", "least squares on log step time (NLopt BOBYQA) from the datasheet constants; "
                             "held-out sweeps never fitted; FP8 rows fit fp8_gemm_efficiency alone; MoE rows "
                             "fit expert_gemm_efficiency, fp8_expert_gemm_efficiency and dispatch_efficiency alone"}};
  if (!fp8_rows.empty()) {
    p.provenance["fp8_fitted_rows"] = fp8_rows;
    p.provenance["fp8_held_out_rows"] = fp8_held;
    p.provenance["fp8_rms_error_before"] = fit.fp8_rms_error_before;
    p.provenance["fp8_rms_error_after"] = fit.fp8_rms_error_after;
  }
  if (!moe_rows.empty()) {
    p.provenance["moe_fitted_rows"] = moe_rows;
    p.provenance["moe_held_out_rows"] = moe_held;
    p.provenance["moe_rms_error_before"] = fit.moe_rms_error_before;
    p.provenance["moe_rms_error_after"] = fit.moe_rms_error_after;
  }
  return p;
}

}  // namespace weft::calibration
