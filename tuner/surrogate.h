// What the cost model misses, learnt from the trials: the log of measured
// over refit-predicted step time as a sum of one effect per knob value (tp=2,
// mb=8, attn=materialized, norm=unfused, zero=1, ...), fitted by ridge
// regression. The analytic model prices how the knobs interact; what it
// cannot price is a kernel that runs faster or slower on this machine than
// its constant says (the CPU's unfused norm, say, against the fused one), and
// no refit of shared constants can learn that: an effect of its own per
// value can.
//
// The fit is Bayesian linear regression with a Gaussian prior on each effect
// (mean 0, the intercept flat), so a value never measured keeps effect 0 and
// the largest uncertainty. The noise is estimated from the residuals with a
// weak prior, and each layout gets a predictive spread: the search profiles
// the layout whose optimistic prediction is shortest, and stops once no
// layout's optimistic prediction beats the best measured.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/layout.h"

namespace weft::tuner {

// The knob values a layout is made of, one per axis: "tp=2", "cp=1",
// "cp_comm=ring" (cp > 1 only), "pp=2", "dp=2", "mb=8", "vpp=1", "sp=0",
// "ckpt=full/2", "attn=flash", "norm=fused", "zero=1", "grad=fp32",
// "fp8=off".
std::vector<std::string> knob_values(const Layout& l);

class Surrogate {
 public:
  // `prior_sd`: the spread of one knob value's effect before it is measured
  // (log units); `prior_noise`: the trial noise assumed before residuals
  // say otherwise; `noise_floor`: the least noise assumed (trials repeat to
  // within it at best).
  explicit Surrogate(double prior_sd = 0.25, double prior_noise = 0.15, double noise_floor = 0.01)
      : prior_sd_(prior_sd), prior_noise_(prior_noise), noise_floor_(noise_floor) {}

  // The knob values of `l` as indices into the vocabulary (new values are
  // added).
  std::vector<int32_t> encode(const Layout& l);

  // Fits the effects to observations: `rows[i]` encoded, `y[i]` the log of
  // measured over predicted step. Replaces any earlier fit.
  void fit(const std::vector<std::vector<int32_t>>& rows, const std::vector<double>& y);

  // The fitted log correction of an encoded layout, and its predictive
  // standard deviation (noise included), in log units. Before any fit: 0 and
  // the prior's. A value no observation holds counts as the average of its
  // axis's measured values (weighted by how often each was measured), give
  // or take the prior's spread.
  double mean(const std::vector<int32_t>& row) const;
  double spread(const std::vector<int32_t>& row) const;
  // The residual noise the fit estimated (log units).
  double noise() const { return noise_; }
  int64_t observations() const { return n_; }
  void set_noise_floor(double floor) { noise_floor_ = floor; }
  // The fitted effect of a knob value ("attn=materialized"), 0 when unknown.
  double effect(const std::string& value) const;
  const std::vector<std::string>& values() const { return names_; }

 private:
  double prior_sd_, prior_noise_, noise_floor_;
  // The design row of an encoded layout: (column, weight) pairs over the
  // intercept and the measured values, and how many of its values are
  // unmeasured.
  std::vector<std::pair<int64_t, double>> design(const std::vector<int32_t>& row, int64_t& unmeasured) const;

  std::unordered_map<std::string, int32_t> index_;
  std::vector<std::string> names_;
  std::vector<int32_t> axis_;             // each value's axis, an index into axes_
  std::unordered_map<std::string, int32_t> axes_;
  std::vector<double> counts_;            // observations holding each value, at the last fit
  // The fit over p = 1 + values: intercept, then one effect per value.
  int64_t p_ = 0, n_ = 0;
  std::vector<double> beta_;     // (p)
  std::vector<double> cov_;      // (p, p): the posterior covariance over noise^2
  double noise_ = 0;
};

}  // namespace weft::tuner
