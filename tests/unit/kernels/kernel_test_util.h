// Helpers for the kernel tests: seeded random inputs, the launch protocol
// with a heap workspace, the fp32 tolerance rule and finite differences.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernel.h"

namespace weft::kernels::test {

// Fresh random inputs on every run. The seed is printed with any failure;
// WEFT_TEST_SEED=<seed> replays it.
class Rng {
 public:
  Rng() : seed_(initial_seed()), gen_(seed_) {}

  std::string trace() const {
    return "random seed " + std::to_string(seed_) + " (replay: WEFT_TEST_SEED=" +
           std::to_string(seed_) + ")";
  }

  // Uniform in [lo, hi); a continuous draw is never exactly zero in practice,
  // so no gradient path is silently multiplied away.
  template <typename T>
  std::vector<T> uniform(int64_t n, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = static_cast<T>(dist(gen_));
    return v;
  }

  int64_t index(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(gen_); }

 private:
  static uint64_t initial_seed() {
    if (const char* s = std::getenv("WEFT_TEST_SEED")) return std::strtoull(s, nullptr, 10);
    std::random_device rd;
    return (uint64_t{rd()} << 32) | rd();
  }
  uint64_t seed_;
  std::mt19937_64 gen_;
};

template <typename To, typename From>
std::vector<To> cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// Launches through the protocol with a heap workspace of the size asked for.
template <typename P>
Status run(const P& p) {
  const int64_t bytes = workspace_bytes(p);
  std::vector<std::max_align_t> buffer(
      static_cast<size_t>((bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t)));
  return launch(p, Workspace{buffer.data(), bytes}, Stream{});
}

// For finite-difference losses, where a refused launch must stop the test.
template <typename P>
void run_or_throw(const P& p) {
  status_check(run(p), "under test");
}

// f() run with an OpenMP team of n threads (the setting is restored after),
// for checking that results do not depend on the thread count.
template <typename F>
auto with_threads(int n, F f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(n);
  auto result = f();
  omp_set_num_threads(saved);
  return result;
}

// ||got - ref|| / ||ref|| (absolute when ref is zero).
template <typename G>
double rel_l2(const std::vector<G>& got, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The tolerance rule for fp32 results: a kernel's relative L2 error against
// the fp64 reference may be at most kErrorMultiple times the error of a naive
// fp32 loop (the same reference code run in float) against that reference.
// 8 leaves room for a different but equally sound summation order. The error
// is floored at one fp32 epsilon, for results a naive loop happens to get
// exact (gathers, sums of a few terms) where a multiple of zero would demand
// bit-equality from a kernel that merely rounds in another order.
constexpr double kErrorMultiple = 8.0;

template <typename G>
void expect_within_rule(const std::string& what, const std::vector<G>& got,
                        const std::vector<float>& naive_fp32, const std::vector<double>& ref) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_EQ(naive_fp32.size(), ref.size()) << what;
  const double naive = rel_l2(naive_fp32, ref);
  const double bound =
      kErrorMultiple * std::max(naive, static_cast<double>(std::numeric_limits<float>::epsilon()));
  const double err = rel_l2(got, ref);
  EXPECT_LE(err, bound) << what << ": relative L2 error " << err << ", naive fp32 error " << naive;
}

// Central differences in double with step h = 1e-5 on inputs of order 1:
// truncation error ~h^2 |f'''| ~ 1e-10 and rounding ~eps |L| / h ~ 1e-11 |L|
// both sit orders of magnitude under kFdTolerance, while a wrong term in a
// gradient shows up at order 1.
constexpr double kFdStep = 1e-5;
constexpr double kFdTolerance = 1e-6;

// Relative L2 error between `analytic` and central differences of loss() with
// respect to x, over up to max_entries entries of x (all of them when there
// are fewer, else a random sample). x is restored afterwards.
inline double fd_error(std::vector<double>& x, const std::vector<double>& analytic,
                       const std::function<double()>& loss, Rng& rng, int64_t max_entries = 48) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<int64_t> entries;
  if (n <= max_entries) {
    for (int64_t i = 0; i < n; ++i) entries.push_back(i);
  } else {
    for (int64_t i = 0; i < max_entries; ++i) entries.push_back(rng.index(n));
  }
  std::vector<double> fd, an;
  // Hundreds of small launches: on one thread they pay no fork and join each
  // (the analytic gradient, computed by the caller, used the whole team).
  with_threads(1, [&] {
    for (int64_t i : entries) {
      const double saved = x[i];
      x[i] = saved + kFdStep;
      const double up = loss();
      x[i] = saved - kFdStep;
      const double down = loss();
      x[i] = saved;
      fd.push_back((up - down) / (2 * kFdStep));
      an.push_back(analytic[i]);
    }
    return 0;
  });
  // A gradient that is zero in exact arithmetic (a softmax over one key) is
  // compared absolutely: its differences are rounding noise.
  double diff = 0, norm_fd = 0, norm_an = 0;
  for (size_t i = 0; i < fd.size(); ++i) {
    diff += (an[i] - fd[i]) * (an[i] - fd[i]);
    norm_fd += fd[i] * fd[i];
    norm_an += an[i] * an[i];
  }
  const double scale = std::sqrt(std::max(norm_fd, norm_an));
  return scale > 1e-8 ? std::sqrt(diff) / scale : std::sqrt(diff);
}

// sum_i r_i * y_i: the scalar whose gradient with respect to y is r.
template <typename T>
double dot(const std::vector<T>& r, const std::vector<T>& y) {
  double s = 0;
  for (size_t i = 0; i < r.size(); ++i) s += static_cast<double>(r[i]) * static_cast<double>(y[i]);
  return s;
}

}  // namespace weft::kernels::test
