// gemm: every transpose combination, alpha/beta and strided batches against
// an fp64 reference; the linear-layer helpers against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <strings.h>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "kernels/gemm/blas_core.h"
#include "kernels/gemm/gemm.h"
#include "kernels/lazy_library.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

#ifdef WEFT_TEST_CUDA
#include <cublasLt.h>
#endif

namespace weft::kernels::test {
namespace {

// The weight-gradient helper writes into the gradients' type: the
// accumulator form for Acc gradients (fp32 and fp64 runs, the fp32 main
// gradients of bf16 compute), the bf16 GEMM itself for bf16 gradients
// (grad:bf16).
static_assert(std::is_same_v<WgradGemmParams<float, float>, GemmAccParams<float>>);
static_assert(std::is_same_v<WgradGemmParams<double, double>, GemmAccParams<double>>);
static_assert(std::is_same_v<WgradGemmParams<bf16, float>, GemmAccParams<bf16>>);
static_assert(std::is_same_v<WgradGemmParams<bf16, bf16>, GemmParams<bf16>>);

// Stored shapes and leading dimensions of a case, with a little padding in
// every leading dimension so that lda != columns is exercised.
struct Layout {
  int64_t a_rows, a_cols, lda, b_rows, b_cols, ldb, ldc, stride_a, stride_b, stride_c;
};

Layout layout_of(const GemmCase& c) {
  Layout l{};
  l.a_rows = c.trans_a == Trans::no ? c.m : c.k;
  l.a_cols = c.trans_a == Trans::no ? c.k : c.m;
  l.b_rows = c.trans_b == Trans::no ? c.k : c.n;
  l.b_cols = c.trans_b == Trans::no ? c.n : c.k;
  l.lda = l.a_cols + 2;
  l.ldb = l.b_cols + 1;
  l.ldc = c.n + 3;
  l.stride_a = l.a_rows * l.lda;
  l.stride_b = l.b_rows * l.ldb;
  l.stride_c = c.m * l.ldc;
  return l;
}

// C = alpha * op(A) op(B) + beta * C by the definition, per batch entry.
template <typename R>
void reference(const GemmCase& c, const Layout& l, const std::vector<R>& a, const std::vector<R>& b,
               std::vector<R>& out) {
  for (int64_t e = 0; e < c.batch; ++e)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        R s = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const R av = c.trans_a == Trans::no ? a[e * l.stride_a + i * l.lda + p]
                                              : a[e * l.stride_a + p * l.lda + i];
          const R bv = c.trans_b == Trans::no ? b[e * l.stride_b + p * l.ldb + j]
                                              : b[e * l.stride_b + j * l.ldb + p];
          s += av * bv;
        }
        R& dst = out[e * l.stride_c + i * l.ldc + j];
        dst = R(c.alpha) * s + R(c.beta) * dst;
      }
}

class GemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmTest, MatchesFp64Reference) {
  const GemmCase& c = GetParam();
  const Layout l = layout_of(c);
  Rng rng;
  SCOPED_TRACE(rng.trace());
  auto a = rng.uniform<float>(c.batch * l.stride_a), b = rng.uniform<float>(c.batch * l.stride_b);
  auto out = rng.uniform<float>(c.batch * l.stride_c);
  std::vector<double> ref = cast<double>(out);
  std::vector<float> naive = out;
  reference(c, l, cast<double>(a), cast<double>(b), ref);
  reference(c, l, a, b, naive);
  ASSERT_EQ(run(GemmParams<float>{.trans_a = c.trans_a, .trans_b = c.trans_b, .m = c.m, .n = c.n,
                                  .k = c.k, .alpha = float(c.alpha), .beta = float(c.beta),
                                  .a = a.data(), .lda = l.lda, .b = b.data(), .ldb = l.ldb,
                                  .c = out.data(), .ldc = l.ldc, .batch = c.batch,
                                  .stride_a = l.stride_a, .stride_b = l.stride_b,
                                  .stride_c = l.stride_c}),
            Status::ok);
  // The padding between rows is compared too: it must be left alone.
  expect_within_rule("C", out, naive, ref);
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmTest, ::testing::ValuesIn(gemm_cases()), CaseName{});

// y = x W^T with L = <r, y>: dgrad gives dL/dx = r W, wgrad adds r^T x.
TEST(GemmLinear, HelpersMatchFiniteDifferences) {
  const int64_t rows = 13, in = 5, out = 7;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  auto x = rng.uniform<double>(rows * in), w = rng.uniform<double>(out * in);
  const auto r = rng.uniform<double>(rows * out);
  std::vector<double> y(rows * out);
  auto loss = [&] {
    run_or_throw(linear_forward_gemm(rows, in, out, x.data(), w.data(), y.data()));
    return dot(r, y);
  };
  // Gradients land on random starting values: wgrad accumulates by default,
  // dgrad accumulates when asked.
  const auto dx_start = rng.uniform<double>(rows * in), dw_start = rng.uniform<double>(out * in);
  auto dx = dx_start, dw = dw_start;
  ASSERT_EQ(run(linear_dgrad_gemm(rows, in, out, r.data(), w.data(), dx.data(), Write::accumulate)),
            Status::ok);
  ASSERT_EQ(run(linear_wgrad_gemm(rows, in, out, r.data(), x.data(), dw.data())), Status::ok);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= dx_start[i];
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw_start[i];
  EXPECT_LE(fd_error(x, dx, loss, rng), kFdTolerance) << "dx";
  EXPECT_LE(fd_error(w, dw, loss, rng), kFdTolerance) << "dw";

  // Overwriting dgrad gives the same gradient from garbage.
  std::vector<double> dx_over(rows * in, std::numeric_limits<double>::quiet_NaN());
  ASSERT_EQ(run(linear_dgrad_gemm(rows, in, out, r.data(), w.data(), dx_over.data())), Status::ok);
  EXPECT_LE(rel_l2(dx_over, dx), 1e-12);
}

TEST(GemmArgs, BetaZeroIgnoresCAndKZeroScales) {
  std::vector<float> a(6, 1.0f), b(6, 2.0f), c(4, std::numeric_limits<float>::quiet_NaN());
  ASSERT_EQ(run(GemmParams<float>{.m = 2, .n = 2, .k = 3, .a = a.data(), .lda = 3, .b = b.data(),
                                  .ldb = 2, .c = c.data(), .ldc = 2}),
            Status::ok);
  for (float v : c) EXPECT_EQ(v, 6.0f);
  // k = 0: the product is empty and C = beta * C.
  ASSERT_EQ(run(GemmParams<float>{.m = 2, .n = 2, .k = 0, .beta = 0.5f, .a = nullptr, .lda = 1,
                                  .b = nullptr, .ldb = 2, .c = c.data(), .ldc = 2}),
            Status::ok);
  for (float v : c) EXPECT_EQ(v, 3.0f);
}

TEST(GemmArgs, RejectsImpossibleParams) {
  std::vector<float> a(12), b(12), c(16);
  const GemmParams<float> ok{.m = 4, .n = 4, .k = 3, .a = a.data(), .lda = 3, .b = b.data(),
                             .ldb = 4, .c = c.data(), .ldc = 4};
  EXPECT_TRUE(supports(ok));
  EXPECT_EQ(workspace_bytes(ok), 0);
  auto bad = ok;
  bad.lda = 2;  // rows of A (4 x 3) overlap
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.trans_a = Trans::yes;  // A stored (3 x 4) needs lda >= 4
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.m = -1;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.batch = 0;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.batch = 2;
  bad.stride_c = 8;  // the two C matrices would overlap
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.b = nullptr;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.k = int64_t{1} << 32;  // beyond BLAS's 32-bit sizes
  bad.lda = bad.k;
  bad.ldb = 4;
  EXPECT_EQ(run(bad), Status::unsupported);
  EXPECT_EQ(launch(ok, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);
}

// A grouped GEMM: entries of their own sizes (rows that vary as an MoE
// layer's experts' do, an empty one, a k = 0 one), transposes, leading
// dimensions, alpha and beta, each in its own part of shared buffers, against
// the fp64 definition entry by entry; what lies between the entries' C
// matrices must be left alone.
TEST(GroupedGemm, EntriesMatchFp64Reference) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  struct Entry {
    GemmCase c;
    Layout l;
    int64_t a_at, b_at, c_at;
  };
  std::vector<Entry> entries;
  int64_t a_total = 0, b_total = 0, c_total = 0;
  const int64_t count = 9;
  for (int64_t i = 0; i < count; ++i) {
    GemmCase c{"entry", rng.index(2) ? Trans::yes : Trans::no, rng.index(2) ? Trans::yes : Trans::no,
               1 + rng.index(23), 1 + rng.index(17), 1 + rng.index(29), 1, 0.5 + rng.index(3) * 0.5,
               double(rng.index(3)) * 0.5};
    if (i == 2) c.m = 0;  // an expert that received no rows (forward, dgrad)
    if (i == 5) c.k = 0, c.beta = 0.5;  // its weight gradient: C = beta * C
    const Layout l = layout_of(c);
    entries.push_back({c, l, a_total, b_total, c_total});
    a_total += std::max<int64_t>(1, l.stride_a);
    b_total += std::max<int64_t>(1, l.stride_b);
    c_total += l.stride_c + 5;  // a gap between the entries' C matrices
  }
  auto a = rng.uniform<float>(a_total), b = rng.uniform<float>(b_total), out = rng.uniform<float>(c_total);
  const std::vector<float> start = out;
  std::vector<double> ref = cast<double>(out);
  std::vector<float> naive = out;
  const std::vector<double> a64 = cast<double>(a), b64 = cast<double>(b);
  std::vector<GemmParams<float>> gemms;
  for (const Entry& e : entries) {
    const GemmCase& c = e.c;
    const Layout& l = e.l;
    auto slice = [](const auto& v, int64_t at, int64_t n) {
      return std::vector<std::decay_t<decltype(v[0])>>(v.begin() + at, v.begin() + at + n);
    };
    const int64_t na = std::max<int64_t>(1, l.stride_a), nb = std::max<int64_t>(1, l.stride_b);
    std::vector<double> r = slice(ref, e.c_at, l.stride_c);
    std::vector<float> f = slice(naive, e.c_at, l.stride_c);
    reference(c, l, slice(a64, e.a_at, na), slice(b64, e.b_at, nb), r);
    reference(c, l, slice(a, e.a_at, na), slice(b, e.b_at, nb), f);
    std::copy(r.begin(), r.end(), ref.begin() + e.c_at);
    std::copy(f.begin(), f.end(), naive.begin() + e.c_at);
    gemms.push_back({.trans_a = c.trans_a, .trans_b = c.trans_b, .m = c.m, .n = c.n, .k = c.k,
                     .alpha = float(c.alpha), .beta = float(c.beta), .a = a.data() + e.a_at, .lda = l.lda,
                     .b = b.data() + e.b_at, .ldb = l.ldb, .c = out.data() + e.c_at, .ldc = l.ldc});
  }
  const GroupedGemmParams<float> p{.gemms = gemms.data(), .count = count};
  EXPECT_TRUE(supports(p));
  EXPECT_EQ(workspace_bytes(p), 0);
  ASSERT_EQ(run(p), Status::ok);
  expect_within_rule("grouped C", out, naive, ref);
  for (const Entry& e : entries)  // the gaps between the entries
    for (int64_t i = e.c_at + e.l.stride_c; i < e.c_at + e.l.stride_c + 5; ++i) ASSERT_EQ(out[i], start[i]) << i;

  // The accumulator form (weight gradients) on the same entries.
  std::vector<GemmAccParams<float>> acc;
  std::vector<float> out2 = start;
  for (const GemmParams<float>& g : gemms) {
    acc.push_back({.trans_a = g.trans_a, .trans_b = g.trans_b, .m = g.m, .n = g.n, .k = g.k, .alpha = g.alpha,
                   .beta = g.beta, .a = g.a, .lda = g.lda, .b = g.b, .ldb = g.ldb,
                   .c = out2.data() + (g.c - out.data()), .ldc = g.ldc});
  }
  ASSERT_EQ(run(GroupedGemmAccParams<float>{.gemms = acc.data(), .count = count}), Status::ok);
  EXPECT_EQ(out2, out);

  // An empty list runs nothing; a list it cannot take names no backend.
  EXPECT_EQ(run(GroupedGemmParams<float>{}), Status::ok);
  EXPECT_EQ(run(GroupedGemmParams<float>{.gemms = nullptr, .count = 2}), Status::invalid_argument);
  auto bad = gemms;
  bad[3].batch = 2;  // entries are single products
  bad[3].stride_c = 1 << 20;
  EXPECT_FALSE(supports(GroupedGemmParams<float>{.gemms = bad.data(), .count = count}));
  EXPECT_EQ(run(GroupedGemmParams<float>{.gemms = bad.data(), .count = count}), Status::invalid_argument);
  bad = gemms;
  bad[7].ldc = 0;
  const std::vector<float> before = out;
  EXPECT_EQ(run(GroupedGemmParams<float>{.gemms = bad.data(), .count = count}), Status::invalid_argument);
  EXPECT_EQ(out, before) << "no entry runs when one is invalid";
  EXPECT_EQ(launch(p, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);
}

// OpenBLAS's kernel set: a fallback narrower than the CPU is replaced by the
// widest set the CPU runs, and nothing else is touched.
TEST(BlasCore, ReplacesOnlyAKnownNarrowerKernelSet) {
  EXPECT_EQ(blas_core_correction("Prescott", CpuVector::avx512, true), "Cooperlake");
  EXPECT_EQ(blas_core_correction("Prescott", CpuVector::avx512, false), "SkylakeX");
  EXPECT_EQ(blas_core_correction("prescott", CpuVector::avx2, false), "Haswell");
  EXPECT_EQ(blas_core_correction("Nehalem", CpuVector::avx, false), "Sandybridge");
  EXPECT_EQ(blas_core_correction("Sandybridge", CpuVector::avx2, false), "Haswell");
  EXPECT_EQ(blas_core_correction("Zen", CpuVector::avx512, true), "Cooperlake");
  EXPECT_EQ(blas_core_correction("Prescott", CpuVector::sse, false), "");     // nothing wider to run
  EXPECT_EQ(blas_core_correction("Haswell", CpuVector::avx2, true), "");     // already the CPU's width
  EXPECT_EQ(blas_core_correction("SkylakeX", CpuVector::avx2, false), "");   // never narrower
  EXPECT_EQ(blas_core_correction("Zen5", CpuVector::avx512, true), "");      // a name from a later release
  EXPECT_EQ(blas_core_correction("", CpuVector::avx512, true), "");          // a BLAS that names none
}

// This process's choice: where weft replaced OpenBLAS's set, the GEMMs above
// ran on the replacement, which the environment hands to child processes.
TEST(BlasCore, ThisProcessRunsWhatItSays) {
  const BlasCore& c = blas_core();
  if (c.note.empty()) {
    EXPECT_EQ(c.running, c.detected);
    return;
  }
  EXPECT_NE(c.running, c.detected);
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  ASSERT_NE(env, nullptr);
  EXPECT_EQ(strcasecmp(env, c.running.c_str()), 0) << env << " vs " << c.running;
  EXPECT_NE(c.note.find(c.detected), std::string::npos) << c.note;
}


// A library opened on first use: its symbols, and the errors that name the
// library, every file tried and the hint, or the missing symbol.
TEST(LazyLibrary, OpensOnFirstUseAndNamesWhatFails) {
  LazyLibrary libm("the C math library", {"libweft-absent.so.7", "libm.so.6"}, "hint");
  EXPECT_FALSE(libm.loaded());
  const auto cosine = reinterpret_cast<double (*)(double)>(libm.symbol("cos"));
  EXPECT_TRUE(libm.loaded());
  const double x = 0.3 + 0.1 * double(std::rand() % 7);
  EXPECT_EQ(cosine(x), std::cos(x));
  try {
    libm.symbol("weft_no_such_symbol");
    FAIL() << "a missing symbol was returned";
  } catch (const weft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("weft_no_such_symbol"), std::string::npos) << e.what();
  }

  LazyLibrary absent("WeftAbsent", {"libweft-absent.so.7", "/nonexistent/libweft-absent.so"}, "Install it.");
  for (int call = 0; call < 2; ++call) {  // the same answer every time, nothing opened
    try {
      absent.symbol("f");
      FAIL() << "an absent library was opened";
    } catch (const weft::Error& e) {
      const std::string m = e.what();
      for (const char* part : {"WeftAbsent", "libweft-absent.so.7", "/nonexistent/libweft-absent.so", "Install it."})
        EXPECT_NE(m.find(part), std::string::npos) << part << " missing from: " << m;
    }
    EXPECT_FALSE(absent.loaded());
  }
}

// Whether a library is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  return all.str().find(name) != std::string::npos;
}

// The CPU GEMMs above never open cuBLAS; in a CUDA build the first call of
// a cuBLASLt entry point opens it (no GPU needed for a status name).
TEST(LazyLibrary, CublasOpensOnlyWhenCalled) {
  EXPECT_FALSE(cublas_loaded());
  EXPECT_FALSE(mapped("libcublasLt.so"));
  EXPECT_FALSE(mapped("libcublas.so"));
#ifdef WEFT_TEST_CUDA
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_TRUE(cublas_loaded());
  EXPECT_TRUE(mapped("libcublasLt.so"));
  EXPECT_FALSE(mapped("libcublas.so"));
#endif
}

}  // namespace
}  // namespace weft::kernels::test
