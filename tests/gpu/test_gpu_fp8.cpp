// The fp8 cast, amax and scale update on CUDA (kernels/fp8/fp8.cu) against
// the CPU backend (the GEMM's tests are test_gpu_fp8_gemm.cpp):
//
//   cast:          codes bit for bit equal to fp8_quantize of the same bf16
//                  values, on all 65536 bf16 bit patterns (every code, tie,
//                  subnormal, overflow, infinity and NaN) under several
//                  scales and on odd shapes; the transposed codes equal;
//                  amax and the health counts exactly the CPU's.
//   amax:          exact (a max rounds nothing).
//   scale update:  history, scale and scale_inv bit for bit the CPU rule's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/layout.h"
#include "kernels/fp8/fp8_ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace weft::kernels::test {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

// The codes and statistics of one GPU cast of bf16 x (rows, cols).
struct GpuCast {
  std::vector<Fp8> out, out_t;
  float amax = 0;
  Fp8Health health;
};

GpuCast gpu_cast(const std::vector<bf16>& x, int64_t rows, int64_t cols, Fp8Format f, float scale,
                 bool transpose, int64_t offset = 0) {
  const int64_t n = rows * cols;
  // offset shifts x by that many elements: off its 16-byte boundary (the
  // element-by-element path) unless a multiple of 8.
  std::vector<bf16> padded(offset, bf16{0});
  padded.insert(padded.end(), x.begin(), x.end());
  DeviceArray<bf16> dx(padded);
  DeviceArray<float> dscale(std::vector<float>{scale}), damax(1);
  DeviceArray<Fp8Health> dhealth(std::vector<Fp8Health>{Fp8Health{}});
  DeviceArray<Fp8> dout(n), dout_t(transpose ? n : 0);
  const Fp8CastParams<bf16> p{.rows = rows,
                              .cols = cols,
                              .format = f,
                              .x = dx.data() + offset,
                              .scale = dscale.data(),
                              .out = dout.data(),
                              .out_t = transpose ? dout_t.data() : nullptr,
                              .amax = damax.data(),
                              .health = dhealth.data()};
  EXPECT_EQ(run_cuda(p), Status::ok);
  GpuCast r;
  r.out = dout.download();
  if (transpose) r.out_t = dout_t.download();
  r.amax = damax.download()[0];
  r.health = dhealth.download()[0];
  return r;
}

// The same cast through the CPU backend on the same values.
struct CpuCast {
  std::vector<Fp8> out, out_t;
  float amax = 0;
  Fp8Health health;
};
CpuCast cpu_cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, float scale) {
  CpuCast r;
  r.out.resize(x.size());
  r.out_t.resize(x.size());
  EXPECT_EQ(run(Fp8CastParams<float>{.rows = rows,
                                     .cols = cols,
                                     .format = f,
                                     .x = x.data(),
                                     .scale = &scale,
                                     .out = r.out.data(),
                                     .out_t = r.out_t.data(),
                                     .amax = &r.amax,
                                     .health = &r.health}),
            Status::ok);
  return r;
}

void expect_same_codes(const std::string& what, const std::vector<Fp8>& got, const std::vector<Fp8>& want,
                       const std::vector<float>& x) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i].bits, want[i].bits) << what << ": element " << i << " (x " << x[i % x.size()] << ")";
}

void expect_same_float(const std::string& what, float got, float want) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
  } else {
    EXPECT_EQ(got, want) << what;
  }
}

TEST(GpuFp8, CastEveryBf16BitPattern) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  std::vector<bf16> x(65536);
  for (int i = 0; i < 65536; ++i) x[i].bits = uint16_t(i);
  const std::vector<float> xf = to_float(x);
  const float random_scale = float(std::exp2(rng.uniform<double>(1, -8.0, 8.0)[0]));
  for (const Fp8Format f : kFormats) {
    for (const float scale : {1.0f, 0.5f, 1.0f / 448.0f, random_scale}) {
      SCOPED_TRACE(std::string(to_string(f)) + " scale " + std::to_string(scale));
      const CpuCast want = cpu_cast(xf, 256, 256, f, scale);
      for (const bool transpose : {false, true}) {
        const GpuCast got = gpu_cast(x, 256, 256, f, scale, transpose);
        expect_same_codes("codes", got.out, want.out, xf);
        if (transpose) expect_same_codes("transposed codes", got.out_t, want.out_t, xf);
        expect_same_float("amax", got.amax, want.amax);  // NaN: the NaN patterns are inputs
        EXPECT_EQ(got.health.overflow, want.health.overflow);
        EXPECT_EQ(got.health.underflow, want.health.underflow);
      }
    }
  }
}

TEST(GpuFp8, CastOddShapesAndMisalignedInputs) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Shape {
    int64_t rows, cols, offset;
  };
  // Rows and columns multiples of 8 with x aligned take the wide transpose
  // (64 x 64 tiles, whole and partial); the others the element-wise one.
  for (const Shape s : {Shape{1, 1, 0}, Shape{5, 3, 1}, Shape{113, 37, 0}, Shape{1, 1000, 1},
                        Shape{1000, 1, 0}, Shape{64, 4096, 0}, Shape{33, 65, 3}, Shape{72, 200, 0},
                        Shape{136, 24, 8}, Shape{8, 8, 0}, Shape{64, 64, 1}}) {
    for (const Fp8Format f : kFormats) {
      SCOPED_TRACE(std::string(to_string(f)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                   " offset " + std::to_string(s.offset));
      const int64_t n = s.rows * s.cols;
      // Values over many binades: normal, subnormal and zero codes.
      std::vector<double> v = rng.uniform<double>(n);
      const std::vector<double> e = rng.uniform<double>(n, f == Fp8Format::e4m3 ? -22.0 : -38.0, 2.0);
      for (int64_t i = 0; i < n; ++i) v[i] *= std::exp2(e[i]);
      const Bf16Values x = bf16_values(v);
      // Half the amax's scale: the largest values saturate.
      const float scale = 2.0f * fp8_scale(fp8_amax(x.f.data(), n), f);
      const CpuCast want = cpu_cast(x.f, s.rows, s.cols, f, scale);
      for (const bool transpose : {false, true}) {
        const GpuCast got = gpu_cast(x.bits, s.rows, s.cols, f, scale, transpose, s.offset);
        expect_same_codes("codes", got.out, want.out, x.f);
        if (transpose) expect_same_codes("transposed codes", got.out_t, want.out_t, x.f);
        EXPECT_EQ(got.amax, want.amax);
        EXPECT_EQ(got.health.overflow, want.health.overflow);
        EXPECT_EQ(got.health.underflow, want.health.underflow);
      }
    }
  }
}

// The transpose with a row stride past the rows (ld_t), both kernels (rows
// multiples of 8 with a stride of 8s take the wide one): the CPU's padded
// codes bit for bit, the padding zero over whatever the buffer held.
TEST(GpuFp8, CastPadsTheTransposeAsTheCpu) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Shape {
    int64_t rows, cols, ld;
  };
  for (const Shape s : {Shape{13, 32, 16}, Shape{40, 64, 48}, Shape{64, 128, 80}, Shape{0, 16, 16},
                        Shape{1, 16, 16}, Shape{100, 24, 112}}) {
    SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols) + " ld " + std::to_string(s.ld));
    const int64_t n = s.rows * s.cols;
    const Bf16Values x = bf16_values(rng.uniform<double>(n, -3.0, 3.0));
    const float scale = fp8_scale(std::max(fp8_amax(x.f.data(), n), 1e-3f), Fp8Format::e4m3);
    std::vector<Fp8> want(s.cols * s.ld), want_out(n);
    ASSERT_EQ(run(Fp8CastParams<float>{.rows = s.rows, .cols = s.cols, .x = x.f.data(), .scale = &scale,
                                       .out = want_out.data(), .out_t = want.data(), .ld_t = s.ld}),
              Status::ok);
    DeviceArray<bf16> dx(x.bits);
    DeviceArray<float> dscale(std::vector<float>{scale});
    DeviceArray<Fp8> dout(n), dout_t(std::vector<Fp8>(s.cols * s.ld, Fp8{0x5a}));
    ASSERT_EQ(run_cuda(Fp8CastParams<bf16>{.rows = s.rows, .cols = s.cols, .x = dx.data(), .scale = dscale.data(),
                                           .out = dout.data(), .out_t = dout_t.data(), .ld_t = s.ld}),
              Status::ok);
    expect_same_codes("codes", dout.download(), want_out, x.f);
    const std::vector<Fp8> got = dout_t.download();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, want[i].bits) << "transposed element " << i;
  }
}

TEST(GpuFp8, CastAmaxAccumulatesAcrossLaunches) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values a = random_bf16(rng, 3000, -2.0, 2.0), b = random_bf16(rng, 5000, -1.0, 1.0);
  DeviceArray<bf16> da(a.bits), db(b.bits);
  DeviceArray<float> dscale(std::vector<float>{1.0f}), damax(std::vector<float>{0.0f});
  DeviceArray<Fp8> out(5000);
  for (const auto* x : {&da, &db}) {
    const int64_t n = x == &da ? 3000 : 5000;
    ASSERT_EQ(run_cuda(Fp8CastParams<bf16>{.rows = 1,
                                           .cols = n,
                                           .x = x->data(),
                                           .scale = dscale.data(),
                                           .out = out.data(),
                                           .amax = damax.data(),
                                           .amax_write = Write::accumulate}),
              Status::ok);
  }
  EXPECT_EQ(damax.download()[0], std::max(fp8_amax(a.f.data(), 3000), fp8_amax(b.f.data(), 5000)));
}

TEST(GpuFp8, Amax) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{4099}, int64_t{1} << 20}) {
    for (const int64_t offset : {0, 1}) {
      const Bf16Values x = random_bf16(rng, n + offset, -3.0, 2.0);
      DeviceArray<bf16> dx(x.bits);
      DeviceArray<float> damax(1);
      ASSERT_EQ(run_cuda(Fp8AmaxParams<bf16>{.n = n, .x = dx.data() + offset, .amax = damax.data()}),
                Status::ok);
      EXPECT_EQ(damax.download()[0], fp8_amax(x.f.data() + offset, n)) << n << " offset " << offset;
    }
  }
  // NaN anywhere gives NaN; accumulate keeps a larger previous value.
  std::vector<bf16> x(100, float_to_bf16(0.5f));
  x[37] = bf16{0x7fc0};
  DeviceArray<bf16> dx(x);
  DeviceArray<float> damax(1);
  ASSERT_EQ(run_cuda(Fp8AmaxParams<bf16>{.n = 100, .x = dx.data(), .amax = damax.data()}), Status::ok);
  EXPECT_TRUE(std::isnan(damax.download()[0]));
  x[37] = float_to_bf16(0.25f);
  DeviceArray<bf16> dx2(x);
  DeviceArray<float> dprev(std::vector<float>{3.0f});
  ASSERT_EQ(run_cuda(Fp8AmaxParams<bf16>{
                .n = 100, .x = dx2.data(), .amax = dprev.data(), .write = Write::accumulate}),
            Status::ok);
  EXPECT_EQ(dprev.download()[0], 3.0f);
}

// The E5M2 pass writes its scale_invs 4 floats apart, as the trainer's
// 16-byte aligned table holds them.
TEST(GpuFp8, ScaleUpdateMatchesTheHostRule) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t count = 300, len = kFp8DelayedHistory;
  for (const Fp8Format f : kFormats) {
    const int64_t stride = f == Fp8Format::e4m3 ? 1 : 4;
    std::vector<float> history(count * len, 0.0f), scale(count, 1.0f), scale_inv(count * stride, 0.0f);
    DeviceArray<float> dhistory(history), dscale(scale), dscale_inv(scale_inv), damax(count);
    for (int step = 0; step < 40; ++step) {
      std::vector<float> amax = rng.uniform<float>(count, 0.0, 1.0);
      for (float& a : amax) a *= std::exp2(float(rng.index(40)) - 20.0f);
      amax[rng.index(count)] = NAN;
      amax[rng.index(count)] = INFINITY;
      amax[rng.index(count)] = 0.0f;
      if (step < 3) amax[7] = 0.0f;
      damax.upload(amax);
      ASSERT_EQ(run(Fp8ScaleUpdateParams<float>{.count = count,
                                                .history_len = len,
                                                .format = f,
                                                .amax = amax.data(),
                                                .history = history.data(),
                                                .scale = scale.data(),
                                                .scale_inv = scale_inv.data(),
                                                .scale_inv_stride = stride}),
                Status::ok);
      ASSERT_EQ(run_cuda(Fp8ScaleUpdateParams<bf16>{.count = count,
                                                    .history_len = len,
                                                    .format = f,
                                                    .amax = damax.data(),
                                                    .history = dhistory.data(),
                                                    .scale = dscale.data(),
                                                    .scale_inv = dscale_inv.data(),
                                                    .scale_inv_stride = stride}),
                Status::ok);
      const std::vector<float> gh = dhistory.download(), gs = dscale.download(), gi = dscale_inv.download();
      for (int64_t t = 0; t < count; ++t) ASSERT_EQ(gs[t], scale[t]) << "step " << step << " tensor " << t;
      for (int64_t i = 0; i < count * stride; ++i) ASSERT_EQ(gi[i], scale_inv[i]) << "step " << step << " entry " << i;
      for (int64_t i = 0; i < count * len; ++i)
        ASSERT_EQ(gh[i], history[i]) << "step " << step << " entry " << i;
    }
  }
}

}  // namespace
}  // namespace weft::kernels::test
