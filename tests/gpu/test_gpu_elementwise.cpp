// elementwise and reduce on CUDA (bf16) against the CPU backend: add, scale,
// axpy, fill, the sum of squares and the two casts, on the shared cases
// (n = 1, 37, 113, 40000: vector body plus tail, several sum chunks), in
// place, and one element off a 16-byte boundary. Then the fp32 forms of
// fill, scale, axpy and the sum of squares (the main gradients of bf16
// training), launched through the float params on a CUDA stream, against
// the CPU's float launches on the same values.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

class GpuElementwise : public ::testing::TestWithParam<ElementwiseCase> {};

TEST_P(GpuElementwise, AddScaleAxpy) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values a = random_bf16(rng, n), b = random_bf16(rng, n);
  const double alpha = -0.37;

  std::vector<double> add_ref(n), scale_ref(n), axpy_ref = b.d;
  std::vector<float> add_cpu(n), scale_cpu(n), axpy_cpu = b.f;
  ASSERT_EQ(run(AddParams<double>{n, a.d.data(), b.d.data(), add_ref.data()}), Status::ok);
  ASSERT_EQ(run(AddParams<float>{n, a.f.data(), b.f.data(), add_cpu.data()}), Status::ok);
  ASSERT_EQ(run(ScaleParams<double>{n, alpha, a.d.data(), scale_ref.data()}), Status::ok);
  ASSERT_EQ(run(ScaleParams<float>{n, alpha, a.f.data(), scale_cpu.data()}), Status::ok);
  ASSERT_EQ(run(AxpyParams<double>{n, alpha, a.d.data(), axpy_ref.data()}), Status::ok);
  ASSERT_EQ(run(AxpyParams<float>{n, alpha, a.f.data(), axpy_cpu.data()}), Status::ok);

  DeviceArray<bf16> da(a.bits), db(b.bits), out(n), y(b.bits);
  ASSERT_EQ(run_cuda(AddParams<bf16>{n, da.data(), db.data(), out.data()}), Status::ok);
  expect_bf16_rule("add", out.download(), add_cpu, add_ref);
  out.poison();
  ASSERT_EQ(run_cuda(ScaleParams<bf16>{n, alpha, da.data(), out.data()}), Status::ok);
  expect_bf16_rule("scale", out.download(), scale_cpu, scale_ref);
  ASSERT_EQ(run_cuda(AxpyParams<bf16>{n, alpha, da.data(), y.data()}), Status::ok);
  expect_bf16_rule("axpy", y.download(), axpy_cpu, axpy_ref);

  // In place: out aliases a.
  DeviceArray<bf16> in_place(a.bits);
  ASSERT_EQ(run_cuda(AddParams<bf16>{n, in_place.data(), db.data(), in_place.data()}), Status::ok);
  expect_bf16_rule("add in place", in_place.download(), add_cpu, add_ref);
}

TEST_P(GpuElementwise, Misaligned) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values a = random_bf16(rng, n + 1), b = random_bf16(rng, n + 1);
  std::vector<double> ref(n);
  std::vector<float> cpu(n);
  ASSERT_EQ(run(AddParams<double>{n, a.d.data() + 1, b.d.data() + 1, ref.data()}), Status::ok);
  ASSERT_EQ(run(AddParams<float>{n, a.f.data() + 1, b.f.data() + 1, cpu.data()}), Status::ok);
  DeviceArray<bf16> da(a.bits), db(b.bits), out(n + 1);
  ASSERT_EQ(run_cuda(AddParams<bf16>{n, misaligned(da), misaligned(db), misaligned(out)}), Status::ok);
  std::vector<bf16> got = out.download();
  EXPECT_EQ(got[0].bits, 0xffff) << "element before the output was written";
  got.erase(got.begin());
  expect_bf16_rule("add misaligned", got, cpu, ref);
}

TEST_P(GpuElementwise, Fill) {
  const int64_t n = GetParam().n;
  DeviceArray<bf16> x(n + 1);
  ASSERT_EQ(run_cuda(FillParams<bf16>{n, 0.37, x.data()}), Status::ok);
  expect_same_bits("fill", x.download(), [&] {
    std::vector<bf16> want(n, float_to_bf16(0.37f));
    want.push_back(bf16{0xffff});  // untouched past n
    return want;
  }());
  ASSERT_EQ(run_cuda(FillParams<bf16>{n, -2.0, misaligned(x)}), Status::ok);
  std::vector<bf16> got = x.download();
  EXPECT_EQ(got[0].bits, float_to_bf16(0.37f).bits) << "element before the misaligned fill was written";
  got.erase(got.begin());
  expect_same_bits("fill misaligned", got, std::vector<bf16>(n, float_to_bf16(-2.0f)));
}

TEST_P(GpuElementwise, SumSquares) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = random_bf16(rng, n + 1, -3.0, 3.0);
  for (int offset : {0, 1}) {
    double ref = 1.5;
    ASSERT_EQ(run(SumSquaresParams<double>{n, x.d.data() + offset, &ref}), Status::ok);
    DeviceArray<bf16> dx(x.bits);
    DeviceArray<double> sum(std::vector<double>{1.5});
    ASSERT_EQ(run_cuda(SumSquaresParams<bf16>{n, dx.data() + offset, sum.data()}), Status::ok);
    // Every square is exact and the adds run in double on both backends.
    EXPECT_NEAR(sum.download()[0], ref, 1e-12 * ref) << "offset " << offset;
  }
}

TEST_P(GpuElementwise, WidenNarrow) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = random_bf16(rng, n, -4.0, 4.0);
  const std::vector<float> base = rng.uniform<float>(n);
  // Widen is exact; accumulating is one fp32 add, as on the CPU.
  std::vector<float> widened = base;
  ASSERT_EQ(run(WidenParams<float>{n, x.f.data(), widened.data(), Write::accumulate}), Status::ok);
  DeviceArray<bf16> dx(x.bits);
  DeviceArray<float> out(n), acc(base);
  ASSERT_EQ(run_cuda(WidenParams<bf16>{n, dx.data(), out.data()}), Status::ok);
  EXPECT_EQ(out.download(), x.f);
  ASSERT_EQ(run_cuda(WidenParams<bf16>{n, dx.data(), acc.data(), Write::accumulate}), Status::ok);
  EXPECT_EQ(acc.download(), widened);

  // Narrow rounds to nearest even, as the host converter does.
  std::vector<float> wide = rng.uniform<float>(n, -300.0, 300.0);
  if (n > 2) {
    wide[1] = NAN;       // stays NaN
    wide[2] = 3.4e38f;   // past the largest bf16: rounds to inf
  }
  std::vector<bf16> want;
  for (float v : wide) want.push_back(float_to_bf16(v));
  DeviceArray<float> dwide(wide);
  DeviceArray<bf16> narrow(n);
  ASSERT_EQ(run_cuda(NarrowParams<bf16>{n, dwide.data(), narrow.data()}), Status::ok);
  const std::vector<bf16> got = narrow.download();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(wide[i]))
      EXPECT_TRUE(std::isnan(bf16_to_float(got[i]))) << "element " << i;
    else
      EXPECT_EQ(got[i].bits, want[i].bits) << "element " << i << " = " << wide[i];
  }
}

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// Bit-for-bit equality of fp32 values (a poisoned element is a NaN).
void expect_same_floats(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
        << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
}

// What DeviceArray holds until written.
const float kPoison = std::bit_cast<float>(0xffffffffu);

// Elements [offset, offset + n) of a device array.
std::vector<float> slice(const DeviceArray<float>& a, int64_t offset, int64_t n) {
  const std::vector<float> all = a.download();
  return std::vector<float>(all.begin() + offset, all.begin() + offset + n);
}

TEST_P(GpuElementwise, Fp32Fill) {
  const int64_t n = GetParam().n;
  DeviceArray<float> x(n + 1);
  ASSERT_EQ(run_cuda(FillParams<float>{n, 0.37, x.data()}), Status::ok);
  std::vector<float> want(n, 0.37f);
  want.push_back(kPoison);  // untouched past n
  expect_same_floats("fill", x.download(), want);
  ASSERT_EQ(run_cuda(FillParams<float>{n, -2.0, misaligned(x)}), Status::ok);
  want.assign(n + 1, -2.0f);
  want[0] = 0.37f;
  expect_same_floats("fill misaligned", x.download(), want);
}

// Scale is one fp32 multiply by the same fp32 alpha on both backends: equal
// bits. Axpy may be one fma on the device and a multiply and an add on the
// CPU: apart by at most 2 eps (|y| + |alpha x|).
TEST_P(GpuElementwise, Fp32ScaleAxpy) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const std::vector<float> a = rng.uniform<float>(n + 1), b = rng.uniform<float>(n + 1, -3.0, 3.0);
  const double alpha = -0.37;
  for (int offset : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const std::vector<float> x(a.begin() + offset, a.begin() + offset + n), y0(b.begin() + offset, b.begin() + offset + n);
    std::vector<float> scale_cpu(n), axpy_cpu = y0;
    std::vector<double> axpy_ref = cast<double>(y0);
    ASSERT_EQ(run(ScaleParams<float>{n, alpha, x.data(), scale_cpu.data()}), Status::ok);
    ASSERT_EQ(run(AxpyParams<float>{n, alpha, x.data(), axpy_cpu.data()}), Status::ok);
    const std::vector<double> x_ref = cast<double>(x);
    ASSERT_EQ(run(AxpyParams<double>{n, double(float(alpha)), x_ref.data(), axpy_ref.data()}), Status::ok);

    DeviceArray<float> da(a), out(n + 1), y(b), in_place(a);
    ASSERT_EQ(run_cuda(ScaleParams<float>{n, alpha, da.data() + offset, out.data() + offset}), Status::ok);
    const std::vector<float> untouched = slice(out, offset == 0 ? n : 0, 1);
    EXPECT_EQ(bits_of(untouched[0]), bits_of(kPoison)) << "scale wrote outside its n elements";
    expect_same_floats("scale", slice(out, offset, n), scale_cpu);

    // In place: out aliases x.
    ASSERT_EQ(run_cuda(ScaleParams<float>{n, alpha, in_place.data() + offset, in_place.data() + offset}),
              Status::ok);
    expect_same_floats("scale in place", slice(in_place, offset, n), scale_cpu);

    ASSERT_EQ(run_cuda(AxpyParams<float>{n, alpha, da.data() + offset, y.data() + offset}), Status::ok);
    const std::vector<float> got = slice(y, offset, n);
    expect_fp32_rule("axpy", got, axpy_cpu, axpy_ref);
    for (int64_t i = 0; i < n; ++i) {
      const double bound = 2 * FLT_EPSILON * (std::fabs(y0[i]) + std::fabs(float(alpha) * x[i]));
      ASSERT_LE(std::fabs(double(got[i]) - axpy_cpu[i]), bound)
          << "axpy: element " << i << " is " << got[i] << ", the CPU's " << axpy_cpu[i];
    }
  }
}

TEST_P(GpuElementwise, Fp32SumSquares) {
  const int64_t n = GetParam().n;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const std::vector<float> x = rng.uniform<float>(n + 1, -3.0, 3.0);
  const std::vector<double> x_ref = cast<double>(x);
  for (int offset : {0, 1}) {
    double cpu = 1.5, ref = 1.5;
    ASSERT_EQ(run(SumSquaresParams<float>{n, x.data() + offset, &cpu}), Status::ok);
    ASSERT_EQ(run(SumSquaresParams<double>{n, x_ref.data() + offset, &ref}), Status::ok);
    DeviceArray<float> dx(x);
    DeviceArray<double> sum(std::vector<double>{1.5});
    ASSERT_EQ(run_cuda(SumSquaresParams<float>{n, dx.data() + offset, sum.data()}), Status::ok);
    // Every square is exact in double on both backends; only the order of
    // the double adds differs.
    const double got = sum.download()[0];
    EXPECT_NEAR(got, cpu, 1e-12 * cpu) << "offset " << offset;
    EXPECT_NEAR(got, ref, 1e-12 * ref) << "offset " << offset;
  }
}

// The CPU's params rules and the workspace check hold for the fp32 launches.
TEST(GpuElementwiseArgs, Fp32RefusesInvalidParams) {
  DeviceArray<float> x(40000);
  DeviceArray<double> sum(1);
  const Stream stream = make_cuda_stream(gpu_stream());
  EXPECT_FALSE(supports(ScaleParams<float>{5, 2.0, nullptr, x.data()}, Backend::cuda));
  EXPECT_EQ(launch(ScaleParams<float>{5, 2.0, nullptr, x.data()}, Workspace{}, stream),
            Status::invalid_argument);
  EXPECT_EQ(launch(AxpyParams<float>{-1, 2.0, x.data(), x.data()}, Workspace{}, stream),
            Status::invalid_argument);
  EXPECT_EQ(launch(FillParams<float>{5, 1.0, nullptr}, Workspace{}, stream), Status::invalid_argument);
  const SumSquaresParams<float> ss{40000, x.data(), sum.data()};
  EXPECT_GT(workspace_bytes(ss, Backend::cuda), 0);
  EXPECT_EQ(launch(ss, Workspace{}, stream), Status::invalid_argument);
  EXPECT_EQ(launch(SumSquaresParams<float>{5, x.data(), nullptr}, Workspace{}, stream),
            Status::invalid_argument);
  CUDA_CHECK(cudaStreamSynchronize(gpu_stream()));
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuElementwise, ::testing::ValuesIn(elementwise_cases()), CaseName());

}  // namespace
}  // namespace weft::kernels::test
