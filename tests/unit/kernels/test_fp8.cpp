// The FP8 formats: bit for bit against PyTorch's float8 casts (a committed
// fixture, tools/fp8_fixtures.py), and on fresh random inputs against an
// independent oracle (the nearest of all 256 decoded values in double, ties
// to the even code), plus the scaled quantisation and its health counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/fp8/fp8.h"
#include "kernel_test_util.h"

namespace weft::kernels {
namespace {

struct TorchCasts {
  std::vector<float> x;
  std::vector<uint8_t> e4m3, e5m2, q4, q5;
  float scale = 0;
};

TorchCasts load_fixture() {
  const std::string path = std::string(WEFT_FIXTURES_DIR) + "/fp8_torch.bin";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  char magic[8];
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 7), "WEFTFP8");
  uint32_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 4);
  TorchCasts t;
  t.x.resize(n);
  in.read(reinterpret_cast<char*>(t.x.data()), 4 * n);
  for (auto* v : {&t.e4m3, &t.e5m2}) {
    v->resize(n);
    in.read(reinterpret_cast<char*>(v->data()), n);
  }
  in.read(reinterpret_cast<char*>(&t.scale), 4);
  for (auto* v : {&t.q4, &t.q5}) {
    v->resize(n);
    in.read(reinterpret_cast<char*>(v->data()), n);
  }
  EXPECT_TRUE(in) << path << " is cut off";
  return t;
}

std::string hex(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g (0x%08x)", double(x), u);
  return buf;
}

TEST(Fp8, CastsMatchPyTorchBitForBit) {
  const TorchCasts t = load_fixture();
  ASSERT_GT(t.x.size(), 20000u);
  int64_t mismatches = 0;
  for (size_t i = 0; i < t.x.size() && mismatches < 10; ++i) {
    const uint8_t e4 = fp8_encode(t.x[i], Fp8Format::e4m3);
    const uint8_t e5 = fp8_encode(t.x[i], Fp8Format::e5m2);
    const uint8_t q4 = fp8_quantize(t.x[i], t.scale, Fp8Format::e4m3);
    const uint8_t q5 = fp8_quantize(t.x[i], t.scale, Fp8Format::e5m2);
    if (e4 != t.e4m3[i] || e5 != t.e5m2[i] || q4 != t.q4[i] || q5 != t.q5[i]) {
      ++mismatches;
      ADD_FAILURE() << hex(t.x[i]) << ": e4m3 " << int(e4) << " vs torch " << int(t.e4m3[i]) << ", e5m2 "
                    << int(e5) << " vs " << int(t.e5m2[i]) << ", scaled e4m3 " << int(q4) << " vs "
                    << int(t.q4[i]) << ", scaled e5m2 " << int(q5) << " vs " << int(t.q5[i]);
    }
  }
}

TEST(Fp8, DecodeKnowsEveryCode) {
  EXPECT_EQ(fp8_decode(0x7e, Fp8Format::e4m3), 448.0f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::e4m3), fp8_min_subnormal(Fp8Format::e4m3));
  EXPECT_TRUE(std::isnan(fp8_decode(0x7f, Fp8Format::e4m3)));
  EXPECT_TRUE(std::isnan(fp8_decode(0xff, Fp8Format::e4m3)));
  EXPECT_EQ(fp8_decode(0x7b, Fp8Format::e5m2), 57344.0f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::e5m2), fp8_min_subnormal(Fp8Format::e5m2));
  EXPECT_EQ(fp8_decode(0x7c, Fp8Format::e5m2), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_decode(0xfc, Fp8Format::e5m2), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp8_decode(0x7d, Fp8Format::e5m2)));
  // Every non-NaN code round-trips.
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_decode(uint8_t(c), f);
      if (std::isnan(v)) continue;
      EXPECT_EQ(fp8_encode(v, f), c) << to_string(f) << " code " << c;
    }
}

// The oracle: the nearest finite value in double, ties to the even code,
// then the formats' overflow rules.
uint8_t nearest_code(float x, Fp8Format f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  const double mx = fp8_max(f);
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 128; ++c) {
    const float v = fp8_decode(uint8_t(c), f);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(double(v) - a);
    if (best < 0 || d < best_d || (d == best_d && (c % 2) == 0)) {
      best = c;
      best_d = d;
    }
  }
  // Past max: E4M3 saturates; E5M2 rounds to infinity from max + half a step
  // (61440) on, as round to nearest even into an unbounded exponent would.
  if (a > mx && f == Fp8Format::e5m2 && a >= 61440.0) return sign | 0x7c;
  return sign | uint8_t(best);
}

TEST(Fp8, RandomValuesRoundToTheNearestCode) {
  test::Rng rng;
  SCOPED_TRACE(rng.trace());
  // Log-uniform magnitudes over both formats' ranges and past them.
  const auto exps = rng.uniform<double>(4000, -20, 17);
  const auto signs = rng.uniform<double>(4000);
  for (size_t i = 0; i < exps.size(); ++i) {
    const float x = float(std::exp2(exps[i]) * (signs[i] < 0 ? -1 : 1));
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
      ASSERT_EQ(fp8_encode(x, f), nearest_code(x, f)) << to_string(f) << " " << hex(x);
  }
}

TEST(Fp8, ScaleMapsTheLargestValueToTheFormatsMax) {
  EXPECT_EQ(fp8_scale(2.0f, Fp8Format::e4m3), 224.0f);
  EXPECT_EQ(fp8_scale(0.0f, Fp8Format::e5m2), 1.0f);
  EXPECT_EQ(fp8_scale(NAN, Fp8Format::e4m3, 5.0f), 5.0f);
  EXPECT_EQ(fp8_scale(INFINITY, Fp8Format::e4m3, 5.0f), 5.0f);
  EXPECT_EQ(fp8_scale(1e-40f, Fp8Format::e4m3, 5.0f), 5.0f);  // 448 / 1e-40 overflows fp32
}

TEST(Fp8, QuantiseDequantiseKeepsTheRelativeErrorOfTheFormat) {
  test::Rng rng;
  SCOPED_TRACE(rng.trace());
  auto x = rng.uniform<float>(10000, -3, 3);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    const float amax = fp8_amax(x.data(), int64_t(x.size()));
    const float scale = fp8_scale(amax, f);
    std::vector<float> y(x.size());
    const Fp8Health h = fp8_qdq(x.data(), y.data(), int64_t(x.size()), scale, f);
    EXPECT_EQ(h.overflow, 0);
    // Normal range: relative error at most half an ulp, 2^-(mantissa+1);
    // below the smallest normal, an absolute error of half a subnormal step.
    const double rel = f == Fp8Format::e4m3 ? 1.0 / 16 : 1.0 / 8;
    const double abs_err = fp8_min_subnormal(f) / 2 / double(scale);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::fabs(double(y[i]) - double(x[i])), std::max(rel * std::fabs(double(x[i])), abs_err) * 1.0001)
          << to_string(f) << " " << x[i];
    // The largest value maps exactly onto max.
    const size_t at = size_t(std::max_element(x.begin(), x.end(), [](float a, float b) {
                               return std::fabs(a) < std::fabs(b);
                             }) - x.begin());
    EXPECT_EQ(fp8_quantize(x[at], scale, f) & 0x7f, f == Fp8Format::e4m3 ? 0x7e : 0x7b);
  }
}

// fp8_qdq rounds onto the grid without forming the code; it must give
// decode(quantize) * (1 / scale) bit for bit, and the same health counts,
// for every float that rounding can tell apart: each pattern of the top 16
// bits with the low 16 at both ends and around their middle (the rounding
// points of both formats' mantissas and subnormal steps lie on these), the
// two zeros, infinities and NaN, under scale 1 and fresh random scales.
TEST(Fp8, QuantiseDequantiseEqualsDecodingTheCode) {
  std::vector<float> x;
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu})
      x.push_back(std::bit_cast<float>((hi << 16) | lo));
  test::Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto exps = rng.uniform<double>(3, -12, 12);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (float scale : {1.0f, float(std::exp2(exps[0])), float(std::exp2(exps[1])), float(std::exp2(exps[2])) * 1.37f}) {
      SCOPED_TRACE(::testing::Message() << to_string(f) << " scale " << hex(scale));
      std::vector<float> y(x.size());
      const Fp8Health h = fp8_qdq(x.data(), y.data(), int64_t(x.size()), scale, f);
      Fp8Health want;
      const float inv = 1.0f / scale;
      for (size_t i = 0; i < x.size(); ++i) {
        const uint8_t code = fp8_quantize(x[i], scale, f);
        const float expect = fp8_decode(code, f) * inv;
        if (std::isnan(expect)) {
          ASSERT_TRUE(std::isnan(y[i])) << hex(x[i]);
        } else {
          ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(expect))
              << hex(x[i]) << " gave " << hex(y[i]) << ", the code " << hex(expect);
        }
        if (std::fabs(x[i] * scale) > (f == Fp8Format::e4m3 ? 464.0f : 61440.0f)) ++want.overflow;
        if ((code & 0x7f) == 0 && x[i] != 0.0f) ++want.underflow;
      }
      EXPECT_EQ(h.overflow, want.overflow);
      EXPECT_EQ(h.underflow, want.underflow);
      EXPECT_GT(want.underflow, 0);
    }
}

TEST(Fp8, HealthCountsOverflowsAndUnderflows) {
  // Scale 1 in E4M3: 1000 clamps to 448, 1e-4 flushes to zero, 0 is no underflow.
  const std::vector<float> x = {1000.0f, -600.0f, 1e-4f, 0.0f, 1.0f, -2e-5f};
  std::vector<float> y(x.size());
  const Fp8Health h = fp8_qdq(x.data(), y.data(), int64_t(x.size()), 1.0f, Fp8Format::e4m3);
  EXPECT_EQ(h.overflow, 2);
  EXPECT_EQ(h.underflow, 2);
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], -448.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[4], 1.0f);
  // E5M2 clamps too (no infinity from an over-range value).
  const Fp8Health h5 = fp8_qdq(x.data(), y.data(), int64_t(x.size()), 100.0f, Fp8Format::e5m2);
  EXPECT_EQ(h5.overflow, 1);
  EXPECT_EQ(y[0], 57344.0f / 100.0f);
}

TEST(Fp8, ResultsDoNotDependOnTheThreadCount) {
  test::Rng rng;
  SCOPED_TRACE(rng.trace());
  auto x = rng.uniform<float>(50000, -10, 10);
  auto run = [&] {
    std::vector<float> y(x.size());
    const Fp8Health h = fp8_qdq(x.data(), y.data(), int64_t(x.size()), 60.0f, Fp8Format::e4m3);
    return std::make_pair(y, h.overflow);
  };
  const auto one = test::with_threads(1, run);
  const auto two = test::with_threads(2, run);
  EXPECT_EQ(one.first, two.first);
  EXPECT_EQ(one.second, two.second);
  EXPECT_GT(one.second, 0);
  EXPECT_EQ(test::with_threads(1, [&] { return fp8_amax(x.data(), int64_t(x.size())); }),
            test::with_threads(2, [&] { return fp8_amax(x.data(), int64_t(x.size())); }));
}

// Block scaling: every tile is quantised as a tensor of its own would be
// (its amax, its scale, fp8_qdq's rounding), computed here from the scalar
// codes on fresh random values whose tiles differ in magnitude by up to
// 2^20, with edge tiles smaller than the rest, one tile of zeros and one
// holding a NaN.
TEST(Fp8, TilesTakeScalesOfTheirOwn) {
  test::Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t rows = 300, cols = 270;  // 3 x 3 tiles of 128 (the last ones 44 and 14 wide)
  const auto mags = rng.uniform<double>(rows * cols, -10, 10);
  const auto vals = rng.uniform<float>(rows * cols, -1, 1);
  for (auto [tr, tc] : {std::pair<int64_t, int64_t>{1, 128}, {128, 1}, {128, 128}, {7, 33}})
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      SCOPED_TRACE(::testing::Message() << tr << " x " << tc << " " << to_string(f));
      std::vector<float> x(size_t(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t tile = (r / tr) * 1000 + c / tc;  // a magnitude per tile
          x[size_t(r * cols + c)] = vals[size_t(r * cols + c)] * float(std::exp2(mags[size_t(tile % (rows * cols))]));
        }
      for (int64_t r = 0; r < std::min(tr, rows); ++r)  // the first tile all zeros
        for (int64_t c = 0; c < std::min(tc, cols); ++c) x[size_t(r * cols + c)] = 0.0f;
      x[size_t((rows - 1) * cols + cols - 1)] = NAN;  // in the last tile
      std::vector<float> y(x.size());
      const Fp8Health h = fp8_qdq_tiles(x.data(), y.data(), rows, cols, tr, tc, f);
      Fp8Health want;
      for (int64_t r0 = 0; r0 < rows; r0 += tr)
        for (int64_t c0 = 0; c0 < cols; c0 += tc) {
          std::vector<float> tile;
          for (int64_t r = r0; r < std::min(rows, r0 + tr); ++r)
            for (int64_t c = c0; c < std::min(cols, c0 + tc); ++c) tile.push_back(x[size_t(r * cols + c)]);
          float amax = 0;
          bool finite = true;
          for (float v : tile) {
            finite = finite && std::isfinite(v);
            amax = std::max(amax, std::fabs(v));
          }
          const float scale = finite && amax > 0 ? fp8_max(f) / amax : 1.0f;
          size_t i = 0;
          for (int64_t r = r0; r < std::min(rows, r0 + tr); ++r)
            for (int64_t c = c0; c < std::min(cols, c0 + tc); ++c, ++i) {
              const float v = tile[i];
              // (The oracle rounds finite values; NaN stays NaN, as PyTorch's casts keep it.)
              const float expect =
                  std::isnan(v) ? NAN
                                : fp8_decode(nearest_code(std::clamp(v * scale, -fp8_max(f), fp8_max(f)), f), f) *
                                      (1.0f / scale);
              const float got = y[size_t(r * cols + c)];
              if (std::isnan(expect)) {
                ASSERT_TRUE(std::isnan(got)) << r << "," << c;
              } else {
                ASSERT_EQ(got, expect) << r << "," << c << " x " << hex(v);
              }
              if (v != 0.0f && expect == 0.0f) ++want.underflow;
              // Past max plus half a step (a NaN's tile keeps scale 1, so its
              // large values clamp).
              if (std::fabs(v * scale) > (f == Fp8Format::e4m3 ? 464.0f : 61440.0f)) ++want.overflow;
            }
        }
      EXPECT_EQ(h.overflow, want.overflow);
      EXPECT_EQ(h.underflow, want.underflow);
    }
}

// Tiles down the rows whose rows arrive shuffled and split between two
// holders (an MoE expert's tokens on several ranks): each holder's column
// maxima, combined by an integer max, then each holder's rows quantised
// under them, give every value what fp8_qdq_tiles(128 x 1) gives it in
// sequence order; zeros, a NaN and magnitudes that differ by tile included.
TEST(Fp8, ColumnTilesOfScatteredRowsMatchTheTilesInOrder) {
  test::Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t rows = 300, cols = 70, tiles = 3;
  const auto mags = rng.uniform<double>(tiles * cols, -12, 12);
  const auto vals = rng.uniform<float>(rows * cols, -1, 1);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[size_t(r * cols + c)] = vals[size_t(r * cols + c)] * float(std::exp2(mags[size_t((r / 128) * cols + c)]));
  for (int64_t r = 0; r < 128; ++r) x[size_t(r * cols + 5)] = 0.0f;  // a column of zeros in the first tile
  x[size_t(200 * cols + 9)] = NAN;
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) order[size_t(i)] = i;
  for (int64_t i = rows - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(rng.index(i + 1))]);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    SCOPED_TRACE(to_string(f));
    std::vector<float> want(x.size());
    const Fp8Health hw = fp8_qdq_tiles(x.data(), want.data(), rows, cols, 128, 1, f);
    // Holder 0 the first 111 shuffled rows, holder 1 the rest.
    const int64_t split = 111;
    std::vector<float> held(x.size());
    std::vector<int64_t> tile_of(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      std::copy_n(x.begin() + order[size_t(i)] * cols, cols, held.begin() + i * cols);
      tile_of[size_t(i)] = order[size_t(i)] / 128;
    }
    std::vector<int32_t> t0(size_t(tiles * cols), 0), t1(t0);
    fp8_column_amax(held.data(), split, cols, tile_of.data(), t0.data());
    fp8_column_amax(held.data() + split * cols, rows - split, cols, tile_of.data() + split, t1.data());
    for (size_t i = 0; i < t0.size(); ++i) t0[i] = std::max(t0[i], t1[i]);
    std::vector<float> got(x.size());
    Fp8Health h = fp8_qdq_column_tiles(held.data(), got.data(), split, cols, tile_of.data(), t0.data(), tiles, f);
    h += fp8_qdq_column_tiles(held.data() + split * cols, got.data() + split * cols, rows - split, cols,
                              tile_of.data() + split, t0.data(), tiles, f);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < cols; ++c) {
        const float g = got[size_t(i * cols + c)], w = want[size_t(order[size_t(i)] * cols + c)];
        ASSERT_EQ(std::bit_cast<uint32_t>(g), std::bit_cast<uint32_t>(w)) << "row " << order[size_t(i)] << " col " << c;
      }
    EXPECT_EQ(h.overflow, hw.overflow);
    EXPECT_EQ(h.underflow, hw.underflow);
  }
}

TEST(Fp8, TilesDoNotDependOnTheThreadCount) {
  test::Rng rng;
  SCOPED_TRACE(rng.trace());
  auto x = rng.uniform<float>(256 * 384, -10, 10);
  auto run = [&] {
    std::vector<float> y(x.size());
    fp8_qdq_tiles(x.data(), y.data(), 256, 384, 128, 128, Fp8Format::e4m3);
    return y;
  };
  EXPECT_EQ(test::with_threads(1, run), test::with_threads(2, run));
}

}  // namespace
}  // namespace weft::kernels
