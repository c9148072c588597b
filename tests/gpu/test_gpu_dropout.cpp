// dropout on CUDA (bf16) against the CPU backend's fp32 instantiation on the
// same (bf16-rounded) inputs and params:
//   - the mask is the CPU's exactly: an element is 0 on the GPU if and only
//     if the CPU dropped it (the inputs are never 0, and a kept value
//     x / (1 - p) of a nonzero x is never 0, so a 0 marks a dropped element);
//   - a kept value is the CPU's fp32 x * (1 / (1 - p)) up to one bf16
//     rounding at the store: |got - want| <= 2^-8 |want| (bf16's unit
//     roundoff), plus 2^-20 |want| for the scale, which the CUDA launch
//     rounds from fp64 and the CPU computes in fp32 (one fp32 ulp apart at
//     most);
//   - with cp > 1 (a rank's two chunks of each sequence), a first sample
//     past 0 and col_offset > 0 (a tp rank's slice of full_cols);
//   - one shape past the kernel's 65536 blocks of 256 threads (the
//     grid-stride loop's second pass);
//   - accumulate adds the same dropped values to y: want = y0 + x * scale in
//     fp32, again up to one bf16 rounding (of |want|, with an fp32 term of
//     |y0| + |x * scale| for a fused multiply-add on the device);
//   - bad params (p = 1, p < 0, columns past full_cols) are refused with
//     Status::invalid_argument and supports() says no.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dropout/dropout.h"
#include "tests/gpu/gpu_test_util.h"

namespace weft::kernels::test {
namespace {

constexpr double kOneRounding = 1.0 / 256 + 1.0 / (1 << 20);

// Nonzero values of magnitude in [0.25, 2), of either sign, rounded to bf16.
Bf16Values nonzero_bf16(Rng& rng, int64_t n) {
  std::vector<double> v = rng.uniform<double>(n, 0.25, 2.0);
  const std::vector<double> sign = rng.uniform<double>(n, -1.0, 1.0);
  for (size_t i = 0; i < v.size(); ++i)
    if (sign[i] < 0) v[i] = -v[i];
  return bf16_values(v);
}

struct DropoutCase {
  std::string name;
  int64_t samples, seq, cp, cp_rank, cols, col_offset, full_cols, first_sample;
  double p;
  uint64_t key;
  int64_t rows() const { return samples * (seq / cp); }
};
void PrintTo(const DropoutCase& c, std::ostream* os) { *os << c.name; }

template <typename Elem>
DropoutParams<Elem> params_of(const DropoutCase& c, const Elem* x, Elem* y, Write write = Write::overwrite) {
  return {.rows = c.rows(), .cols = c.cols, .p = c.p, .key = c.key, .first_sample = c.first_sample,
          .seq = c.seq, .local_seq = c.seq / c.cp, .cp = c.cp, .cp_rank = c.cp_rank,
          .col_offset = c.col_offset, .full_cols = c.full_cols, .x = x, .y = y, .write = write};
}

class GpuDropout : public ::testing::TestWithParam<DropoutCase> {};

TEST_P(GpuDropout, TheCpuMaskAndOneRounding) {
  const DropoutCase& c = GetParam();
  const int64_t n = c.rows() * c.cols;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = nonzero_bf16(rng, n);
  std::vector<float> cpu(size_t(n), -1.0f);
  ASSERT_EQ(run(params_of<float>(c, x.f.data(), cpu.data())), Status::ok);

  DeviceArray<bf16> dx(x.bits), dy(n);
  ASSERT_EQ(run_cuda(params_of<bf16>(c, dx.data(), dy.data())), Status::ok);
  const std::vector<float> got = to_float(dy.download());
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = cpu[size_t(i)], g = got[size_t(i)];
    ASSERT_EQ(g == 0.0f, want == 0.0f) << "element " << i << ": gpu " << g << ", cpu " << want;
    if (want == 0.0f) continue;
    ++kept;
    ASSERT_LE(std::abs(double(g) - double(want)), kOneRounding * std::abs(double(want)))
        << "element " << i << ": gpu " << g << ", cpu " << want;
  }
  // Something was dropped and something kept (p is well inside (0, 1) and
  // every case has thousands of elements): the checks above compared both.
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, n);
  const double sd = std::sqrt(double(n) * c.p * (1 - c.p));
  EXPECT_NEAR(double(kept), double(n) * (1 - c.p), 5 * sd);

  // In place (y = x), as the trainer's backward does not but the params allow.
  ASSERT_EQ(run_cuda(params_of<bf16>(c, dx.data(), dx.data())), Status::ok);
  const std::vector<float> in_place = to_float(dx.download());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(in_place[size_t(i)], got[size_t(i)]) << "in place, element " << i;
}

TEST_P(GpuDropout, AccumulateAdds) {
  const DropoutCase& c = GetParam();
  const int64_t n = c.rows() * c.cols;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = nonzero_bf16(rng, n), y0 = nonzero_bf16(rng, n);
  std::vector<float> dropped(static_cast<size_t>(n));
  ASSERT_EQ(run(params_of<float>(c, x.f.data(), dropped.data())), Status::ok);
  std::vector<float> cpu = y0.f;
  ASSERT_EQ(run(params_of<float>(c, x.f.data(), cpu.data(), Write::accumulate)), Status::ok);

  DeviceArray<bf16> dx(x.bits), dy(y0.bits);
  ASSERT_EQ(run_cuda(params_of<bf16>(c, dx.data(), dy.data(), Write::accumulate)), Status::ok);
  const std::vector<float> got = to_float(dy.download());
  for (int64_t i = 0; i < n; ++i) {
    const double want = cpu[size_t(i)], g = got[size_t(i)];
    const double tol = kOneRounding * std::abs(want) +
                       (std::abs(double(y0.f[size_t(i)])) + std::abs(double(dropped[size_t(i)]))) / (1 << 20);
    ASSERT_LE(std::abs(g - want), tol) << "element " << i << ": gpu " << g << ", cpu " << want << " (y0 "
                                       << y0.f[size_t(i)] << ", dropped x " << dropped[size_t(i)] << ")";
    // A dropped element leaves y0 as it was: bf16 to fp32 and back is exact.
    if (dropped[size_t(i)] == 0.0f) {
      ASSERT_EQ(g, double(y0.f[size_t(i)])) << "dropped element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuDropout,
    ::testing::Values(
        // name, samples, seq, cp, cp_rank, cols, col_offset, full_cols, first_sample, p, key
        DropoutCase{"whole", 4, 64, 1, 0, 96, 0, 96, 0, 0.3, 42},
        DropoutCase{"odd_cols_first_sample", 3, 50, 1, 0, 77, 0, 77, 5, 0.1, 0x9e3779b97f4a7c15ull},
        DropoutCase{"cp2_rank1_tp_slice", 2, 64, 2, 1, 48, 48, 144, 7, 0.2, 3},
        DropoutCase{"cp4_rank2_tp_slice", 3, 128, 4, 2, 40, 80, 160, 1, 0.5, 11},
        // 8200 x 2048 elements: more than 65536 blocks of 256 threads.
        DropoutCase{"grid_stride", 1, 8200, 1, 0, 2048, 0, 2048, 0, 0.25, 1234}),
    [](const ::testing::TestParamInfo<DropoutCase>& info) { return info.param.name; });

// The same rules as the CPU's (dropout_check.h): refused, not launched.
TEST(GpuDropoutParams, BadParamsAreRefused) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const DropoutCase c{"bad", 2, 32, 1, 0, 16, 0, 16, 0, 0.5, 1};
  const int64_t n = c.rows() * c.cols;
  const Bf16Values x = nonzero_bf16(rng, n);
  DeviceArray<bf16> dx(x.bits), dy(n);
  const auto refused = [&](const DropoutParams<bf16>& p, const char* what) {
    EXPECT_FALSE(supports(p, Backend::cuda)) << what;
    EXPECT_EQ(launch(p, Workspace{}, make_cuda_stream(gpu_stream())), Status::invalid_argument) << what;
  };
  auto p = params_of<bf16>(c, dx.data(), dy.data());
  p.p = 1.0;
  refused(p, "p = 1");
  p.p = -0.1;
  refused(p, "p < 0");
  p = params_of<bf16>(c, dx.data(), dy.data());
  p.col_offset = 1;  // columns 1 .. 16 of 16
  refused(p, "columns past full_cols");
  p = params_of<bf16>(c, dx.data(), dy.data());
  p.cp = 2;  // local_seq must then be seq / 2
  refused(p, "cp 2 with the whole sequence");
  CUDA_CHECK(cudaStreamSynchronize(gpu_stream()));
  // Nothing was written: y is still the poison (0xffff, a NaN).
  for (float v : to_float(dy.download())) ASSERT_TRUE(std::isnan(v));
  // And the good params still run.
  EXPECT_EQ(run_cuda(params_of<bf16>(c, dx.data(), dy.data())), Status::ok);
}

}  // namespace
}  // namespace weft::kernels::test
