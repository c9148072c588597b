// The cost and memory models against the public measured runs
// (calibration/public_runs.csv): per source and per sweep, with the
// datasheet constants and with constants fitted to the non-held-out rows.
//   model_fidelity [--csv PATH] [--sweeps]
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "calibration/fidelity.h"

using namespace weft;
using namespace weft::tuner;
using namespace weft::calibration;

namespace {

void print_stats(const char* label, const Fidelity& f) {
  fmt::print("  {:<34} {:>5} {:>6} {:>7} {:>7} {:>7} {:>9} {:>7} {:>7}\n", label, "rows", "MAE", "bias",
             "sweeps", "rho", "best<=2", "fit", "oom");
  auto line = [](const std::string& name, const FidelityStats& s) {
    fmt::print("  {:<34} {:>5} {:>6.1f} {:>+7.1f} {:>7} {:>7.2f} {:>9} {:>7} {:>7}\n", name, s.measured,
               s.mae_points, s.bias_points, s.sweeps, s.mean_spearman,
               fmt::format("{}/{}", s.best_within_2, s.sweeps),
               fmt::format("{}/{}", s.fit_predicted, s.measured), fmt::format("{}/{}", s.oom_predicted, s.oom));
  };
  for (const auto& [src, s] : f.by_source) line(src, s);
  line("all", f.total);
  // Context parallelism's rows apart: their error is the cp model's.
  line("context parallel (cp > 1)", f.context_parallel);
  // FP8 rows apart: their error is the FP8 model's. MFU on them is against
  // the dense bf16 peak (989 TFLOP/s on H100), as on every other row.
  line("fp8, dense (MFU vs bf16 peak)", f.fp8);
  // Mixture-of-Experts rows apart: MFU of the active parameters; their
  // fitted split fits the MoE constants alone (calibration/fidelity.h).
  line("moe", f.moe);
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv = calibration_dir() + "/public_runs.csv";
  bool sweeps = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!std::strcmp(argv[i], "--sweeps")) sweeps = true;
  }
  const auto set = public_runs_load(csv);
  fmt::print("{} rows weft can express from {}; skipped:\n", set.runs.size(), csv);
  for (const auto& [why, n] : set.skipped) fmt::print("  {:>5}  {}\n", n, why);
  int64_t cp_rows = 0, cp_skipped = 0;
  for (const auto& r : set.runs) cp_rows += r.layout.cp > 1;
  for (const auto& [why, n] : set.skipped_cp) cp_skipped += n;
  fmt::print("context parallel rows (cp > 1): {} expressed, {} skipped\n", cp_rows, cp_skipped);
  for (const auto& [why, n] : set.skipped_cp) fmt::print("  {:>5}  {}\n", n, why);
  int64_t fp8_rows = 0, fp8_held = 0;
  for (const auto& r : set.runs)
    if (r.layout.fp8 != Fp8Recipe::off) {
      ++fp8_rows;
      fp8_held += r.held_out;
    }
  fmt::print("fp8 rows: {} expressed ({} held out)\n", fp8_rows, fp8_held);

  // Before: the datasheet constants; after: the presets' shipped profiles
  // (calibration/profiles/, written by `weft calibrate --public`).
  const ConstantsFor defaults = [](const DeviceSpec& d) { return datasheet_constants(d); };
  const ConstantsFor fit = [](const DeviceSpec& d) { return cost_defaults(d); };
  for (const char* family : {"a100", "hopper"}) {
    const auto p = preset_profile(device_preset(family == std::string("a100") ? "a100-80gb" : "h100"));
    if (!p) continue;
    fmt::print("\nshipped profile {}: {}\n", family, nlohmann::json(p->constants).dump());
    fmt::print("  fitted: rms error of the step time {:.1f}% -> {:.1f}% on {} \n",
               100 * p->provenance.value("rms_error_before", 0.0), 100 * p->provenance.value("rms_error_after", 0.0),
               p->provenance.value("fitted_rows", nlohmann::json::object()).dump());
    if (p->provenance.value("fp8_rms_error_before", 0.0) > 0)
      fmt::print("  fp8 rows (fp8_gemm_efficiency alone): rms error {:.1f}% -> {:.1f}% on {}\n",
                 100 * p->provenance.value("fp8_rms_error_before", 0.0),
                 100 * p->provenance.value("fp8_rms_error_after", 0.0),
                 p->provenance.value("fp8_fitted_rows", nlohmann::json::object()).dump());
    if (p->provenance.value("moe_rms_error_before", 0.0) > 0)
      fmt::print("  moe rows (the three MoE constants alone): rms error {:.1f}% -> {:.1f}% on {}\n",
                 100 * p->provenance.value("moe_rms_error_before", 0.0),
                 100 * p->provenance.value("moe_rms_error_after", 0.0),
                 p->provenance.value("moe_fitted_rows", nlohmann::json::object()).dump());
  }
  for (auto [name, split] : {std::pair{"held-out", Split::held_out}, {"fitted", Split::fitted}}) {
    fmt::print("\n{} rows, datasheet constants (MFU points; rho: mean Spearman per sweep):\n", name);
    print_stats("source", fidelity_evaluate(set.runs, split, defaults));
    fmt::print("{} rows, shipped fitted profiles:\n", name);
    print_stats("source", fidelity_evaluate(set.runs, split, fit));
  }
  // Mixture-of-Experts rows, both splits (the held-out one above is what
  // judges the fit of the MoE constants), with each row.
  {
    std::vector<PublicRun> moe;
    for (const auto& r : set.runs)
      if (r.model.moe.enabled()) moe.push_back(r);
    if (!moe.empty()) {
      const auto before = fidelity_evaluate(moe, Split::all, defaults), after = fidelity_evaluate(moe, Split::all, fit);
      fmt::print("\nMoE rows (both splits; H: held out): MAE {:.1f} points with the datasheet constants, {:.1f} with "
                 "the shipped profiles (bias {:+.1f} / {:+.1f}); the memory model fits {}/{} of the runs\n",
                 before.moe.mae_points, after.moe.mae_points, before.moe.bias_points, after.moe.bias_points,
                 after.moe.fit_predicted, after.moe.measured);
      // Split by GEMM precision: the bf16 rows, and the FP8 ones (FP8 in
      // the MoE blocks too).
      double err[2] = {0, 0}, bias[2] = {0, 0};
      int64_t n[2] = {0, 0}, fits[2] = {0, 0};
      for (const auto& x : after.rows) {
        const int f8 = x.run->layout.fp8 != Fp8Recipe::off;
        const double e = 100 * (x.predicted_mfu - x.run->measured_mfu);
        err[f8] += std::abs(e);
        bias[f8] += e;
        ++n[f8];
        fits[f8] += x.predicted_fits;
        fmt::print("  {} {:<28} {:<22} {:>5} GPUs  {:<62} {:<15} meas {:5.1f} pred {:5.1f} {}\n",
                   x.run->held_out ? "H" : " ", x.run->source,
                   x.run->model.name, x.run->cluster.gpus, x.run->layout.to_string().substr(0, 62),
                   gemm_precision_text(x.run->layout), 100 * x.run->measured_mfu, 100 * x.predicted_mfu,
                   x.predicted_fits ? "" : "(predicted OOM)");
      }
      for (int f8 : {0, 1})
        if (n[f8] > 0)
          fmt::print("  {} rows: {}, MAE {:.1f} points (bias {:+.1f}), the memory model fits {}\n",
                     f8 ? "FP8" : "bf16", n[f8], err[f8] / double(n[f8]), bias[f8] / double(n[f8]), fits[f8]);
    }
  }
  // Each MoE model left out in turn (all its sizes: Grok-1's proxies with
  // it): the MoE constants fitted without any of its rows (either split),
  // then judged on all of them. A model the fit never saw, where the
  // held-out split above holds out sweeps.
  {
    const auto family = [](const PublicRun& r) { return r.model.name.substr(0, r.model.name.find(' ')); };
    std::map<std::string, std::vector<PublicRun>> by_model;
    for (const auto& r : set.runs)
      if (r.model.moe.enabled()) by_model[family(r)].push_back(r);
    if (by_model.size() > 1) {
      fmt::print("\nMoE models left out of the fit in turn (MFU points):\n");
      fmt::print("  {:<22} {:>5} {:>6} {:>7}   {}\n", "model", "rows", "MAE", "bias", "fitted without it");
      double err = 0;
      int64_t n = 0;
      for (const auto& [name, rows] : by_model) {
        std::vector<PublicRun> rest;
        for (const auto& r : set.runs)
          if (!(r.model.moe.enabled() && family(r) == name)) {
            rest.push_back(r);
            if (r.model.moe.enabled()) rest.back().held_out = false;
          }
        std::map<std::string, CostConstants> fits;
        for (const char* part : {"a100", "hopper"})
          fits[part] = fidelity_fit(rest, part, datasheet_constants(device_preset(
                                                    part == std::string("a100") ? "a100-80gb" : "h100")))
                           .constants;
        const auto f = fidelity_evaluate(rows, Split::all, [&](const DeviceSpec& d) {
          const auto it = fits.find(device_family_name(d));
          return it != fits.end() ? it->second : datasheet_constants(d);
        });
        const CostConstants& k = fits["hopper"];
        const std::string label = std::all_of(rows.begin(), rows.end(), [&](const PublicRun& r) {
          return r.model.name == rows.front().model.name;
        }) ? rows.front().model.name : name + " (all sizes)";
        fmt::print("  {:<22} {:>5} {:>6.1f} {:>+7.1f}   expert {:.2f}, fp8 expert {:.2f}, dispatch {:.2f}\n", label,
                   f.moe.measured, f.moe.mae_points, f.moe.bias_points, k.expert_gemm_efficiency,
                   k.fp8_expert_gemm_efficiency, k.dispatch_efficiency);
        err += f.moe.mae_points * double(f.moe.measured);
        n += f.moe.measured;
      }
      if (n > 0) fmt::print("  {:<22} {:>5} {:>6.1f}\n", "all, each left out", n, err / double(n));
    }
  }
  if (const char* want = std::getenv("WEFT_FIDELITY_SWEEP")) {
    const auto f = fidelity_evaluate(set.runs, Split::all, fit);
    for (const auto& x : f.rows)
      if (x.run->sweep.find(want) != std::string::npos)
        fmt::print("{:<80} {} pred {:5.1f} meas {:5.1f} mem {:5.1f} GiB {}\n", x.run->layout.to_string(),
                   x.run->held_out ? "H" : " ", 100 * x.predicted_mfu, 100 * x.run->measured_mfu,
                   x.peak_bytes / double(1 << 30), x.run->oom ? (x.predicted_fits ? "OOM (predicted fit)" : "OOM") : (x.predicted_fits ? "" : "ran (predicted OOM)"));
    if (std::getenv("WEFT_FIDELITY_PARTS"))
      for (const auto& x : f.rows)
        if (x.run->sweep.find(want) != std::string::npos && !x.run->oom) {
          // Priced as fidelity_evaluate prices the row: tensor-parallel
          // overlap where the framework states it.
          CostConstants k = fit(x.run->cluster.device);
          if (x.run->tp_comm_overlapped) k.tp_overlap = 1;
          const auto b = predict(x.run->model, x.run->run, x.run->layout, x.run->cluster, k);
          fmt::print("{:<60} meas {:6.2f} pred {:6.2f} = comp {:5.2f} rec {:5.2f} tp {:5.2f} cp {:5.2f} bub {:5.2f} p2p {:5.2f} dp {:5.2f} opt {:5.2f}\n",
                     x.run->layout.to_string().substr(0, 60), x.run->measured_step_s, b.step, b.compute, b.recompute, b.tp_comm,
                     b.cp_comm, b.pp_bubble, b.pp_p2p, b.dp_comm, b.optimizer);
        }
  }
  if (sweeps) {
    const auto f = fidelity_evaluate(set.runs, Split::all, fit);
    fmt::print("\nsweeps, all rows, fitted constants:\n");
    for (const auto& s : f.sweeps)
      fmt::print("  {:<52} {:>3} rho {:>5.2f}  best {:.1f}% {}  picked {:.1f}% {}\n", s.sweep, s.measured, s.spearman,
                 100 * s.best_measured_mfu, s.best, 100 * s.picked_measured_mfu, s.picked);
  }
  return 0;
}
