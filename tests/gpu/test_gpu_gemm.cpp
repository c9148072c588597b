// gemm on CUDA (cuBLASLt, bf16 operands, fp32 accumulation) against the CPU
// backend: every transpose pair, alpha and beta, strided batches, padded
// leading dimensions (which also break 16-byte alignment), k = 0, and both C
// types (bf16 GemmParams, fp32 GemmAccParams), and the weight-gradient
// helper into fp32 and into bf16 gradients. C starts as NaN wherever
// beta = 0 (it must not be read) and in the padding (it must not be written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

struct GpuGemmCase {
  GemmCase shape;
  int64_t pad;  // added to every leading dimension
};
void PrintTo(const GpuGemmCase& c, std::ostream* os) { *os << c.shape.name << "_pad" << c.pad; }
struct GpuGemmName {
  std::string operator()(const ::testing::TestParamInfo<GpuGemmCase>& info) const {
    return info.param.shape.name + "_pad" + std::to_string(info.param.pad);
  }
};

std::vector<GpuGemmCase> gpu_gemm_cases() {
  std::vector<GemmCase> shapes = gemm_cases();
  shapes.push_back({"nt_256x320x512_tensor_cores", Trans::no, Trans::yes, 256, 320, 512, 1, 1.0, 0.0});
  shapes.push_back({"tn_130x257x300_beta1", Trans::yes, Trans::no, 130, 257, 300, 1, 1.0, 1.0});
  shapes.push_back({"batched4_nn_64x72x40_alpha_beta", Trans::no, Trans::no, 64, 72, 40, 4, 0.5, -1.0});
  shapes.push_back({"nn_7x9x0_k0_beta", Trans::no, Trans::no, 7, 9, 0, 2, 1.0, 0.5});
  std::vector<GpuGemmCase> cases;
  for (const GemmCase& s : shapes)
    for (int64_t pad : {0, 3}) cases.push_back({s, pad});
  return cases;
}

// Layout of one case: leading dimensions, batch strides, element counts.
struct Layout {
  int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
  int64_t a_rows, b_rows;
};
Layout layout_of(const GemmCase& c, int64_t pad) {
  Layout l;
  l.a_rows = c.trans_a == Trans::no ? c.m : c.k;
  l.b_rows = c.trans_b == Trans::no ? c.k : c.n;
  l.lda = std::max<int64_t>(1, (c.trans_a == Trans::no ? c.k : c.m) + pad);
  l.ldb = std::max<int64_t>(1, (c.trans_b == Trans::no ? c.n : c.k) + pad);
  l.ldc = c.n + pad;
  l.stride_a = l.a_rows * l.lda + pad;
  l.stride_b = l.b_rows * l.ldb + pad;
  l.stride_c = c.m * l.ldc + pad;
  return l;
}

template <typename Elem, typename CElem, template <typename> class P>
P<Elem> params(const GemmCase& c, const Layout& l, const Elem* a, const Elem* b, CElem* cm) {
  P<Elem> p;
  p.trans_a = c.trans_a, p.trans_b = c.trans_b, p.m = c.m, p.n = c.n, p.k = c.k;
  p.alpha = Acc<Elem>(c.alpha), p.beta = Acc<Elem>(c.beta);
  p.a = a, p.lda = l.lda, p.b = b, p.ldb = l.ldb, p.c = cm, p.ldc = l.ldc;
  p.batch = c.batch, p.stride_a = l.stride_a, p.stride_b = l.stride_b, p.stride_c = l.stride_c;
  return p;
}

// Whether element i of the C buffer is inside one of the batch's (m, n) matrices.
bool in_c(const GemmCase& c, const Layout& l, int64_t i) {
  const int64_t b = i / l.stride_c, within = i % l.stride_c;
  return b < c.batch && within / l.ldc < c.m && within % l.ldc < c.n;
}

class GpuGemm : public ::testing::TestWithParam<GpuGemmCase> {};

TEST_P(GpuGemm, Bf16AndFp32C) {
  const GemmCase& c = GetParam().shape;
  const Layout l = layout_of(c, GetParam().pad);
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t na = std::max<int64_t>(1, c.batch * l.stride_a), nb = std::max<int64_t>(1, c.batch * l.stride_b);
  const int64_t nc = c.batch * l.stride_c;
  const Bf16Values a = random_bf16(rng, na), b = random_bf16(rng, nb), c0 = random_bf16(rng, nc);
  const bool reads_c = c.beta != 0.0;

  // References: C's initial value where beta reads it, zero elsewhere.
  std::vector<double> c_ref(nc, 0.0);
  std::vector<float> c_cpu(nc, 0.0f);
  for (int64_t i = 0; i < nc; ++i)
    if (reads_c && in_c(c, l, i)) c_ref[i] = c0.d[i], c_cpu[i] = c0.f[i];
  const std::vector<double> c_ref0 = c_ref;
  const std::vector<float> c_cpu0 = c_cpu;
  ASSERT_EQ(run((params<double, double, GemmParams>(c, l, a.d.data(), b.d.data(), c_ref.data()))), Status::ok);
  ASSERT_EQ(run((params<float, float, GemmParams>(c, l, a.f.data(), b.f.data(), c_cpu.data()))), Status::ok);

  // Only the (m, n) entries are compared; the padding must keep its NaN.
  auto inside = [&](const auto& v) {
    std::vector<std::decay_t<decltype(v[0])>> out;
    for (int64_t i = 0; i < nc; ++i)
      if (in_c(c, l, i)) out.push_back(v[i]);
    return out;
  };

  DeviceArray<bf16> da(a.bits), db(b.bits), dc(nc);
  if (reads_c) {
    std::vector<bf16> init(nc, bf16{0xffff});
    for (int64_t i = 0; i < nc; ++i)
      if (in_c(c, l, i)) init[i] = c0.bits[i];
    dc.upload(init);
  }
  ASSERT_EQ(run_cuda((params<bf16, bf16, GemmParams>(c, l, da.data(), db.data(), dc.data()))), Status::ok);
  const std::vector<bf16> got = dc.download();
  for (int64_t i = 0; i < nc; ++i) {
    if (in_c(c, l, i)) continue;
    ASSERT_EQ(got[i].bits, 0xffff) << "padding element " << i << " was written";
  }
  expect_bf16_rule("C (bf16)", inside(got), inside(c_cpu), inside(c_ref));

  // fp32 C: the weight-gradient form.
  std::vector<float> init32(nc, NAN);
  for (int64_t i = 0; i < nc; ++i)
    if (reads_c && in_c(c, l, i)) init32[i] = c0.f[i];
  DeviceArray<float> dc32(init32);
  ASSERT_EQ(run_cuda((params<bf16, float, GemmAccParams>(c, l, da.data(), db.data(), dc32.data()))),
            Status::ok);
  const std::vector<float> got32 = dc32.download();
  for (int64_t i = 0; i < nc; ++i) {
    if (in_c(c, l, i)) continue;
    ASSERT_TRUE(std::isnan(got32[i])) << "padding element " << i << " was written";
  }
  expect_fp32_rule("C (fp32)", inside(got32), inside(c_cpu), inside(c_ref));
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuGemm, ::testing::ValuesIn(gpu_gemm_cases()), GpuGemmName());

TEST(GpuGemmHelpers, LinearWgradIntoFp32) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t rows = 37, in = 24, out = 16;
  const Bf16Values dy = random_bf16(rng, rows * out), x = random_bf16(rng, rows * in);
  const std::vector<float> dw0 = rng.uniform<float>(out * in);
  std::vector<double> ref(dw0.begin(), dw0.end());
  std::vector<float> cpu = dw0;
  ASSERT_EQ(run(linear_wgrad_gemm<double>(rows, in, out, dy.d.data(), x.d.data(), ref.data())), Status::ok);
  ASSERT_EQ(run(linear_wgrad_gemm<float>(rows, in, out, dy.f.data(), x.f.data(), cpu.data())),
            Status::ok);
  DeviceArray<bf16> ddy(dy.bits), dx(x.bits);
  DeviceArray<float> dw(dw0);
  ASSERT_EQ(run_cuda(linear_wgrad_gemm<bf16>(rows, in, out, ddy.data(), dx.data(), dw.data())),
            Status::ok);
  expect_fp32_rule("dW accumulated in fp32", dw.download(), cpu, ref);
}

// grad:bf16: two micro-batches' weight gradients added to bf16 gradients
// (GemmParams<bf16>, beta = 1), each rounded once; the CPU accumulates the
// same bf16 start in fp32 and the rule rounds its result once.
TEST(GpuGemmHelpers, LinearWgradIntoBf16) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t rows = 37, in = 24, out = 16;
  const Bf16Values dw0 = random_bf16(rng, out * in);
  std::vector<double> ref = dw0.d;
  std::vector<float> cpu = dw0.f;
  DeviceArray<bf16> dw(dw0.bits);
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    const Bf16Values dy = random_bf16(rng, rows * out), x = random_bf16(rng, rows * in);
    ASSERT_EQ(run(linear_wgrad_gemm<double>(rows, in, out, dy.d.data(), x.d.data(), ref.data())), Status::ok);
    ASSERT_EQ(run(linear_wgrad_gemm<float>(rows, in, out, dy.f.data(), x.f.data(), cpu.data())), Status::ok);
    DeviceArray<bf16> ddy(dy.bits), dx(x.bits);
    const GemmParams<bf16> p = linear_wgrad_gemm<bf16>(rows, in, out, ddy.data(), dx.data(), dw.data());
    EXPECT_EQ(p.beta, 1.0f);
    ASSERT_EQ(run_cuda(p), Status::ok);
  }
  expect_bf16_rule("dW accumulated in bf16", dw.download(), cpu, ref);
}

// The grouped GEMM as an MoE layer calls it: experts of uneven rows (none,
// one, a few, many), forward into bf16 and weight gradients accumulating
// into fp32 (cuBLAS's grouped kernel, or cuBLASLt entry by entry where it
// has none), each against the CPU's fp32 and the fp64 definition.
TEST(GpuGroupedGemm, ExpertsForwardAndWeightGradients) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const std::vector<int64_t> rows = {0, 1, 37, 130, 16, 64};
  const int64_t E = int64_t(rows.size()), C = 64, F = 96;
  int64_t total = 0;
  std::vector<int64_t> offset;
  for (int64_t r : rows) offset.push_back(total), total += r;
  const Bf16Values x = random_bf16(rng, total * C), w = random_bf16(rng, E * F * C);
  const Bf16Values dy = random_bf16(rng, total * F);
  const std::vector<float> dw0 = rng.uniform<float>(E * F * C);
  DeviceArray<bf16> dx(x.bits), dwt(w.bits), ddy(dy.bits), dout(total * F);
  DeviceArray<float> dgrad(dw0);
  std::vector<double> y64(total * F), g64(dw0.begin(), dw0.end());
  std::vector<float> y32(total * F), g32 = dw0;
  std::vector<GemmParams<bf16>> forward;
  std::vector<GemmAccParams<bf16>> wgrad;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = offset[size_t(e)], n = rows[size_t(e)];
    ASSERT_EQ(run(linear_forward_gemm<double>(n, C, F, x.d.data() + o * C, w.d.data() + e * F * C,
                                              y64.data() + o * F)),
              Status::ok);
    ASSERT_EQ(run(linear_forward_gemm<float>(n, C, F, x.f.data() + o * C, w.f.data() + e * F * C,
                                             y32.data() + o * F)),
              Status::ok);
    ASSERT_EQ(run(linear_wgrad_gemm<double>(n, C, F, dy.d.data() + o * F, x.d.data() + o * C,
                                            g64.data() + e * F * C)),
              Status::ok);
    ASSERT_EQ(run(linear_wgrad_gemm<float>(n, C, F, dy.f.data() + o * F, x.f.data() + o * C,
                                           g32.data() + e * F * C)),
              Status::ok);
    forward.push_back(linear_forward_gemm<bf16>(n, C, F, dx.data() + o * C, dwt.data() + e * F * C,
                                                dout.data() + o * F));
    wgrad.push_back(linear_wgrad_gemm<bf16>(n, C, F, ddy.data() + o * F, dx.data() + o * C,
                                            dgrad.data() + e * F * C));
  }
  ASSERT_EQ(run_cuda(GroupedGemmParams<bf16>{.gemms = forward.data(), .count = E}), Status::ok);
  ASSERT_EQ(run_cuda(GroupedGemmAccParams<bf16>{.gemms = wgrad.data(), .count = E}), Status::ok);
  expect_bf16_rule("experts' outputs (bf16)", dout.download(), y32, y64);
  expect_fp32_rule("experts' weight gradients (fp32)", dgrad.download(), g32, g64);
}

}  // namespace
}  // namespace weft::kernels::test
