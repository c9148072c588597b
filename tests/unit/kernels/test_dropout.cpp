// dropout: kept values are x / (1 - p) exactly as computed in Acc, dropped
// ones 0; the kept fraction is 1 - p within 5 standard deviations; the mask
// depends on the element's global index alone, so the rows of a cp rank
// and the columns of a tp rank see the mask the whole tensor sees; a new
// key draws a new mask; accumulate adds.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/dropout/dropout.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace weft::kernels::test {
namespace {

// The whole tensor of `samples` sequences of T tokens and `cols` features.
DropoutParams<float> whole(int64_t samples, int64_t T, int64_t cols, double p, uint64_t key, const float* x,
                           float* y) {
  return {.rows = samples * T, .cols = cols, .p = p, .key = key, .first_sample = 3, .seq = T, .local_seq = T,
          .cp = 1, .cp_rank = 0, .col_offset = 0, .full_cols = cols, .x = x, .y = y};
}

TEST(Dropout, KeepsOneMinusPScaled) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const double p : {0.05, 0.3, 0.7}) {
    const int64_t S = 4, T = 64, C = 96, n = S * T * C;
    const auto x = rng.uniform<float>(n, 0.5, 1.5);  // never 0: a 0 output is a dropped element
    std::vector<float> y(size_t(n), -1.0f);
    ASSERT_EQ(launch(whole(S, T, C, p, 42, x.data(), y.data()), {}), Status::ok);
    int64_t kept = 0;
    const float scale = 1.0f / (1.0f - float(p));
    for (int64_t i = 0; i < n; ++i) {
      if (y[size_t(i)] == 0.0f) continue;
      ++kept;
      ASSERT_EQ(y[size_t(i)], x[size_t(i)] * scale) << i;
    }
    const double sd = std::sqrt(double(n) * p * (1 - p));
    EXPECT_NEAR(double(kept), double(n) * (1 - p), 5 * sd) << "p " << p;
  }
}

TEST(Dropout, TheMaskFollowsTheGlobalIndexUnderCpAndTp) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t S = 2, T = 16, C = 12, cp = 2, tp = 3, piece = T / (2 * cp), Tl = T / cp, Cl = C / tp;
  const auto x = rng.uniform<float>(S * T * C, 0.5, 1.5);
  std::vector<float> y(x.size());
  ASSERT_EQ(launch(whole(S, T, C, 0.4, 7, x.data(), y.data()), {}), Status::ok);
  for (int64_t r = 0; r < cp; ++r)
    for (int64_t t = 0; t < tp; ++t) {
      // cp rank r holds chunks r and 2 cp - 1 - r of each sequence; tp rank t columns [t Cl, (t+1) Cl).
      std::vector<float> xl, yl(size_t(S * Tl * Cl));
      std::vector<int64_t> rows;
      for (int64_t s = 0; s < S; ++s)
        for (int64_t k = 0; k < 2; ++k)
          for (int64_t i = 0; i < piece; ++i) rows.push_back(s * T + (k == 0 ? r : 2 * cp - 1 - r) * piece + i);
      for (int64_t row : rows)
        for (int64_t c = 0; c < Cl; ++c) xl.push_back(x[size_t(row * C + t * Cl + c)]);
      DropoutParams<float> p = whole(S, T, C, 0.4, 7, xl.data(), yl.data());
      p.rows = S * Tl;
      p.cols = Cl;
      p.local_seq = Tl;
      p.cp = cp;
      p.cp_rank = r;
      p.col_offset = t * Cl;
      ASSERT_EQ(launch(p, {}), Status::ok);
      for (size_t i = 0; i < rows.size(); ++i)
        for (int64_t c = 0; c < Cl; ++c)
          ASSERT_EQ(yl[i * size_t(Cl) + size_t(c)], y[size_t(rows[i] * C + t * Cl + c)]) << "cp " << r << " tp " << t;
    }
}

TEST(Dropout, AnotherKeyAnotherMaskAndAccumulateAdds) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t S = 2, T = 32, C = 32;
  const auto x = rng.uniform<float>(S * T * C, 0.5, 1.5);
  std::vector<float> a(x.size()), b(x.size());
  ASSERT_EQ(launch(whole(S, T, C, 0.5, 1, x.data(), a.data()), {}), Status::ok);
  ASSERT_EQ(launch(whole(S, T, C, 0.5, 2, x.data(), b.data()), {}), Status::ok);
  int64_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += (a[i] == 0) != (b[i] == 0);
  EXPECT_GT(differ, int64_t(x.size()) / 4);
  std::vector<float> acc(x.size(), 1.0f);
  auto p = whole(S, T, C, 0.5, 1, x.data(), acc.data());
  p.write = Write::accumulate;
  ASSERT_EQ(launch(p, {}), Status::ok);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(acc[i], 1.0f + a[i]) << i;
  // Bad params are refused: p outside [0, 1), columns past full_cols.
  auto bad = whole(S, T, C, 1.0, 1, x.data(), b.data());
  EXPECT_EQ(launch(bad, {}), Status::invalid_argument);
  bad = whole(S, T, C, 0.5, 1, x.data(), b.data());
  bad.col_offset = 1;
  EXPECT_EQ(launch(bad, {}), Status::invalid_argument);
}

}  // namespace
}  // namespace weft::kernels::test
