// Block scaling's ops on the CPU backend (kernels/fp8/fp8_ops.h), the oracle
// of the CUDA ones: the block cast against fp8_qdq_tiles (the CPU trainer's
// emulated fp8:blockwise) value for value in both layouts, its scale arrays
// where fp8_tile_scale_at says, its health counts, the tile rules for zeros
// and non-finite values; the tiled GEMM against the fp64 product of the same
// decoded operands (kernel_test_util.h's tolerance rule); and the params
// both refuse. Inputs are fresh random values on every run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fp8_reference.h"
#include "kernel_test_util.h"
#include "kernels/fp8/fp8_ops.h"

namespace weft::kernels {
namespace {

using test::Rng;
using test::run;

// Values over more binades than one scale can hold, with each run of 16
// rows at a magnitude of its own, so tiles get different scales and a
// tensor-wide scale would not do.
std::vector<float> tiled_values(Rng& rng, int64_t rows, int64_t cols, Fp8Format f) {
  std::vector<float> x = rng.uniform<float>(rows * cols);
  const std::vector<float> e = rng.uniform<float>(rows * cols, f == Fp8Format::e4m3 ? -14.0 : -24.0, 2.0);
  const std::vector<float> band = rng.uniform<float>(rows / 16 + 1, -20.0, 20.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] *= std::exp2(e[r * cols + c] + std::floor(band[r / 16]));
  return x;
}

struct Cast {
  std::vector<Fp8> out, out_t;
  std::vector<float> scale_inv, scale_inv_t;
  Fp8Health health;
};

Cast block_cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Tiles tiles) {
  Cast c{std::vector<Fp8>(rows * cols),
         std::vector<Fp8>(rows * cols),
         std::vector<float>(fp8_tile_scales(tiles, rows, cols), NAN),
         std::vector<float>(fp8_tile_scales(tiles, cols, rows), NAN),
         {1, 2}};  // counts are added to
  const Fp8BlockCastParams<float> p{.rows = rows,
                                    .cols = cols,
                                    .format = f,
                                    .tiles = tiles,
                                    .x = x.data(),
                                    .out = c.out.data(),
                                    .scale_inv = c.scale_inv.data(),
                                    .out_t = c.out_t.data(),
                                    .scale_inv_t = c.scale_inv_t.data(),
                                    .health = &c.health};
  EXPECT_TRUE(supports(p));
  EXPECT_EQ(run(p), Status::ok);
  return c;
}

// An operand's values: code * its tile's scale_inv.
std::vector<float> decoded(const std::vector<Fp8>& codes, const std::vector<float>& scale_inv, int64_t rows,
                           int64_t k, Fp8Format f, Fp8Tiles tiles) {
  std::vector<float> v(rows * k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < k; ++l)
      v[r * k + l] = fp8_decode(codes[r * k + l].bits, f) * scale_inv[fp8_tile_scale_at(tiles, rows, k, r, l)];
  return v;
}

TEST(Fp8Block, TileScaleLayoutsAreCublasLts) {
  // 1 x 128: the rows of one run of k contiguous; 128 x 128: each block
  // row's runs padded to 4.
  EXPECT_EQ(fp8_tile_scales(Fp8Tiles::tensor, 300, 500), 1);
  EXPECT_EQ(fp8_tile_scales(Fp8Tiles::row128, 300, 500), 4 * 300);
  EXPECT_EQ(fp8_tile_scale_at(Fp8Tiles::row128, 300, 500, 7, 130), 300 + 7);
  EXPECT_EQ(fp8_tile_scales(Fp8Tiles::block128, 300, 640), 3 * 8);
  EXPECT_EQ(fp8_tile_scale_at(Fp8Tiles::block128, 300, 640, 260, 600), 2 * 8 + 4);
  EXPECT_EQ(fp8_tile_scales(Fp8Tiles::block128, 256, 512), 2 * 4);
}

TEST(Fp8Block, CastMatchesTheTiledQuantisationInBothLayouts) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Shape {
    int64_t rows, cols;
  };
  for (const Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (const Fp8Tiles tiles : {Fp8Tiles::row128, Fp8Tiles::block128})
      for (const Shape s : {Shape{256, 384}, Shape{200, 300}, Shape{3, 130}}) {
        SCOPED_TRACE(std::string(to_string(f)) + " " + to_string(tiles) + " " + std::to_string(s.rows) + "x" +
                     std::to_string(s.cols));
        std::vector<float> x = tiled_values(rng, s.rows, s.cols, f);
        // A tile of zeros (the last row's first, or its whole block) and a
        // non-finite value: both scale 1.
        const bool square = tiles == Fp8Tiles::block128;
        for (int64_t r = square ? (s.rows - 1) / 128 * 128 : s.rows - 1; r < s.rows; ++r)
          for (int64_t c = 0; c < std::min<int64_t>(s.cols, 128); ++c) x[r * s.cols + c] = 0.0f;
        x[s.cols + 1] = INFINITY;
        const Cast c = block_cast(x, s.rows, s.cols, f, tiles);

        std::vector<float> want(x.size()), want_t(x.size());
        const Fp8Health h = fp8_qdq_tiles(x.data(), want.data(), s.rows, s.cols, square ? 128 : 1, 128, f);
        const Fp8Health ht = fp8_qdq_tiles(x.data(), want_t.data(), s.rows, s.cols, 128, square ? 128 : 1, f);
        const std::vector<float> got = decoded(c.out, c.scale_inv, s.rows, s.cols, f, tiles);
        const std::vector<float> got_t = decoded(c.out_t, c.scale_inv_t, s.cols, s.rows, f, tiles);
        int64_t differ = 0;
        for (int64_t r = 0; r < s.rows; ++r)
          for (int64_t l = 0; l < s.cols; ++l) {
            const float w = want[r * s.cols + l], g = got[r * s.cols + l];
            const float wt = want_t[r * s.cols + l], gt = got_t[l * s.rows + r];
            differ += !(w == g || (std::isnan(w) && std::isnan(g))) || !(wt == gt || (std::isnan(wt) && std::isnan(gt)));
          }
        EXPECT_EQ(differ, 0);
        // The zero tile's and the infinite value's tiles take scale 1.
        EXPECT_EQ(c.scale_inv[fp8_tile_scale_at(tiles, s.rows, s.cols, s.rows - 1, 0)], 1.0f);
        EXPECT_EQ(c.scale_inv[fp8_tile_scale_at(tiles, s.rows, s.cols, 1, 1)], 1.0f);
        // Tiles differ in scale: block scaling is doing its work.
        EXPECT_NE(c.scale_inv[fp8_tile_scale_at(tiles, s.rows, s.cols, 0, 0)],
                  c.scale_inv[fp8_tile_scale_at(tiles, s.rows, s.cols, std::min<int64_t>(s.rows - 1, 130) / 2, 129)]);
        // Counts: out's, and out_t's where its tiles differ.
        EXPECT_EQ(c.health.overflow, 1 + h.overflow + (square ? 0 : ht.overflow));
        EXPECT_EQ(c.health.underflow, 2 + h.underflow + (square ? 0 : ht.underflow));
        if (s.rows >= 200) {
          EXPECT_GT(h.underflow, 0);
        }
      }
}

TEST(Fp8Block, TiledGemmMatchesTheDecodedProduct) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Case {
    int64_t m, n, k;
    Fp8Tiles ta, tb;
  };
  // The forward and dgrad (1 x 128 against a weight's blocks), a weight's
  // blocks on the left, and the weight gradient (1 x 128 on both, k the
  // tokens).
  for (const Case g : {Case{256, 384, 256, Fp8Tiles::row128, Fp8Tiles::block128},
                       Case{48, 200, 300, Fp8Tiles::row128, Fp8Tiles::block128},
                       Case{384, 128, 256, Fp8Tiles::block128, Fp8Tiles::row128},
                       Case{128, 256, 512, Fp8Tiles::row128, Fp8Tiles::row128}}) {
    SCOPED_TRACE(std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) + " " +
                 to_string(g.ta) + " by " + to_string(g.tb));
    const Fp8Format fa = Fp8Format::e4m3, fb = g.tb == Fp8Tiles::block128 ? Fp8Format::e4m3 : Fp8Format::e5m2;
    const std::vector<float> a = tiled_values(rng, g.m, g.k, fa), b = tiled_values(rng, g.n, g.k, fb);
    const Cast qa = block_cast(a, g.m, g.k, fa, g.ta), qb = block_cast(b, g.n, g.k, fb, g.tb);
    const std::vector<float> da = decoded(qa.out, qa.scale_inv, g.m, g.k, fa, g.ta);
    const std::vector<float> db = decoded(qb.out, qb.scale_inv, g.n, g.k, fb, g.tb);
    std::vector<double> ref = test::gemm_nt_f64(std::vector<double>(da.begin(), da.end()),
                                                std::vector<double>(db.begin(), db.end()), g.m, g.n, g.k);
    std::vector<float> naive(g.m * g.n);
    const std::vector<float> c0 = rng.uniform<float>(g.m * g.n);
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float s = 0;
        for (int64_t l = 0; l < g.k; ++l) s += da[i * g.k + l] * db[j * g.k + l];
        naive[i * g.n + j] = s + 0.5f * c0[i * g.n + j];
        ref[i * g.n + j] += 0.5 * double(c0[i * g.n + j]);
      }
    std::vector<float> c = c0;
    const Fp8GemmParams<float> p{.m = g.m,
                                 .n = g.n,
                                 .k = g.k,
                                 .beta = 0.5f,
                                 .a = qa.out.data(),
                                 .lda = g.k,
                                 .a_format = fa,
                                 .a_scale_inv = qa.scale_inv.data(),
                                 .a_tiles = g.ta,
                                 .b = qb.out.data(),
                                 .ldb = g.k,
                                 .b_format = fb,
                                 .b_scale_inv = qb.scale_inv.data(),
                                 .b_tiles = g.tb,
                                 .c = c.data(),
                                 .ldc = g.n};
    ASSERT_TRUE(supports(p));
    ASSERT_EQ(run(p), Status::ok);
    test::expect_within_rule("fp32 C", c, naive, ref);
  }
}

// One linear layer's three products as the GPU trainer forms them under
// fp8:blockwise (trainer/model/llama_fp8.cpp): x, W and dy each cast once
// with their transposes, the forward reading x's codes and W's, dgrad dy's
// and W's transpose (the same blocks, the transpose's layout), wgrad the
// transposes of dy and x (tiles down the tokens). Against the CPU trainer's
// emulation of the same recipe: fp8_qdq_tiles on each operand with the
// tiles its product reduces over, then fp64 products. A transposed scale
// array paired with the wrong codes, or a weight's blocks read in the wrong
// layout, is an error of order 1.
TEST(Fp8Block, LinearLayerProductsMatchTheCpuTrainersEmulation) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t M = 256, K = 384, N = 128;
  const Fp8Format f = Fp8Format::e4m3;
  const std::vector<float> x = tiled_values(rng, M, K, f), w = tiled_values(rng, N, K, f),
                           dy = tiled_values(rng, M, N, f);
  const Cast qx = block_cast(x, M, K, f, Fp8Tiles::row128), qw = block_cast(w, N, K, f, Fp8Tiles::block128),
             qdy = block_cast(dy, M, N, f, Fp8Tiles::row128);
  // The emulation's operands, row-major, as the CPU trainer's GEMMs take them.
  const auto qdq = [&](const std::vector<float>& v, int64_t rows, int64_t cols, int64_t tr, int64_t tc) {
    std::vector<float> out(v.size());
    fp8_qdq_tiles(v.data(), out.data(), rows, cols, tr, tc, f);
    return std::vector<double>(out.begin(), out.end());
  };
  const auto transpose = [](const std::vector<double>& v, int64_t rows, int64_t cols) {
    std::vector<double> t(v.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
    return t;
  };
  const std::vector<double> ex = qdq(x, M, K, 1, 128), ew = qdq(w, N, K, 128, 128), edy = qdq(dy, M, N, 1, 128);
  const std::vector<double> ex_tok = qdq(x, M, K, 128, 1), edy_tok = qdq(dy, M, N, 128, 1);

  struct Product {
    const char* what;
    int64_t m, n, k;
    const std::vector<Fp8>& a;
    const std::vector<float>& sa;
    Fp8Tiles ta;
    const std::vector<Fp8>& b;
    const std::vector<float>& sb;
    Fp8Tiles tb;
    std::vector<double> ea, eb;  // the emulation's A (m, k) and B (n, k): C = A B^T
  };
  const Product products[] = {
      {"forward y = x W^T", M, N, K, qx.out, qx.scale_inv, Fp8Tiles::row128, qw.out, qw.scale_inv,
       Fp8Tiles::block128, ex, ew},
      {"dgrad dx = dy W", M, K, N, qdy.out, qdy.scale_inv, Fp8Tiles::row128, qw.out_t, qw.scale_inv_t,
       Fp8Tiles::block128, edy, transpose(ew, N, K)},
      {"wgrad dW = dy^T x", N, K, M, qdy.out_t, qdy.scale_inv_t, Fp8Tiles::row128, qx.out_t, qx.scale_inv_t,
       Fp8Tiles::row128, transpose(edy_tok, M, N), transpose(ex_tok, M, K)}};
  for (const Product& g : products) {
    SCOPED_TRACE(g.what);
    std::vector<float> c(g.m * g.n, NAN);
    const Fp8GemmParams<float> p{.m = g.m, .n = g.n, .k = g.k, .a = g.a.data(), .lda = g.k, .a_format = f,
                                 .a_scale_inv = g.sa.data(), .a_tiles = g.ta, .b = g.b.data(), .ldb = g.k,
                                 .b_format = f, .b_scale_inv = g.sb.data(), .b_tiles = g.tb, .c = c.data(),
                                 .ldc = g.n};
    ASSERT_EQ(run(p), Status::ok);
    const std::vector<double> ref = test::gemm_nt_f64(g.ea, g.eb, g.m, g.n, g.k);
    // The emulated operands in fp32, summed naively: the rule's yardstick.
    std::vector<float> naive(g.m * g.n);
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float sum = 0;
        for (int64_t l = 0; l < g.k; ++l) sum += float(g.ea[i * g.k + l]) * float(g.eb[j * g.k + l]);
        naive[i * g.n + j] = sum;
      }
    test::expect_within_rule(g.what, c, naive, ref);
  }
}

TEST(Fp8Block, RefusesWhatNoBackendRuns) {
  std::vector<float> x(128 * 128, 1.0f), s(256, 1.0f);
  std::vector<Fp8> codes(128 * 128);
  std::vector<float> c(128 * 128);
  Fp8BlockCastParams<float> cast{.rows = 128, .cols = 128, .tiles = Fp8Tiles::tensor, .x = x.data(),
                                 .out = codes.data(), .scale_inv = s.data()};
  EXPECT_EQ(run(cast), Status::invalid_argument);  // tensor scaling is Fp8CastParams'
  cast.tiles = Fp8Tiles::row128;
  EXPECT_EQ(run(cast), Status::ok);
  cast.out_t = codes.data();  // a transpose without its scales
  EXPECT_EQ(run(cast), Status::invalid_argument);

  const Fp8GemmParams<float> ok{.m = 128, .n = 128, .k = 128, .a = codes.data(), .lda = 128,
                                .a_scale_inv = s.data(), .a_tiles = Fp8Tiles::row128, .b = codes.data(),
                                .ldb = 128, .b_scale_inv = s.data(), .b_tiles = Fp8Tiles::block128,
                                .c = c.data(), .ldc = 128};
  EXPECT_EQ(run(ok), Status::ok);
  Fp8GemmParams<float> p = ok;
  p.b_tiles = Fp8Tiles::tensor;  // tiles on one operand only
  EXPECT_EQ(run(p), Status::invalid_argument);
  p = ok;
  p.a_tiles = Fp8Tiles::block128;  // blocks on both
  EXPECT_EQ(run(p), Status::invalid_argument);
  p = ok;
  p.accumulation = Fp8Accumulation::fast;  // no fast block-scaled kernels
  EXPECT_EQ(run(p), Status::invalid_argument);
}

}  // namespace
}  // namespace weft::kernels
