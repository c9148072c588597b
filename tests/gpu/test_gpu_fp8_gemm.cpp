// The FP8 GEMM on CUDA (kernels/fp8/fp8_gemm.cu, cuBLASLt) against fp64
// references, the CPU backend and the bf16 GEMM:
//
//   GEMM:          against the fp64 product of the same decoded codes, with
//                  a stated tolerance for the FP8 tensor cores' accumulation
//                  (below), and element by element within the FP8 error bound
//                  of fp8_reference.h against the exact product of the bf16
//                  values and against cuBLASLt's bf16 GEMM of them.
//
// The GEMM's accumulation tolerance. Hopper's FP8 tensor cores add products
// into partial sums that keep fewer bits than fp32 (about 14, NVIDIA does not
// document it); with split accumulation the partial sums are promoted into
// fp32 every few k-steps, with fast accumulation they are not. So the
// relative L2 error against the fp64 product of the decoded operands may be
//   split: at most 2^-10    fast: at most 2^-6
// plus, for a bf16 C, 2^-8 (its rounding). An indexing, transpose or scale
// bug gives errors of order 1, FP8 quantisation itself (which both sides
// share here) none. Each case prints the measured errors, so a run records
// how far under these the hardware is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8/fp8_ops.h"
#include "kernels/gemm/gemm.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/fp8_reference.h"

namespace weft::kernels::test {
namespace {

double acc_tolerance(Fp8Accumulation a) { return a == Fp8Accumulation::split ? 1.0 / 1024 : 1.0 / 64; }

struct GemmShape {
  int64_t m, n, k;
};

// A (m, k) and B (n, k) random bf16, their codes and decoded values.
struct Operands {
  Bf16Values a, b;
  Fp8Operand qa, qb;
};
Operands operands(Rng& rng, const GemmShape& s, Fp8Format fa, Fp8Format fb, double lo = -1.0) {
  Operands o{random_bf16(rng, s.m * s.k, lo, 1.0), random_bf16(rng, s.n * s.k, lo, 1.0), {}, {}};
  o.qa = fp8_operand(o.a.f, fa);
  o.qb = fp8_operand(o.b.f, fb);
  return o;
}

// The GPU FP8 GEMM of the operands' codes: C in bf16 (beta = 0) or fp32
// (starting from c0 with beta = 1), as doubles.
std::vector<double> gpu_fp8_gemm(const Operands& o, const GemmShape& s, Fp8Accumulation acc, bool fp32_c,
                                 const std::vector<float>& c0 = {}) {
  DeviceArray<Fp8> da(o.qa.codes), db(o.qb.codes);
  DeviceArray<float> dsa(std::vector<float>{o.qa.scale_inv}), dsb(std::vector<float>{o.qb.scale_inv});
  std::vector<double> out;
  if (fp32_c) {
    DeviceArray<float> dc(c0);
    const Fp8GemmAccParams<bf16> p{.m = s.m,
                                   .n = s.n,
                                   .k = s.k,
                                   .beta = 1.0f,
                                   .a = da.data(),
                                   .lda = s.k,
                                   .a_format = o.qa.format,
                                   .a_scale_inv = dsa.data(),
                                   .b = db.data(),
                                   .ldb = s.k,
                                   .b_format = o.qb.format,
                                   .b_scale_inv = dsb.data(),
                                   .c = dc.data(),
                                   .ldc = s.n,
                                   .accumulation = acc};
    EXPECT_EQ(run_cuda(p), Status::ok);
    for (float v : dc.download()) out.push_back(v);
  } else {
    DeviceArray<bf16> dc(s.m * s.n);
    const Fp8GemmParams<bf16> p{.m = s.m,
                                .n = s.n,
                                .k = s.k,
                                .a = da.data(),
                                .lda = s.k,
                                .a_format = o.qa.format,
                                .a_scale_inv = dsa.data(),
                                .b = db.data(),
                                .ldb = s.k,
                                .b_format = o.qb.format,
                                .b_scale_inv = dsb.data(),
                                .c = dc.data(),
                                .ldc = s.n,
                                .accumulation = acc};
    EXPECT_EQ(run_cuda(p), Status::ok);
    for (bf16 v : dc.download()) out.push_back(bf16_to_float(v));
  }
  return out;
}

struct GemmCase {
  GemmShape shape;
  Fp8Format fa, fb;
};

TEST(GpuFp8Gemm, MatchesTheDecodedProduct) {
  if (!fp8_gemm_here()) GTEST_SKIP() << "no FP8 tensor cores (sm_89 or newer) on this device";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const GemmCase cases[] = {
      {{16, 16, 16}, Fp8Format::e4m3, Fp8Format::e4m3},    {{64, 48, 128}, Fp8Format::e4m3, Fp8Format::e4m3},
      {{256, 320, 512}, Fp8Format::e5m2, Fp8Format::e4m3},  // dgrad: dy x W^T
      {{128, 96, 4096}, Fp8Format::e5m2, Fp8Format::e4m3},  // wgrad-like: long k
      {{96, 128, 1024}, Fp8Format::e4m3, Fp8Format::e5m2},
      // m free under per-tensor scales: an expert's run of tokens, any count.
      {{13, 64, 128}, Fp8Format::e4m3, Fp8Format::e4m3},    {{1, 32, 64}, Fp8Format::e5m2, Fp8Format::e4m3},
      {{203, 48, 256}, Fp8Format::e4m3, Fp8Format::e4m3},
  };
  for (const GemmCase& g : cases) {
    const GemmShape& s = g.shape;
    const Operands o = operands(rng, s, g.fa, g.fb);
    // The CPU backend on the same codes (the naive fp32 result) and the fp64 reference.
    std::vector<float> cpu(s.m * s.n);
    ASSERT_EQ(run(Fp8GemmParams<float>{.m = s.m,
                                       .n = s.n,
                                       .k = s.k,
                                       .a = o.qa.codes.data(),
                                       .lda = s.k,
                                       .a_format = g.fa,
                                       .a_scale_inv = &o.qa.scale_inv,
                                       .b = o.qb.codes.data(),
                                       .ldb = s.k,
                                       .b_format = g.fb,
                                       .b_scale_inv = &o.qb.scale_inv,
                                       .c = cpu.data(),
                                       .ldc = s.n}),
              Status::ok);
    const std::vector<double> ref = gemm_nt_f64(o.qa.decoded, o.qb.decoded, s.m, s.n, s.k);
    const std::vector<float> c0 = rng.uniform<float>(s.m * s.n);
    std::vector<double> ref_acc = ref;
    for (size_t i = 0; i < ref.size(); ++i) ref_acc[i] += c0[i];
    for (const Fp8Accumulation acc : {Fp8Accumulation::split, Fp8Accumulation::fast}) {
      const std::string what = std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
                               " " + to_string(g.fa) + "x" + to_string(g.fb) + " " + to_string(acc);
      SCOPED_TRACE(what);
      const double tol = acc_tolerance(acc);
      const double err_bf16 = rel_l2(gpu_fp8_gemm(o, s, acc, false), ref);
      const double err_fp32 = rel_l2(gpu_fp8_gemm(o, s, acc, true, c0), ref_acc);
      std::printf(
          "fp8 gemm %s: rel L2 error vs fp64 of the decoded operands: bf16 C %.3g, fp32 C (beta 1) %.3g; "
          "CPU fp32 %.3g\n",
          what.c_str(), err_bf16, err_fp32, rel_l2(cpu, ref));
      EXPECT_LE(err_bf16, tol + 1.0 / 256);
      EXPECT_LE(err_fp32, tol);
    }
  }
}

// Fast against split accumulation on a long, all-positive sum (wgrad's k is
// every token): no cancellation, so the partial sums grow and a fast
// accumulator that is never promoted loses the most; split must be no worse.
TEST(GpuFp8Gemm, SplitAccumulationIsNoWorseThanFast) {
  if (!fp8_gemm_here()) GTEST_SKIP() << "no FP8 tensor cores (sm_89 or newer) on this device";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const GemmShape s{64, 64, 16384};
  const Operands o = operands(rng, s, Fp8Format::e5m2, Fp8Format::e4m3, 0.0);
  const std::vector<double> ref = gemm_nt_f64(o.qa.decoded, o.qb.decoded, s.m, s.n, s.k);
  const std::vector<float> zeros(s.m * s.n, 0.0f);
  const double split = rel_l2(gpu_fp8_gemm(o, s, Fp8Accumulation::split, true, zeros), ref);
  const double fast = rel_l2(gpu_fp8_gemm(o, s, Fp8Accumulation::fast, true, zeros), ref);
  std::printf("fp8 gemm 64x64x16384 all-positive, fp32 C: rel L2 error split %.3g, fast %.3g\n", split, fast);
  // Fast accumulation has no bound of its own on so long a sum (an H200 lost
  // 4.0% here, against 0.036% split): the trainer uses it only in the forward,
  // whose k is one layer's width, as the public FP8 recipes do.
  EXPECT_LE(split, acc_tolerance(Fp8Accumulation::split));
  EXPECT_LE(split, fast);
}

// The trainer's shapes (tiny model: k = C = 128, n = 64 and 128 output
// features, m = 128 and 256 tokens), with the per-tensor scales read from
// one device array at 4-byte offsets, as the trainer's scaling table holds
// them, and from arrays of their own.
TEST(GpuFp8Gemm, TrainerShapesWithScalesFromOneArray) {
  if (!fp8_gemm_here()) GTEST_SKIP() << "no FP8 tensor cores (sm_89 or newer) on this device";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const GemmShape s : {GemmShape{256, 64, 128}, GemmShape{128, 64, 128}, GemmShape{256, 128, 128}}) {
    const Operands o = operands(rng, s, Fp8Format::e4m3, Fp8Format::e4m3);
    const std::vector<double> ref = gemm_nt_f64(o.qa.decoded, o.qb.decoded, s.m, s.n, s.k);
    for (const int first : {0, 1}) {
      SCOPED_TRACE(std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k) +
                   " scales at float offsets " + std::to_string(first) + " and " + std::to_string(first + 1));
      std::vector<float> table(8, 1.0f);
      table[size_t(first)] = o.qa.scale_inv;
      table[size_t(first) + 1] = o.qb.scale_inv;
      DeviceArray<Fp8> da(o.qa.codes), db(o.qb.codes);
      DeviceArray<float> scales(table);
      DeviceArray<bf16> dc(s.m * s.n);
      for (const Fp8Accumulation acc : {Fp8Accumulation::fast, Fp8Accumulation::split}) {
        const Fp8GemmParams<bf16> p{.m = s.m, .n = s.n, .k = s.k, .a = da.data(), .lda = s.k,
                                    .a_format = Fp8Format::e4m3, .a_scale_inv = scales.data() + first,
                                    .b = db.data(), .ldb = s.k, .b_format = Fp8Format::e4m3,
                                    .b_scale_inv = scales.data() + first + 1, .c = dc.data(), .ldc = s.n,
                                    .accumulation = acc};
        ASSERT_EQ(run_cuda(p), Status::ok);
        std::vector<double> got;
        for (bf16 v : dc.download()) got.push_back(bf16_to_float(v));
        EXPECT_LE(rel_l2(got, ref), acc_tolerance(acc) + 1.0 / 256) << to_string(acc);
      }
    }
  }
}

// Against the unquantised bf16 values: the FP8 GEMM within the elementwise
// bound of fp8_reference.h (its fp32 accumulation term replaced by this
// file's accumulation tolerance, acc_tolerance * sum |a^ b^|), and against
// cuBLASLt's bf16 GEMM of those values within that bound plus the bf16
// GEMM's own: 2^-8 |C_bf16| (its output rounding) + k 2^-24 sum |a b|.
TEST(GpuFp8Gemm, WithinTheFp8BoundOfTheBf16Gemm) {
  if (!fp8_gemm_here()) GTEST_SKIP() << "no FP8 tensor cores (sm_89 or newer) on this device";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const GemmShape s{128, 160, 1024};
  for (const auto& [fa, fb] :
       {std::pair{Fp8Format::e4m3, Fp8Format::e4m3}, std::pair{Fp8Format::e5m2, Fp8Format::e4m3}}) {
    const Operands o = operands(rng, s, fa, fb);
    const std::vector<double> exact = gemm_nt_f64(o.a.d, o.b.d, s.m, s.n, s.k);
    std::vector<double> bound = fp8_gemm_bound(o.a.d, o.qa, o.b.d, o.qb, s.m, s.n, s.k);
    std::vector<double> mag(s.m * s.n, 0.0), mag_q(s.m * s.n, 0.0);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j)
        for (int64_t l = 0; l < s.k; ++l) {
          mag[i * s.n + j] += std::fabs(o.a.d[i * s.k + l] * o.b.d[j * s.k + l]);
          mag_q[i * s.n + j] += std::fabs(o.qa.decoded[i * s.k + l] * o.qb.decoded[j * s.k + l]);
        }
    // The bf16 GEMM of the same values through kernels/gemm (NT: y = x W^T).
    DeviceArray<bf16> da(o.a.bits), db(o.b.bits), dc(s.m * s.n);
    ASSERT_EQ(run_cuda(linear_forward_gemm<bf16>(s.m, s.k, s.n, da.data(), db.data(), dc.data())),
              Status::ok);
    const std::vector<float> c_bf16 = to_float(dc.download());
    for (const Fp8Accumulation acc : {Fp8Accumulation::split, Fp8Accumulation::fast}) {
      SCOPED_TRACE(std::string(to_string(fa)) + "x" + to_string(fb) + " " + to_string(acc));
      const std::vector<double> got = gpu_fp8_gemm(o, s, acc, false);
      double worst_exact = 0, worst_bf16 = 0;
      for (int64_t i = 0; i < s.m * s.n; ++i) {
        const double b_fp8 = bound[i] + acc_tolerance(acc) * mag_q[i] + std::ldexp(std::fabs(got[i]), -8);
        const double b_bf16 =
            b_fp8 + std::ldexp(std::fabs(double(c_bf16[i])), -8) + double(s.k) * std::ldexp(mag[i], -24);
        ASSERT_LE(std::fabs(got[i] - exact[i]), b_fp8) << "element " << i << " against the exact product";
        ASSERT_LE(std::fabs(got[i] - double(c_bf16[i])), b_bf16)
            << "element " << i << " against the bf16 GEMM";
        worst_exact = std::max(worst_exact, std::fabs(got[i] - exact[i]) / b_fp8);
        worst_bf16 = std::max(worst_bf16, std::fabs(got[i] - double(c_bf16[i])) / b_bf16);
      }
      std::vector<double> c_bf16_d(c_bf16.begin(), c_bf16.end());
      std::printf(
          "fp8 gemm %s x %s %s vs bf16 GEMM: rel L2 %.3g (bf16 GEMM vs exact %.3g); worst error / bound: "
          "%.3g vs exact, %.3g vs bf16\n",
          to_string(fa), to_string(fb), to_string(acc), rel_l2(got, c_bf16_d), rel_l2(c_bf16, exact),
          worst_exact, worst_bf16);
    }
  }
}

// One linear layer end to end on the device: casts of x, W and dy (with their
// transposes) under scales from the device amax, then the forward, dgrad and
// wgrad FP8 GEMMs on those codes, each against the fp64 product of the
// decoded codes the CPU cast gives.
TEST(GpuFp8Gemm, LinearLayerFromDeviceCasts) {
  if (!fp8_gemm_here()) GTEST_SKIP() << "no FP8 tensor cores (sm_89 or newer) on this device";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t rows = 256, in = 192, out = 128;
  const Bf16Values x = random_bf16(rng, rows * in), w = random_bf16(rng, out * in, -0.1, 0.1);
  const Bf16Values dy = random_bf16(rng, rows * out, -1e-3, 1e-3);
  struct Cast {
    Cast(int64_t n, Fp8Format f) : codes(n), codes_t(n), amax(1), scale(1), scale_inv(1), format(f) {}
    DeviceArray<Fp8> codes, codes_t;
    DeviceArray<float> amax, scale, scale_inv;
    Fp8Format format;
    std::vector<double> decoded, decoded_t;
  };
  auto cast = [&](const Bf16Values& v, int64_t r, int64_t c, Fp8Format f) {
    auto k = std::make_unique<Cast>(r * c, f);
    DeviceArray<bf16> dv(v.bits);
    // Current scaling on the device: amax, then the scale from it (a history of one).
    DeviceArray<float> history(std::vector<float>(1, 0.0f));
    k->scale.upload({1.0f});
    EXPECT_EQ(run_cuda(Fp8AmaxParams<bf16>{.n = r * c, .x = dv.data(), .amax = k->amax.data()}), Status::ok);
    EXPECT_EQ(run_cuda(Fp8ScaleUpdateParams<bf16>{.count = 1,
                                                  .history_len = 1,
                                                  .format = f,
                                                  .amax = k->amax.data(),
                                                  .history = history.data(),
                                                  .scale = k->scale.data(),
                                                  .scale_inv = k->scale_inv.data()}),
              Status::ok);
    EXPECT_EQ(run_cuda(Fp8CastParams<bf16>{.rows = r,
                                           .cols = c,
                                           .format = f,
                                           .x = dv.data(),
                                           .scale = k->scale.data(),
                                           .out = k->codes.data(),
                                           .out_t = k->codes_t.data()}),
              Status::ok);
    const float scale = k->scale.download()[0], scale_inv = k->scale_inv.download()[0];
    EXPECT_EQ(scale, fp8_scale(fp8_amax(v.f.data(), r * c), f));
    const std::vector<Fp8> codes = k->codes.download(), codes_t = k->codes_t.download();
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        EXPECT_EQ(codes[i * c + j].bits, fp8_quantize(v.f[i * c + j], scale, f));
        EXPECT_EQ(codes_t[j * r + i].bits, codes[i * c + j].bits);
      }
    for (const Fp8 q : codes) k->decoded.push_back(double(fp8_decode(q.bits, f) * scale_inv));
    for (const Fp8 q : codes_t) k->decoded_t.push_back(double(fp8_decode(q.bits, f) * scale_inv));
    return k;
  };
  const auto cx = cast(x, rows, in, Fp8Format::e4m3), cw = cast(w, out, in, Fp8Format::e4m3);
  const auto cdy = cast(dy, rows, out, Fp8Format::e5m2);

  // forward y = x W^T: A = x (rows, in), B = W (out, in), fast accumulation.
  DeviceArray<bf16> y(rows * out);
  ASSERT_EQ(run_cuda(Fp8GemmParams<bf16>{.m = rows,
                                         .n = out,
                                         .k = in,
                                         .a = cx->codes.data(),
                                         .lda = in,
                                         .a_scale_inv = cx->scale_inv.data(),
                                         .b = cw->codes.data(),
                                         .ldb = in,
                                         .b_scale_inv = cw->scale_inv.data(),
                                         .c = y.data(),
                                         .ldc = out,
                                         .accumulation = Fp8Accumulation::fast}),
            Status::ok);
  std::vector<double> got;
  for (bf16 v : y.download()) got.push_back(bf16_to_float(v));
  EXPECT_LE(rel_l2(got, gemm_nt_f64(cx->decoded, cw->decoded, rows, out, in)),
            acc_tolerance(Fp8Accumulation::fast) + 1.0 / 256);

  // dgrad dx = dy W: A = dy (rows, out), B = W^T (in, out), split.
  DeviceArray<bf16> dx(rows * in);
  ASSERT_EQ(run_cuda(Fp8GemmParams<bf16>{.m = rows,
                                         .n = in,
                                         .k = out,
                                         .a = cdy->codes.data(),
                                         .lda = out,
                                         .a_format = Fp8Format::e5m2,
                                         .a_scale_inv = cdy->scale_inv.data(),
                                         .b = cw->codes_t.data(),
                                         .ldb = out,
                                         .b_scale_inv = cw->scale_inv.data(),
                                         .c = dx.data(),
                                         .ldc = in}),
            Status::ok);
  got.clear();
  for (bf16 v : dx.download()) got.push_back(bf16_to_float(v));
  EXPECT_LE(rel_l2(got, gemm_nt_f64(cdy->decoded, cw->decoded_t, rows, in, out)),
            acc_tolerance(Fp8Accumulation::split) + 1.0 / 256);

  // wgrad dW += dy^T x into fp32: A = dy^T (out, rows), B = x^T (in, rows), split.
  const std::vector<float> dw0 = rng.uniform<float>(out * in, -1e-3, 1e-3);
  DeviceArray<float> dw(dw0);
  ASSERT_EQ(run_cuda(Fp8GemmAccParams<bf16>{.m = out,
                                            .n = in,
                                            .k = rows,
                                            .beta = 1.0f,
                                            .a = cdy->codes_t.data(),
                                            .lda = rows,
                                            .a_format = Fp8Format::e5m2,
                                            .a_scale_inv = cdy->scale_inv.data(),
                                            .b = cx->codes_t.data(),
                                            .ldb = rows,
                                            .b_scale_inv = cx->scale_inv.data(),
                                            .c = dw.data(),
                                            .ldc = in}),
            Status::ok);
  std::vector<double> want = gemm_nt_f64(cdy->decoded_t, cx->decoded_t, out, in, rows);
  for (size_t i = 0; i < want.size(); ++i) want[i] += dw0[i];
  EXPECT_LE(rel_l2(dw.download(), want), acc_tolerance(Fp8Accumulation::split));
}

TEST(GpuFp8Gemm, SupportsFollowsTheFp8Rules) {
  DeviceArray<Fp8> a(64 * 64 + 16), b(64 * 64 + 16);
  DeviceArray<bf16> c(64 * 64 + 16);
  DeviceArray<float> s(std::vector<float>{1.0f});
  const Fp8GemmParams<bf16> ok{.m = 64,
                               .n = 64,
                               .k = 64,
                               .a = a.data(),
                               .lda = 64,
                               .a_scale_inv = s.data(),
                               .b = b.data(),
                               .ldb = 64,
                               .b_scale_inv = s.data(),
                               .c = c.data(),
                               .ldc = 64};
  EXPECT_EQ(supports(ok, Backend::cuda), fp8_gemm_here());
  EXPECT_FALSE(supports(ok, Backend::cpu));  // bf16 runs on CUDA only
  auto refused = [](Fp8GemmParams<bf16> p, Status want) {
    EXPECT_FALSE(supports(p, Backend::cuda));
    DeviceArray<std::byte> ws(workspace_bytes(p, Backend::cuda));
    EXPECT_EQ(launch(p, Workspace{ws.data(), int64_t(ws.bytes())}, make_cuda_stream(gpu_stream())), want);
  };
  Fp8GemmParams<bf16> p = ok;
  p.n = 24, p.ldb = 64;  // n not a multiple of 16
  refused(p, Status::unsupported);
  p = ok, p.a = a.data() + 8;  // 8-byte aligned A
  refused(p, Status::unsupported);
  p = ok, p.lda = 80;  // padded rows, still a multiple of 16 bytes
  EXPECT_EQ(supports(p, Backend::cuda), fp8_gemm_here());
  p = ok, p.lda = 68;
  refused(p, Status::unsupported);
  p = ok, p.m = 13;  // any m under per-tensor scales
  EXPECT_EQ(supports(p, Backend::cuda), fp8_gemm_here());
  p = ok, p.k = 40, p.lda = p.ldb = 48;  // k not a multiple of 16
  refused(p, Status::unsupported);
  p = ok, p.a_format = p.b_format = Fp8Format::e5m2;
  refused(p, Status::invalid_argument);
  p = ok, p.ldc = 60;
  refused(p, Status::invalid_argument);
}

}  // namespace
}  // namespace weft::kernels::test
