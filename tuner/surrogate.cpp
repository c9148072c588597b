#include "tuner/surrogate.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include <fmt/format.h>

namespace weft::tuner {

std::vector<std::string> knob_values(const Layout& l) {
  std::vector<std::string> v = {fmt::format("tp={}", l.tp), fmt::format("cp={}", l.cp), fmt::format("pp={}", l.pp),
                                fmt::format("dp={}", l.dp), fmt::format("mb={}", l.mb), fmt::format("vpp={}", l.vpp),
                                fmt::format("sp={}", l.sp ? 1 : 0)};
  if (l.cp > 1) v.push_back(fmt::format("cp_comm={}", to_string(l.cp_comm)));
  // Expert parallelism (MoE models; dense layouts keep ep 1 and name none).
  if (l.etp > 1) v.push_back(fmt::format("etp={}", l.etp));
  if (l.ep > 1) {
    v.push_back(fmt::format("ep={}", l.ep));
    if (l.ep_fold) v.push_back("epfold=1");
    v.push_back(fmt::format("dispatch={}", to_string(l.dispatch)));
  }
  if (l.uneven()) v.push_back("split=" + split_text(l.split));
  v.push_back(l.ckpt_layers > 0 ? fmt::format("ckpt={}/{}", to_string(l.ckpt), l.ckpt_layers)
                                : fmt::format("ckpt={}", to_string(l.ckpt)));
  v.push_back(fmt::format("attn={}", to_string(l.attention)));
  v.push_back(fmt::format("norm={}", to_string(l.norm)));
  v.push_back(fmt::format("zero={}", l.zero));
  if (l.hybrid_sharding()) v.push_back(fmt::format("zero_group={}", l.zero_group));
  v.push_back(fmt::format("grad={}", to_string(l.grad)));
  v.push_back(l.fp8 == Fp8Recipe::off ? std::string("fp8=off")
                                      : fmt::format("fp8={}/{}", to_string(l.fp8), l.fp8_bf16_layers));
  return v;
}

std::vector<int32_t> Surrogate::encode(const Layout& l) {
  std::vector<int32_t> row;
  for (auto& name : knob_values(l)) {
    auto [it, added] = index_.try_emplace(name, int32_t(names_.size()));
    if (added) {
      names_.push_back(name);
      const std::string axis = name.substr(0, name.find('='));
      axis_.push_back(axes_.try_emplace(axis, int32_t(axes_.size())).first->second);
    }
    row.push_back(it->second);
  }
  return row;
}

namespace {

// Cholesky factor L (lower, row-major) of the symmetric positive definite
// (p, p) matrix `a`; false when it is not positive definite.
bool cholesky(std::vector<double>& a, int64_t p) {
  for (int64_t j = 0; j < p; ++j) {
    double d = a[size_t(j * p + j)];
    for (int64_t k = 0; k < j; ++k) d -= a[size_t(j * p + k)] * a[size_t(j * p + k)];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    a[size_t(j * p + j)] = d;
    for (int64_t i = j + 1; i < p; ++i) {
      double s = a[size_t(i * p + j)];
      for (int64_t k = 0; k < j; ++k) s -= a[size_t(i * p + k)] * a[size_t(j * p + k)];
      a[size_t(i * p + j)] = s / d;
    }
  }
  return true;
}

// The inverse of L·Lᵀ from its factor (p^3, fine for the few dozen knob
// values a space has).
std::vector<double> cholesky_inverse(const std::vector<double>& l, int64_t p) {
  std::vector<double> inv(size_t(p * p), 0);
  std::vector<double> col(static_cast<size_t>(p));
  for (int64_t c = 0; c < p; ++c) {
    // Solve L z = e_c, then Lᵀ x = z.
    for (int64_t i = 0; i < p; ++i) {
      double s = i == c ? 1.0 : 0.0;
      for (int64_t k = 0; k < i; ++k) s -= l[size_t(i * p + k)] * col[size_t(k)];
      col[size_t(i)] = s / l[size_t(i * p + i)];
    }
    for (int64_t i = p - 1; i >= 0; --i) {
      double s = col[size_t(i)];
      for (int64_t k = i + 1; k < p; ++k) s -= l[size_t(k * p + i)] * col[size_t(k)];
      col[size_t(i)] = s / l[size_t(i * p + i)];
    }
    for (int64_t i = 0; i < p; ++i) inv[size_t(i * p + c)] = col[size_t(i)];
  }
  return inv;
}

}  // namespace

void Surrogate::fit(const std::vector<std::vector<int32_t>>& rows, const std::vector<double>& y) {
  assert(rows.size() == y.size());
  n_ = int64_t(rows.size());
  p_ = 1 + int64_t(names_.size());
  const int64_t p = p_;
  // XᵀX and Xᵀy of the one-hot design with an intercept column.
  std::vector<double> xtx(size_t(p * p), 0), xty(size_t(p), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<int64_t> cols = {0};
    for (int32_t v : rows[i]) cols.push_back(1 + int64_t(v));
    for (int64_t a : cols) {
      xty[size_t(a)] += y[i];
      for (int64_t b : cols) xtx[size_t(a * p + b)] += 1;
    }
  }
  counts_.assign(names_.size(), 0);
  for (int64_t j = 1; j < p; ++j) counts_[size_t(j - 1)] = xtx[size_t(j * p + j)];
  // The noise and the fit depend on each other (the prior's weight is
  // noise^2 / prior_sd^2): a few rounds settle it.
  double noise = prior_noise_;
  constexpr double kPriorWeight = 2;  // pseudo-observations behind prior_noise
  for (int round = 0; round < 4; ++round) {
    std::vector<double> a = xtx;
    const double lambda = noise * noise / (prior_sd_ * prior_sd_);
    a[0] += 1e-9;  // the intercept's prior is flat
    for (int64_t j = 1; j < p; ++j) a[size_t(j * p + j)] += lambda;
    const bool ok = cholesky(a, p);
    assert(ok);
    (void)ok;
    cov_ = cholesky_inverse(a, p);
    beta_.assign(size_t(p), 0);
    for (int64_t i = 0; i < p; ++i)
      for (int64_t j = 0; j < p; ++j) beta_[size_t(i)] += cov_[size_t(i * p + j)] * xty[size_t(j)];
    // Residuals and the effective parameter count trace(A^-1 XᵀX).
    double rss = 0, df = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const double r = y[i] - mean(rows[i]);
      rss += r * r;
    }
    for (int64_t i = 0; i < p; ++i)
      for (int64_t j = 0; j < p; ++j) df += cov_[size_t(i * p + j)] * xtx[size_t(j * p + i)];
    const double dof = std::max(0.0, double(n_) - df);
    noise = std::max(noise_floor_, std::sqrt((kPriorWeight * prior_noise_ * prior_noise_ + rss) / (kPriorWeight + dof)));
  }
  noise_ = noise;
}

std::vector<std::pair<int64_t, double>> Surrogate::design(const std::vector<int32_t>& row,
                                                          int64_t& unmeasured) const {
  std::vector<std::pair<int64_t, double>> x = {{0, 1.0}};
  unmeasured = 0;
  for (int32_t v : row) {
    if (size_t(v) < counts_.size() && counts_[size_t(v)] > 0) {
      x.emplace_back(1 + int64_t(v), 1.0);
      continue;
    }
    ++unmeasured;
    // The axis's measured values, weighted by how often each was measured
    // (their weights sum to 1: every observation holds one value per axis).
    for (size_t u = 0; u < counts_.size(); ++u)
      if (axis_[u] == axis_[size_t(v)] && counts_[u] > 0) x.emplace_back(1 + int64_t(u), counts_[u] / double(n_));
  }
  return x;
}

double Surrogate::mean(const std::vector<int32_t>& row) const {
  if (beta_.empty()) return 0;
  int64_t unmeasured = 0;
  double s = 0;
  for (const auto& [col, w] : design(row, unmeasured)) s += w * beta_[size_t(col)];
  return s;
}

double Surrogate::spread(const std::vector<int32_t>& row) const {
  if (beta_.empty()) return std::sqrt(prior_noise_ * prior_noise_ + prior_sd_ * prior_sd_ * double(row.size()));
  // x^T A^-1 x over the design row, and the prior's variance for each value
  // never measured.
  int64_t unmeasured = 0;
  const auto x = design(row, unmeasured);
  double q = 0;
  for (const auto& [a, wa] : x)
    for (const auto& [b, wb] : x) q += wa * wb * cov_[size_t(a * p_ + b)];
  return std::sqrt(noise_ * noise_ * (1 + q) + prior_sd_ * prior_sd_ * double(unmeasured));
}

double Surrogate::effect(const std::string& value) const {
  const auto it = index_.find(value);
  if (it == index_.end() || beta_.empty() || size_t(it->second) >= counts_.size() || counts_[size_t(it->second)] == 0)
    return 0;
  return beta_[size_t(1 + it->second)];
}

}  // namespace weft::tuner
