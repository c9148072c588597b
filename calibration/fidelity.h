// How well the cost and memory models tell the truth about real clusters:
// their predictions for the public measured runs (calibration/public_runs.h)
// against what was measured, per source and per sweep (one model on one
// cluster), and the fit of a device family's cost constants to them.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tuner/calibrate.h"
#include "tuner/cost.h"
#include "tuner/device_profile.h"
#include "calibration/public_runs.h"

namespace weft::calibration {

using tuner::CalibrationResult;
using tuner::CostConstants;
using tuner::DeviceProfile;

// Sweeps smaller than this take no part in the rank statistics: Spearman
// over 3 or 4 layouts moves in steps of 0.5 or 0.2, so one near-tie swapped
// (two layouts measured 0.5% apart) decides it. Their rows still count in
// the error and memory statistics.
constexpr int64_t kMinSweepRows = 5;

// Which rows a statistic covers.
enum class Split { all, fitted, held_out };

struct FidelityStats {
  int64_t measured = 0;      // rows with a measured step
  int64_t oom = 0;           // rows the source reports out of memory
  double mae_points = 0;     // mean |predicted - measured| MFU, in points
  double bias_points = 0;    // mean (predicted - measured) MFU, in points
  int64_t sweeps = 0;        // sweeps with at least kMinSweepRows measured rows
  double mean_spearman = 0;  // of predicted against measured MFU, over those sweeps
  int64_t best_within_2 = 0; // sweeps whose predicted-best row measured within 2 points of the best
  int64_t fit_predicted = 0; // measured rows the memory model says fit
  int64_t oom_predicted = 0; // OOM rows the memory model says do not fit
};

struct FidelityRow {
  const PublicRun* run = nullptr;
  double predicted_mfu = 0;
  double predicted_step_s = 0;
  bool predicted_fits = false;
  double peak_bytes = 0;  // the memory model's worst stage
};

struct SweepFidelity {
  std::string sweep;
  int64_t measured = 0;
  double spearman = 0;            // NaN with fewer than 3 measured rows (or all tied)
  double best_measured_mfu = 0;   // the sweep's best measured row
  double picked_measured_mfu = 0; // what the row the model ranks first measured
  std::string picked, best;       // their layouts
};

struct Fidelity {
  std::vector<FidelityRow> rows;
  std::map<std::string, FidelityStats> by_source;
  std::vector<SweepFidelity> sweeps;
  FidelityStats total;
  FidelityStats context_parallel;  // the rows with cp > 1, whatever their source
  FidelityStats fp8;               // the dense rows with FP8 GEMMs, whatever their source (MFU against the bf16 peak)
  FidelityStats moe;               // the Mixture-of-Experts rows (MFU of the active parameters' FLOPs)
};

// The constants each device is predicted with (e.g. cost_defaults, or a
// fitted family's).
using ConstantsFor = std::function<CostConstants(const DeviceSpec&)>;

// Predicts every row of `split` and summarises. Spearman and the best-of-sweep
// check use the measured rows of the split within each sweep.
Fidelity fidelity_evaluate(const std::vector<PublicRun>& runs, Split split, const ConstantsFor& constants);

// Fits one family's constants to its measured, non-held-out rows by least
// squares on log step time (tuner/calibrate.h), starting from `start`: the
// constants of every precision to the rows without FP8, then the FP8 GEMM
// efficiency alone to the FP8 rows (so FP8 rows never move the bf16 rates),
// then the MoE constants alone (expert_gemm_efficiency,
// fp8_expert_gemm_efficiency, dispatch_efficiency) to the Mixture-of-Experts
// rows. Held-out rows are never fitted.
CalibrationResult fidelity_fit(const std::vector<PublicRun>& runs, const std::string& family,
                               const CostConstants& start);

// The device profile of a family fitted by fidelity_fit() from
// datasheet_constants(), with its provenance: the file, the rows fitted and
// held out, and the fit's error.
DeviceProfile fidelity_profile(const PublicRunSet& set, const std::string& family, const std::string& csv);

// Spearman rank correlation (average ranks for ties); NaN for fewer than 3
// points or a constant side.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace weft::calibration
