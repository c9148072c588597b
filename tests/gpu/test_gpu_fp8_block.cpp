// Block scaling on CUDA (kernels/fp8/fp8_block.cu, and fp8_gemm.cu's tiled
// scale modes) against the CPU backend, the oracle:
//
//   cast:  codes of both layouts bit for bit, every tile's scale_inv bit for
//          bit at fp8_tile_scale_at's place, the health counts equal;
//   GEMM:  cuBLASLt's block-scaled product of the cast's codes and scales
//          against the fp64 product of the same decoded values, within
//          test_gpu_fp8_gemm.cpp's split-accumulation tolerance (2^-10
//          relative L2, plus 2^-8 for a bf16 C). A scale layout cuBLASLt
//          reads otherwise than fp8_tile_scale_at writes scales whole tiles
//          by the wrong factor: errors of order 1, not 2^-10.
//
// Each GEMM case prints its measured error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/fp8/fp8_ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/fp8_reference.h"

namespace weft::kernels::test {
namespace {

// bf16 values whose runs of 16 rows sit at magnitudes of their own, so tiles
// take different scales.
Bf16Values banded(Rng& rng, int64_t rows, int64_t cols) {
  Bf16Values v = random_bf16(rng, rows * cols);
  const std::vector<float> band = rng.uniform<float>(rows / 16 + 1, -12.0, 12.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      v.f[i] = bf16_to_float(float_to_bf16(v.f[i] * std::exp2(std::floor(band[r / 16]))));
      v.bits[i] = float_to_bf16(v.f[i]);
    }
  return v;
}

struct Cast {
  std::vector<Fp8> out, out_t;
  std::vector<float> scale_inv, scale_inv_t;
  Fp8Health health;
};

Cast cpu_cast(const Bf16Values& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Tiles tiles) {
  Cast c{std::vector<Fp8>(rows * cols), std::vector<Fp8>(rows * cols),
         std::vector<float>(fp8_tile_scales(tiles, rows, cols), 0.0f),
         std::vector<float>(fp8_tile_scales(tiles, cols, rows), 0.0f), {}};
  EXPECT_EQ(run(Fp8BlockCastParams<float>{.rows = rows, .cols = cols, .format = f, .tiles = tiles,
                                          .x = x.f.data(), .out = c.out.data(), .scale_inv = c.scale_inv.data(),
                                          .out_t = c.out_t.data(), .scale_inv_t = c.scale_inv_t.data(),
                                          .health = &c.health}),
            Status::ok);
  return c;
}

Cast gpu_cast(const Bf16Values& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Tiles tiles) {
  DeviceArray<bf16> dx(x.bits);
  DeviceArray<Fp8> out(rows * cols), out_t(rows * cols);
  DeviceArray<float> s(std::vector<float>(fp8_tile_scales(tiles, rows, cols), 0.0f));
  DeviceArray<float> st(std::vector<float>(fp8_tile_scales(tiles, cols, rows), 0.0f));
  DeviceArray<Fp8Health> h(std::vector<Fp8Health>{Fp8Health{}});
  const Fp8BlockCastParams<bf16> p{.rows = rows, .cols = cols, .format = f, .tiles = tiles, .x = dx.data(),
                                   .out = out.data(), .scale_inv = s.data(), .out_t = out_t.data(),
                                   .scale_inv_t = st.data(), .health = h.data()};
  EXPECT_TRUE(supports(p, Backend::cuda));
  EXPECT_EQ(run_cuda(p), Status::ok);
  return {out.download(), out_t.download(), s.download(), st.download(), h.download()[0]};
}

// Positions where the two differ (pads of block128's arrays are never written).
int64_t differing(const std::vector<Fp8>& a, const std::vector<Fp8>& b) {
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i].bits != b[i].bits;
  return d;
}
int64_t differing_scales(const std::vector<float>& a, const std::vector<float>& b, Fp8Tiles tiles, int64_t rows,
                         int64_t k) {
  int64_t d = 0;
  for (int64_t r = 0; r < rows; r += tiles == Fp8Tiles::block128 ? 128 : 1)
    for (int64_t l = 0; l < k; l += 128) {
      const int64_t i = fp8_tile_scale_at(tiles, rows, k, r, l);
      d += a[i] != b[i];
    }
  return d;
}

TEST(GpuFp8Block, CastMatchesTheCpuBitForBit) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (const Fp8Tiles tiles : {Fp8Tiles::row128, Fp8Tiles::block128})
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{128, 128}, {384, 256}, {256, 1024}}) {
        SCOPED_TRACE(std::string(to_string(f)) + " " + to_string(tiles) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols));
        Bf16Values x = banded(rng, rows, cols);
        x.f[cols + 3] = INFINITY;  // a non-finite value: its tiles take scale 1
        x.bits[cols + 3] = float_to_bf16(INFINITY);
        const Cast want = cpu_cast(x, rows, cols, f, tiles), got = gpu_cast(x, rows, cols, f, tiles);
        EXPECT_EQ(differing(got.out, want.out), 0);
        EXPECT_EQ(differing(got.out_t, want.out_t), 0);
        EXPECT_EQ(differing_scales(got.scale_inv, want.scale_inv, tiles, rows, cols), 0);
        EXPECT_EQ(differing_scales(got.scale_inv_t, want.scale_inv_t, tiles, cols, rows), 0);
        EXPECT_EQ(got.health.overflow, want.health.overflow);
        EXPECT_EQ(got.health.underflow, want.health.underflow);
      }
}

TEST(GpuFp8Block, TiledGemmMatchesTheDecodedProduct) {
  if (!fp8_gemm_here()) GTEST_SKIP() << "no FP8 tensor cores (sm_89 or newer) on this device";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Case {
    int64_t m, n, k;
    Fp8Tiles ta, tb;
    const char* what;
  };
  const Case cases[] = {{256, 384, 512, Fp8Tiles::row128, Fp8Tiles::block128, "forward: x by W"},
                        {512, 256, 384, Fp8Tiles::row128, Fp8Tiles::block128, "dgrad: dy by W^T"},
                        {256, 128, 1024, Fp8Tiles::row128, Fp8Tiles::row128, "wgrad: dy^T by x^T"},
                        {384, 256, 256, Fp8Tiles::block128, Fp8Tiles::row128, "blocks on the left"}};
  for (const Case& g : cases) {
    SCOPED_TRACE(g.what);
    const Fp8Format fa = g.ta == Fp8Tiles::block128 ? Fp8Format::e4m3 : Fp8Format::e5m2;
    const Fp8Format fb = Fp8Format::e4m3;
    const Bf16Values a = banded(rng, g.m, g.k), b = banded(rng, g.n, g.k);
    const Cast qa = cpu_cast(a, g.m, g.k, fa, g.ta), qb = cpu_cast(b, g.n, g.k, fb, g.tb);
    std::vector<double> da(g.m * g.k), db(g.n * g.k);
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t l = 0; l < g.k; ++l)
        da[r * g.k + l] = double(fp8_decode(qa.out[r * g.k + l].bits, fa)) *
                          qa.scale_inv[fp8_tile_scale_at(g.ta, g.m, g.k, r, l)];
    for (int64_t r = 0; r < g.n; ++r)
      for (int64_t l = 0; l < g.k; ++l)
        db[r * g.k + l] = double(fp8_decode(qb.out[r * g.k + l].bits, fb)) *
                          qb.scale_inv[fp8_tile_scale_at(g.tb, g.n, g.k, r, l)];
    const std::vector<double> ref = gemm_nt_f64(da, db, g.m, g.n, g.k);

    DeviceArray<Fp8> dqa(qa.out), dqb(qb.out);
    DeviceArray<float> dsa(qa.scale_inv), dsb(qb.scale_inv);
    DeviceArray<bf16> dc(g.m * g.n);
    const Fp8GemmParams<bf16> p{.m = g.m, .n = g.n, .k = g.k, .a = dqa.data(), .lda = g.k, .a_format = fa,
                                .a_scale_inv = dsa.data(), .a_tiles = g.ta, .b = dqb.data(), .ldb = g.k,
                                .b_format = fb, .b_scale_inv = dsb.data(), .b_tiles = g.tb, .c = dc.data(),
                                .ldc = g.n, .accumulation = Fp8Accumulation::split};
    ASSERT_TRUE(supports(p, Backend::cuda)) << "cuBLASLt's block-scaled FP8 GEMM needs cuBLAS 12.9+ on sm_90";
    ASSERT_EQ(run_cuda(p), Status::ok);
    std::vector<float> got;
    for (bf16 v : dc.download()) got.push_back(bf16_to_float(v));
    const double err = rel_l2(got, ref);
    std::printf("[ block GEMM ] %-22s %lldx%lldx%lld %s by %s: rel L2 %.2e (bound %.2e)\n", g.what,
                (long long)g.m, (long long)g.n, (long long)g.k, to_string(g.ta), to_string(g.tb), err,
                1.0 / 1024 + 1.0 / 256);
    EXPECT_LT(err, 1.0 / 1024 + 1.0 / 256);
  }
}

}  // namespace
}  // namespace weft::kernels::test
