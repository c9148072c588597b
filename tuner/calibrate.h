// Calibration of the cost model: a least-squares fit of the CostConstants
// efficiencies to the step times the profiler measured, so that the analytic
// model ranks the remaining layouts with this machine's rates.
#pragma once

#include <string>
#include <vector>

#include "core/device_spec.h"
#include "core/layout.h"
#include "core/model_spec.h"
#include "core/run_spec.h"
#include "tuner/cost.h"

namespace weft::tuner {

struct Observation {            // one profiled layout
  Layout layout;
  double measured_step_s = 0;   // measured seconds per optimizer step (> 0)
};

// A measured step of any model, run and cluster (the profiler's steps share
// one; public measurements each have their own). The specs must outlive it.
struct MeasuredStep {
  const ModelSpec* model = nullptr;
  const RunSpec* run = nullptr;
  const ClusterSpec* cluster = nullptr;
  Layout layout;
  double measured_step_s = 0;
  // The run's framework overlaps its tensor-parallel collectives with the
  // GEMMs (Transformer Engine's userbuffers, in public rows): priced with
  // tp_overlap 1 whatever the constants say.
  bool tp_comm_overlapped = false;
};

struct CalibrationResult {
  CostConstants constants;      // fitted
  double rms_error_before = 0;  // RMS of relative error (predicted/measured - 1) with the start constants
  double rms_error_after = 0;   // the same with the fitted constants
  std::vector<double> error_before, error_after;  // per observation, relative (signed)
  std::vector<std::string> fitted;  // names of the constants that were fitted, in fitting order
  // The public fit's second stage (calibration/fidelity.h): the RMS relative
  // error on the FP8 rows before and after fitting the FP8 GEMM efficiency.
  double fp8_rms_error_before = 0, fp8_rms_error_after = 0;
  // Its third: the same on the MoE rows, fitting the MoE constants.
  double moe_rms_error_before = 0, moe_rms_error_after = 0;
  int evaluations = 0;          // objective evaluations nlopt used
  // False unless the fit lowered the objective and did not raise the RMS
  // relative error; the start constants are then returned unchanged.
  bool accepted = false;
};

// One constant calibration may fit, with its bounds and the coordinate the
// optimizer moves it in (the log for rates and times, the value itself for
// fractions that may be 0).
struct CalibrationParam {
  const char* name;
  double CostConstants::*field;
  double lower, upper;
  bool log_space;
};

// The fittable constants, most influential first: gemm_efficiency,
// flash_efficiency, memory_efficiency, intra_efficiency, launch_overhead,
// inter_efficiency, dp_overlap, tp_overlap, overlap_cost, fp8_gemm_efficiency
// (which moves only FP8 layouts' predictions), then expert_gemm_efficiency,
// fp8_expert_gemm_efficiency and dispatch_efficiency (MoE layouts' alone,
// in [0.1, 1] and the last in [0.1, 2]: a dispatcher may send fewer bytes
// than the all-to-all's model, or hide part of them; past 2 the public rows
// cannot tell it from the experts' GEMM efficiency, benchmarks/RESULTS.md).
// Other efficiencies lie in
// [0.01, 1], launch_overhead in [1e-7, 1e-3] s (both fitted in log space),
// the overlap fractions and overlap_cost in [0, 1] (fitted linearly). The GEMM
// tile sizes are not fitted: they enter through ceil(), whose plateaus give a
// local fit nothing to follow, and they describe the kernels' launch
// configuration rather than a rate. Nor is gemm_k_half: on whole steps it
// trades off against gemm_efficiency, and the GEMM microbenchmarks by shape
// are what can tell the two apart.
const std::vector<CalibrationParam>& calibration_params();

// Fits the efficiency constants of `start` to the observations by least
// squares on log(predicted / measured), with NLopt's BOBYQA (derivative-free,
// bounded, quadratic models suit a smooth sum of squares).
//
// Constants that move no observation's prediction are skipped; of the rest,
// the first min(count, observations) in the order of calibration_params() are
// fitted, so that the fit is never under-determined. A run of the optimizer
// stops at a relative change of the objective below 1e-10 or a step below
// 1e-7 in every coordinate; it starts again from its best point (at most 4
// times) while a start still lowers the objective by 1e-4, all of them
// within 100 + 100 per fitted constant evaluations. The best point evaluated is
// kept (accepted) only when its objective is below the start's and its RMS
// relative error is not above it; otherwise the start constants are returned.
//
// InputError for an empty list, a non-positive or non-finite measured time,
// or a layout that cannot run (model, run, cluster.gpus), naming the value.
CalibrationResult calibrate(const ModelSpec& m, const RunSpec& run, const ClusterSpec& cluster,
                            const std::vector<Observation>& obs, const CostConstants& start);
// The same fit over steps of many models and clusters (public measurements),
// over `params` (calibration_params() when null). max_evaluations 0 keeps
// the rule above.
CalibrationResult calibrate(const std::vector<MeasuredStep>& steps, const CostConstants& start,
                            int max_evaluations = 0, const std::vector<CalibrationParam>* params = nullptr);

}  // namespace weft::tuner
