// The fp8 ops' CPU backend (kernels/fp8/fp8_ops.h), the oracle of the CUDA
// one: the cast against fp8_quantize element by element (codes, transposed
// codes, amax, health counts, the same for one and two threads, and the
// params it refuses), the amax and the delayed-scaling update
// against rules written out here, and the FP8 GEMM against the fp64 product
// of the same decoded operands (the tolerance rule of kernel_test_util.h) and
// against the product of the unquantised values (the elementwise bound of
// fp8_reference.h). Inputs are fresh random values on every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <tuple>
#include <vector>

#include "core/layout.h"
#include "fp8_reference.h"
#include "kernel_test_util.h"
#include "kernels/fp8/fp8_ops.h"

namespace weft::kernels {
namespace {

using test::Rng;
using test::run;

constexpr Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

// Values over more binades than the format holds (E4M3 about 18 below its
// max, E5M2 about 32), so one cast meets normal codes, subnormal codes,
// underflow to zero and (with the scales the tests use) saturation.
std::vector<float> spread_values(Rng& rng, int64_t n, Fp8Format f) {
  std::vector<float> x = rng.uniform<float>(n);
  const std::vector<float> e = rng.uniform<float>(n, f == Fp8Format::e4m3 ? -22.0 : -38.0, 2.0);
  for (int64_t i = 0; i < n; ++i) x[i] *= std::exp2(e[i]);
  return x;
}

struct Shape {
  int64_t rows, cols;
};
constexpr Shape kCastShapes[] = {{1, 1}, {5, 3}, {113, 37}, {1, 1000}, {64, 48}};

TEST(Fp8Ops, CastMatchesQuantizeCodeForCode) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const Fp8Format f : kFormats) {
    for (const Shape s : kCastShapes) {
      SCOPED_TRACE(std::string(to_string(f)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols));
      const int64_t n = s.rows * s.cols;
      const std::vector<float> x = spread_values(rng, n, f);
      // Half the amax's scale: the largest values saturate.
      const float scale = 2.0f * fp8_scale(fp8_amax(x.data(), n), f);
      std::vector<Fp8> out(n), out_t(n);
      float amax = -1.0f;
      Fp8Health health{3, 4};  // counts are added to
      const Fp8CastParams<float> p{.rows = s.rows,
                                   .cols = s.cols,
                                   .format = f,
                                   .x = x.data(),
                                   .scale = &scale,
                                   .out = out.data(),
                                   .out_t = out_t.data(),
                                   .amax = &amax,
                                   .health = &health};
      ASSERT_TRUE(supports(p));
      EXPECT_EQ(workspace_bytes(p), 0);
      ASSERT_EQ(run(p), Status::ok);
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t c = 0; c < s.cols; ++c) {
          const uint8_t want = fp8_quantize(x[r * s.cols + c], scale, f);
          ASSERT_EQ(out[r * s.cols + c].bits, want) << "element " << r << "," << c;
          ASSERT_EQ(out_t[c * s.rows + r].bits, want) << "transposed element " << r << "," << c;
        }
      EXPECT_EQ(amax, fp8_amax(x.data(), n));
      std::vector<float> y(n);
      const Fp8Health want = fp8_qdq(x.data(), y.data(), n, scale, f);
      EXPECT_EQ(health.overflow, want.overflow + 3);
      EXPECT_EQ(health.underflow, want.underflow + 4);
      if (n >= 1000) {
        // The inputs reach every case the counts tell apart.
        EXPECT_GT(want.overflow, 0);
        EXPECT_GT(want.underflow, 0);
      }

      // The double instantiation casts the values rounded to fp32: the same codes.
      const std::vector<double> xd(x.begin(), x.end());
      std::vector<Fp8> out_d(n);
      ASSERT_EQ(run(Fp8CastParams<double>{.rows = s.rows,
                                          .cols = s.cols,
                                          .format = f,
                                          .x = xd.data(),
                                          .scale = &scale,
                                          .out = out_d.data()}),
                Status::ok);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out_d[i].bits, out[i].bits) << i;
    }
  }
}

// A transpose with a row stride past the rows (ld_t): each of its rows holds
// the codes of the plain transpose, then zeros to the stride, whatever the
// buffer held before; and the padded operand's FP8 GEMM over k = ld_t gives
// the unpadded product (a weight gradient over a run of tokens that is not a
// multiple of 16).
TEST(Fp8Ops, CastPadsTheTransposeWithZeroCodes) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const Shape s : {Shape{13, 32}, Shape{0, 16}, Shape{16, 48}, Shape{37, 16}}) {
    SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols));
    const int64_t n = s.rows * s.cols, ld = (s.rows + 15) / 16 * 16 + (s.rows % 16 == 0 ? 16 : 0);
    const std::vector<float> x = spread_values(rng, n, Fp8Format::e4m3);
    const float scale = fp8_scale(std::max(fp8_amax(x.data(), n), 1e-3f), Fp8Format::e4m3);
    std::vector<Fp8> out(n), plain_t(n), padded_t(s.cols * ld);
    for (Fp8& q : padded_t) q.bits = 0x5a;  // stale codes the padding must overwrite
    Fp8CastParams<float> p{.rows = s.rows, .cols = s.cols, .x = x.data(), .scale = &scale, .out = out.data(),
                           .out_t = plain_t.data()};
    ASSERT_EQ(run(p), Status::ok);
    p.out_t = padded_t.data();
    p.ld_t = ld;
    ASSERT_TRUE(supports(p));
    ASSERT_EQ(run(p), Status::ok);
    for (int64_t c = 0; c < s.cols; ++c)
      for (int64_t r = 0; r < ld; ++r)
        ASSERT_EQ(padded_t[c * ld + r].bits, r < s.rows ? plain_t[c * s.rows + r].bits : 0) << c << "," << r;
    if (n == 0) continue;
    // (cols, cols) = x^T x over the rows, padded and not.
    const float inv = 1.0f / scale;
    std::vector<float> plain(s.cols * s.cols), padded(s.cols * s.cols);
    const auto gemm = [&](const std::vector<Fp8>& a, int64_t k, std::vector<float>& c) {
      return run(Fp8GemmParams<float>{.m = s.cols, .n = s.cols, .k = k, .a = a.data(), .lda = k,
                                      .a_scale_inv = &inv, .b = a.data(), .ldb = k, .b_scale_inv = &inv,
                                      .c = c.data(), .ldc = s.cols});
    };
    ASSERT_EQ(gemm(plain_t, s.rows, plain), Status::ok);
    ASSERT_EQ(gemm(padded_t, ld, padded), Status::ok);
    // Equal up to the order of the fp32 sums: 2^-20 of the terms' magnitudes.
    for (int64_t i = 0; i < s.cols; ++i)
      for (int64_t j = 0; j < s.cols; ++j) {
        double mag = 0;
        for (int64_t r = 0; r < s.rows; ++r)
          mag += std::fabs(double(fp8_decode(plain_t[i * s.rows + r].bits, Fp8Format::e4m3) * inv) *
                           double(fp8_decode(plain_t[j * s.rows + r].bits, Fp8Format::e4m3) * inv));
        ASSERT_NEAR(padded[i * s.cols + j], plain[i * s.cols + j], std::ldexp(mag, -20) + 1e-30) << i << "," << j;
      }
  }
  // A stride below the rows, or one without a transpose, is refused.
  std::vector<Fp8> out(6), out_t(6);
  const std::vector<float> x(6, 1.0f);
  const float scale = 1.0f;
  Fp8CastParams<float> p{.rows = 3, .cols = 2, .x = x.data(), .scale = &scale, .out = out.data(),
                         .out_t = out_t.data(), .ld_t = 2};
  EXPECT_FALSE(supports(p));
  EXPECT_EQ(run(p), Status::invalid_argument);
  p.out_t = nullptr;
  p.ld_t = 3;
  EXPECT_EQ(run(p), Status::invalid_argument);
}

TEST(Fp8Ops, CastAmaxAccumulatesAndKeepsNaN) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  std::vector<float> x = rng.uniform<float>(50);
  const float scale = 1.0f;
  std::vector<Fp8> out(50);
  float amax = 7.0f;  // above every |x|: accumulate keeps it
  Fp8CastParams<float> p{.rows = 5,
                         .cols = 10,
                         .x = x.data(),
                         .scale = &scale,
                         .out = out.data(),
                         .amax = &amax,
                         .amax_write = Write::accumulate};
  ASSERT_EQ(run(p), Status::ok);
  EXPECT_EQ(amax, 7.0f);
  amax = 0.0f;
  ASSERT_EQ(run(p), Status::ok);
  EXPECT_EQ(amax, fp8_amax(x.data(), 50));
  x[17] = NAN;
  ASSERT_EQ(run(p), Status::ok);
  EXPECT_TRUE(std::isnan(amax));
  EXPECT_EQ(out[17].bits & 0x7f, 0x7f);  // NaN stays NaN
}

TEST(Fp8Ops, AmaxOfTensors) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (int64_t n : {0, 1, 7, 4099}) {
    const std::vector<float> x = rng.uniform<float>(n, -3.0, 2.0);
    float amax = -1.0f;
    ASSERT_EQ(run(Fp8AmaxParams<float>{.n = n, .x = x.data(), .amax = &amax}), Status::ok);
    float want = 0.0f;
    for (float v : x) want = std::max(want, std::fabs(v));
    EXPECT_EQ(amax, want) << n;
    const std::vector<double> xd(x.begin(), x.end());
    float amax_d = 100.0f;
    ASSERT_EQ(run(Fp8AmaxParams<double>{.n = n, .x = xd.data(), .amax = &amax_d, .write = Write::accumulate}),
              Status::ok);
    EXPECT_EQ(amax_d, 100.0f);
  }
  float amax = 0;
  EXPECT_FALSE(supports(Fp8AmaxParams<float>{.n = 3, .x = nullptr, .amax = &amax}));
  EXPECT_EQ(run(Fp8AmaxParams<float>{.n = 3, .x = nullptr, .amax = &amax}), Status::invalid_argument);
}

TEST(Fp8Ops, CastRefusesInvalidParamsAndRepeatsAcrossThreadCounts) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t rows = 300, cols = 257;
  const std::vector<float> x = spread_values(rng, rows * cols, Fp8Format::e4m3);
  const float scale = 2.0f * fp8_scale(fp8_amax(x.data(), rows * cols), Fp8Format::e4m3);
  auto cast = [&] {
    std::vector<Fp8> out(rows * cols), out_t(rows * cols);
    float amax = 0;
    Fp8Health health;
    EXPECT_EQ(run(Fp8CastParams<float>{.rows = rows,
                                       .cols = cols,
                                       .x = x.data(),
                                       .scale = &scale,
                                       .out = out.data(),
                                       .out_t = out_t.data(),
                                       .amax = &amax,
                                       .health = &health}),
              Status::ok);
    std::vector<uint8_t> bits;
    for (const Fp8 q : out) bits.push_back(q.bits);
    for (const Fp8 q : out_t) bits.push_back(q.bits);
    return std::tuple{bits, amax, health.overflow, health.underflow};
  };
  EXPECT_EQ(test::with_threads(1, cast), test::with_threads(2, cast));

  std::vector<Fp8> out(6);
  const Fp8CastParams<float> ok{.rows = 2, .cols = 3, .x = x.data(), .scale = &scale, .out = out.data()};
  EXPECT_TRUE(supports(ok));
  EXPECT_FALSE(supports(ok, Backend::cuda));
  auto refused = [](const Fp8CastParams<float>& p) {
    EXPECT_FALSE(supports(p));
    EXPECT_EQ(run(p), Status::invalid_argument);
  };
  Fp8CastParams<float> p = ok;
  p.scale = nullptr;
  refused(p);
  p = ok, p.out = nullptr;
  refused(p);
  p = ok, p.rows = -1;
  refused(p);
  // An empty tensor needs no scale; its amax is 0.
  float amax = 5.0f;
  EXPECT_EQ(run(Fp8CastParams<float>{.rows = 0, .cols = 3, .amax = &amax}), Status::ok);
  EXPECT_EQ(amax, 0.0f);

  float h[4] = {}, sc = 1, si = 1, a = 1;
  EXPECT_EQ(run(Fp8ScaleUpdateParams<float>{
                .count = 1, .history_len = 0, .amax = &a, .history = h, .scale = &sc, .scale_inv = &si}),
            Status::invalid_argument);
  EXPECT_EQ(run(Fp8ScaleUpdateParams<float>{
                .count = 1, .history_len = 4, .amax = &a, .history = h, .scale = &sc, .scale_inv = nullptr}),
            Status::invalid_argument);
  EXPECT_EQ(run(Fp8ScaleUpdateParams<float>{.count = 1, .history_len = 4, .amax = &a, .history = h, .scale = &sc,
                                            .scale_inv = &si, .scale_inv_stride = 0}),
            Status::invalid_argument);
}

// The delayed-scaling rule, written independently: the last history_len
// finite amaxes, newest first; the scale from their max. The scale_invs
// packed (E4M3) or 4 floats apart (E5M2: the trainer's 16-byte aligned
// table), the floats between them untouched.
TEST(Fp8Ops, ScaleUpdateRollsTheHistory) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t tensors = 5, len = kFp8DelayedHistory;
  for (const Fp8Format f : kFormats) {
    const int64_t stride = f == Fp8Format::e4m3 ? 1 : 4;
    std::vector<float> history(tensors * len, 0.0f), scale(tensors, 1.0f), scale_inv(tensors * stride, -7.0f);
    std::vector<std::deque<float>> kept(tensors);
    std::vector<float> want_scale(tensors, 1.0f);
    for (int step = 0; step < 40; ++step) {
      std::vector<float> amax = rng.uniform<float>(tensors, 0.0, 10.0);
      for (float& a : amax) a = a * std::exp2(float(rng.index(8)) - 4.0f);
      if (step == 3) amax[1] = NAN;                                     // not recorded
      if (step == 4) amax[2] = std::numeric_limits<float>::infinity();  // not recorded
      if (step < 2) amax[3] = 0.0f;                                     // all-zero tensor: scale 1
      if (step == 30) amax[4] = 1000.0f;                                // a spike, then ages out
      ASSERT_EQ(run(Fp8ScaleUpdateParams<float>{.count = tensors,
                                                .history_len = len,
                                                .format = f,
                                                .amax = amax.data(),
                                                .history = history.data(),
                                                .scale = scale.data(),
                                                .scale_inv = scale_inv.data(),
                                                .scale_inv_stride = stride}),
                Status::ok);
      for (int64_t t = 0; t < tensors; ++t) {
        if (std::isfinite(amax[t])) {
          kept[t].push_front(amax[t]);
          if (int64_t(kept[t].size()) > len) kept[t].pop_back();
          const float m = *std::max_element(kept[t].begin(), kept[t].end());
          want_scale[t] = m == 0.0f ? 1.0f : fp8_max(f) / m;
        }
        ASSERT_EQ(scale[t], want_scale[t]) << "step " << step << " tensor " << t;
        ASSERT_EQ(scale_inv[t * stride], 1.0f / want_scale[t]) << "step " << step << " tensor " << t;
        for (int64_t i = 1; i < stride; ++i) ASSERT_EQ(scale_inv[t * stride + i], -7.0f) << "tensor " << t;
        for (int64_t i = 0; i < int64_t(kept[t].size()); ++i)
          ASSERT_EQ(history[t * len + i], kept[t][i]) << "step " << step << " tensor " << t << " entry " << i;
      }
    }
    EXPECT_EQ(scale[4], fp8_max(f) / *std::max_element(kept[4].begin(), kept[4].end()));
  }
}

// A GEMM case: m, n, k, padding of the leading dimensions, formats, alpha, beta.
struct GemmCase {
  int64_t m, n, k, pad;
  Fp8Format fa, fb;
  float alpha, beta;
};

constexpr GemmCase kGemmCases[] = {
    {5, 3, 113, 0, Fp8Format::e4m3, Fp8Format::e4m3, 1.0f, 0.0f},
    {37, 19, 64, 3, Fp8Format::e5m2, Fp8Format::e4m3, 1.0f, 1.0f},
    {16, 48, 256, 0, Fp8Format::e4m3, Fp8Format::e5m2, 0.5f, -1.0f},
    {64, 32, 1000, 5, Fp8Format::e4m3, Fp8Format::e4m3, 1.0f, 1.0f},
};

TEST(Fp8Ops, GemmMatchesTheDecodedProductAndTheFp8Bound) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const GemmCase& g : kGemmCases) {
    SCOPED_TRACE(std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) + " " +
                 to_string(g.fa) + "x" + to_string(g.fb));
    const std::vector<float> a = rng.uniform<float>(g.m * g.k), b = rng.uniform<float>(g.n * g.k);
    const test::Fp8Operand qa = test::fp8_operand(a, g.fa), qb = test::fp8_operand(b, g.fb);
    // The codes at padded leading dimensions; padding holds NaN codes.
    const int64_t lda = g.k + g.pad, ldb = g.k + g.pad, ldc = g.n + g.pad;
    std::vector<Fp8> pa(g.m * lda, Fp8{0x7f}), pb(g.n * ldb, Fp8{0x7f});
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t l = 0; l < g.k; ++l) pa[i * lda + l] = qa.codes[i * g.k + l];
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t l = 0; l < g.k; ++l) pb[j * ldb + l] = qb.codes[j * g.k + l];
    const std::vector<float> c0 = rng.uniform<float>(g.m * ldc);

    // fp64 and naive fp32 references on the decoded values.
    std::vector<double> ref = test::gemm_nt_f64(qa.decoded, qb.decoded, g.m, g.n, g.k);
    std::vector<float> naive(g.m * g.n);
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float s = 0;
        for (int64_t l = 0; l < g.k; ++l)
          s += float(qa.decoded[i * g.k + l]) * float(qb.decoded[j * g.k + l]);
        const float c = g.beta == 0.0f ? 0.0f : g.beta * c0[i * ldc + j];
        naive[i * g.n + j] = g.alpha * s + c;
        ref[i * g.n + j] =
            double(g.alpha) * ref[i * g.n + j] + (g.beta == 0.0f ? 0.0 : double(g.beta) * c0[i * ldc + j]);
      }

    auto params = [&](auto* c) {
      using C = std::remove_pointer_t<decltype(c)>;
      return Fp8GemmParams<C>{.m = g.m,
                              .n = g.n,
                              .k = g.k,
                              .alpha = g.alpha,
                              .beta = g.beta,
                              .a = pa.data(),
                              .lda = lda,
                              .a_format = g.fa,
                              .a_scale_inv = &qa.scale_inv,
                              .b = pb.data(),
                              .ldb = ldb,
                              .b_format = g.fb,
                              .b_scale_inv = &qb.scale_inv,
                              .c = c,
                              .ldc = ldc};
    };
    std::vector<float> c = c0;
    if (g.beta == 0.0f)
      for (float& v : c) v = NAN;  // beta = 0 must not read C
    const Fp8GemmParams<float> p = params(c.data());
    ASSERT_TRUE(supports(p));
    EXPECT_GE(workspace_bytes(p), int64_t(sizeof(float)) * (g.m * g.k + g.n * g.k));  // the decoded operands
    ASSERT_EQ(run(p), Status::ok);
    std::vector<float> got(g.m * g.n);
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) got[i * g.n + j] = c[i * ldc + j];
    test::expect_within_rule("fp32 C", got, naive, ref);
    // The padding of C is not written.
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = g.n; j < ldc; ++j) {
        if (g.beta == 0.0f)
          ASSERT_TRUE(std::isnan(c[i * ldc + j]));
        else
          ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
      }

    // The accumulating form is the same product for fp32.
    std::vector<float> c_acc = c0;
    const Fp8GemmAccParams<float> pacc{.m = g.m,
                                       .n = g.n,
                                       .k = g.k,
                                       .alpha = g.alpha,
                                       .beta = g.beta,
                                       .a = pa.data(),
                                       .lda = lda,
                                       .a_format = g.fa,
                                       .a_scale_inv = &qa.scale_inv,
                                       .b = pb.data(),
                                       .ldb = ldb,
                                       .b_format = g.fb,
                                       .b_scale_inv = &qb.scale_inv,
                                       .c = c_acc.data(),
                                       .ldc = ldc,
                                       .accumulation = Fp8Accumulation::fast};
    ASSERT_EQ(run(pacc), Status::ok);
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) ASSERT_EQ(c_acc[i * ldc + j], c[i * ldc + j]);

    // The double instantiation: the decoded product in fp64 (the scale_invs
    // multiply in fp32 as on every backend, then the sum runs in double).
    std::vector<double> cd(c0.begin(), c0.end());
    ASSERT_EQ(run(params(cd.data())), Status::ok);
    double worst = 0;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j)
        worst = std::max(worst,
                         std::fabs(cd[i * ldc + j] - ref[i * g.n + j]) / (1 + std::fabs(ref[i * g.n + j])));
    EXPECT_LE(worst, 1e-12);

    // Against the product of the unquantised operands: within the FP8 bound
    // (fp8_reference.h) on every element, and not trivially so: the bound is
    // the sum of per-term worst cases, the error a random walk well under it.
    if (g.alpha == 1.0f && g.beta == 0.0f) {
      const std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
      const std::vector<double> exact = test::gemm_nt_f64(ad, bd, g.m, g.n, g.k);
      const std::vector<double> bound = test::fp8_gemm_bound(ad, qa, bd, qb, g.m, g.n, g.k);
      for (int64_t i = 0; i < g.m * g.n; ++i)
        ASSERT_LE(std::fabs(double(got[i]) - exact[i]), bound[i]) << "element " << i;
      EXPECT_GT(test::rel_l2(got, exact), 1e-4);  // the quantisation is really there
    }
  }
}

TEST(Fp8Ops, GemmRefusesInvalidParams) {
  std::vector<Fp8> a(16 * 16), b(16 * 16);
  std::vector<float> c(16 * 16);
  const float one = 1.0f;
  const Fp8GemmParams<float> ok{.m = 16,
                                .n = 16,
                                .k = 16,
                                .a = a.data(),
                                .lda = 16,
                                .a_scale_inv = &one,
                                .b = b.data(),
                                .ldb = 16,
                                .b_scale_inv = &one,
                                .c = c.data(),
                                .ldc = 16};
  EXPECT_TRUE(supports(ok));
  EXPECT_FALSE(supports(ok, Backend::cuda));  // float runs on the CPU only
  auto refused = [](Fp8GemmParams<float> p) {
    EXPECT_FALSE(supports(p));
    EXPECT_EQ(run(p), Status::invalid_argument);
  };
  Fp8GemmParams<float> p = ok;
  p.a_format = p.b_format = Fp8Format::e5m2;  // no such FP8 kernel
  refused(p);
  p = ok, p.lda = 15;
  refused(p);
  p = ok, p.b_scale_inv = nullptr;
  refused(p);
  p = ok, p.m = -1;
  refused(p);
  // k = 0: C = beta C, no operands read.
  std::vector<float> c2(6, 2.0f);
  ASSERT_EQ(run(Fp8GemmParams<float>{
                .m = 2, .n = 3, .k = 0, .beta = 0.5f, .lda = 1, .ldb = 1, .c = c2.data(), .ldc = 3}),
            Status::ok);
  for (float v : c2) EXPECT_EQ(v, 1.0f);
}

}  // namespace
}  // namespace weft::kernels
