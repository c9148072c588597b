// rmsnorm on CUDA (bf16) against the CPU backend: fused forward with and
// without the residual add, fused backward overwriting and accumulating dx,
// and the unfused forms. dweight is fp32 (the main gradient) and accumulates
// onto a random start; with bf16 gradients (grad:bf16) it starts from random
// bf16 values, which the CPU and the fp64 reference read exactly, and the
// result is judged by the bf16 rule. The shared cases have C = 3, 37, 130 (one element per
// thread); the added ones take the 16-byte path, and one has more rows than
// the backward's 512 partial-dweight blocks.
#include <gtest/gtest.h>

#include <vector>

#include "core/layout.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

std::vector<NormCase> gpu_norm_cases() {
  std::vector<NormCase> cases = norm_cases();
  cases.push_back({"rows33_c1024_vector", 33, 1024, 1e-5});
  cases.push_back({"rows600_c4104_vector_more_rows_than_partials", 600, 4104, 1e-6});
  cases.push_back({"rows5_c8200_vector_1024_threads_loop", 5, 8200, 1e-6});
  return cases;
}

class GpuRmsnorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(GpuRmsnorm, FusedForward) {
  const NormCase& c = GetParam();
  const int64_t n = c.rows * c.C;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = random_bf16(rng, n, -2.0, 2.0), res = random_bf16(rng, n),
                   w = random_bf16(rng, c.C, 0.5, 1.5);
  for (bool with_residual : {false, true}) {
    SCOPED_TRACE(with_residual ? "with residual" : "without residual");
    std::vector<double> y_ref(n), sum_ref(n), rstd_ref(c.rows);
    std::vector<float> y_cpu(n), sum_cpu(n), rstd_cpu(c.rows);
    ASSERT_EQ(run(RmsnormForwardParams<double>{c.rows, c.C, c.eps, x.d.data(),
                                               with_residual ? res.d.data() : nullptr, sum_ref.data(),
                                               w.d.data(), y_ref.data(), rstd_ref.data()}),
              Status::ok);
    ASSERT_EQ(run(RmsnormForwardParams<float>{c.rows, c.C, c.eps, x.f.data(),
                                              with_residual ? res.f.data() : nullptr, sum_cpu.data(),
                                              w.f.data(), y_cpu.data(), rstd_cpu.data()}),
              Status::ok);
    DeviceArray<bf16> dx(x.bits), dres(res.bits), dw(w.bits), y(n), sum(n);
    DeviceArray<float> rstd(c.rows);
    ASSERT_EQ(run_cuda(RmsnormForwardParams<bf16>{c.rows, c.C, c.eps, dx.data(),
                                                  with_residual ? dres.data() : nullptr, sum.data(),
                                                  dw.data(), y.data(), rstd.data()}),
              Status::ok);
    if (with_residual) {
      expect_bf16_rule("sum", sum.download(), sum_cpu, sum_ref);
      // The device normalises the sum it writes, rounded to bf16 (the next
      // residual stream, which the backward reads): the references for y and
      // rstd start from that rounded sum.
      std::vector<double> rounded_d(n);
      std::vector<float> rounded_f(n);
      for (int64_t i = 0; i < n; ++i) {
        rounded_f[i] = bf16_to_float(float_to_bf16(x.f[i] + res.f[i]));
        rounded_d[i] = rounded_f[i];
      }
      ASSERT_EQ(run(RmsnormForwardParams<double>{c.rows, c.C, c.eps, rounded_d.data(), nullptr, nullptr,
                                                 w.d.data(), y_ref.data(), rstd_ref.data()}),
                Status::ok);
      ASSERT_EQ(run(RmsnormForwardParams<float>{c.rows, c.C, c.eps, rounded_f.data(), nullptr, nullptr,
                                                w.f.data(), y_cpu.data(), rstd_cpu.data()}),
                Status::ok);
    }
    expect_bf16_rule("y", y.download(), y_cpu, y_ref);
    expect_fp32_rule("rstd", rstd.download(), rstd_cpu, rstd_ref);

    // The sum written over the residual stream itself (sum aliases residual).
    if (with_residual) {
      ASSERT_EQ(run_cuda(RmsnormForwardParams<bf16>{c.rows, c.C, c.eps, dx.data(), dres.data(),
                                                    dres.data(), dw.data(), y.data(), rstd.data()}),
                Status::ok);
      expect_bf16_rule("sum in place", dres.download(), sum_cpu, sum_ref);
      expect_bf16_rule("y with sum in place", y.download(), y_cpu, y_ref);
    }
  }
}

TEST_P(GpuRmsnorm, FusedBackward) {
  const NormCase& c = GetParam();
  const int64_t n = c.rows * c.C;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = random_bf16(rng, n, -2.0, 2.0), w = random_bf16(rng, c.C, 0.5, 1.5),
                   dy = random_bf16(rng, n), dx0 = random_bf16(rng, n);
  const std::vector<float> rstd_f = rng.uniform<float>(c.rows, 0.5, 2.0);
  const std::vector<double> rstd_d(rstd_f.begin(), rstd_f.end());
  const std::vector<float> dw0 = rng.uniform<float>(c.C);
  for (Write write : {Write::overwrite, Write::accumulate}) {
    SCOPED_TRACE(write == Write::overwrite ? "overwrite dx" : "accumulate dx");
    std::vector<double> dx_ref = dx0.d, dw_ref = cast<double>(dw0);
    std::vector<float> dx_cpu = dx0.f, dw_cpu = dw0;
    ASSERT_EQ(run(RmsnormBackwardParams<double>{c.rows, c.C, x.d.data(), w.d.data(), rstd_d.data(),
                                                dy.d.data(), dx_ref.data(), write, dw_ref.data()}),
              Status::ok);
    ASSERT_EQ(run(RmsnormBackwardParams<float>{c.rows, c.C, x.f.data(), w.f.data(), rstd_f.data(),
                                               dy.f.data(), dx_cpu.data(), write, dw_cpu.data()}),
              Status::ok);
    DeviceArray<bf16> dx(n), dxs(x.bits), dws(w.bits), ddy(dy.bits);
    if (write == Write::accumulate) dx.upload(dx0.bits);
    DeviceArray<float> rstd(rstd_f), dw(dw0);
    ASSERT_EQ(run_cuda(RmsnormBackwardParams<bf16>{c.rows, c.C, dxs.data(), dws.data(), rstd.data(),
                                                   ddy.data(), dx.data(), write, dw.data()}),
              Status::ok);
    expect_bf16_rule("dx", dx.download(), dx_cpu, dx_ref);
    expect_fp32_rule("dweight", dw.download(), dw_cpu, dw_ref);
  }
}

TEST_P(GpuRmsnorm, UnfusedForwardAndBackward) {
  const NormCase& c = GetParam();
  const int64_t n = c.rows * c.C;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = random_bf16(rng, n, -2.0, 2.0), w = random_bf16(rng, c.C, 0.5, 1.5);
  std::vector<double> y_ref(n), rstd_ref(c.rows), xhat_ref(n);
  std::vector<float> y_cpu(n), rstd_cpu(c.rows), xhat_cpu(n);
  ASSERT_EQ(run(RmsnormUnfusedForwardParams<double>{c.rows, c.C, c.eps, x.d.data(), w.d.data(),
                                                    y_ref.data(), rstd_ref.data(), xhat_ref.data()}),
            Status::ok);
  ASSERT_EQ(run(RmsnormUnfusedForwardParams<float>{c.rows, c.C, c.eps, x.f.data(), w.f.data(),
                                                   y_cpu.data(), rstd_cpu.data(), xhat_cpu.data()}),
            Status::ok);
  DeviceArray<bf16> dx(x.bits), dw(w.bits), y(n);
  DeviceArray<float> rstd(c.rows), xhat(n);
  ASSERT_EQ(run_cuda(RmsnormUnfusedForwardParams<bf16>{c.rows, c.C, c.eps, dx.data(), dw.data(),
                                                       y.data(), rstd.data(), xhat.data()}),
            Status::ok);
  expect_bf16_rule("y", y.download(), y_cpu, y_ref);
  expect_fp32_rule("rstd", rstd.download(), rstd_cpu, rstd_ref);
  expect_fp32_rule("x_hat", xhat.download(), xhat_cpu, xhat_ref);

  // The backward on fp32 x_hat and rstd of its own (both backends read the same values).
  const std::vector<float> xh_f = rng.uniform<float>(n, -2.0, 2.0);
  const std::vector<float> rs_f = rng.uniform<float>(c.rows, 0.5, 2.0);
  const std::vector<double> xh_d(xh_f.begin(), xh_f.end()), rs_d(rs_f.begin(), rs_f.end());
  const Bf16Values dy = random_bf16(rng, n), dx0 = random_bf16(rng, n);
  const std::vector<float> dw0 = rng.uniform<float>(c.C);
  for (Write write : {Write::overwrite, Write::accumulate}) {
    SCOPED_TRACE(write == Write::overwrite ? "overwrite dx" : "accumulate dx");
    std::vector<double> dx_ref = dx0.d, dw_ref = cast<double>(dw0);
    std::vector<float> dx_cpu = dx0.f, dw_cpu = dw0;
    ASSERT_EQ(run(RmsnormUnfusedBackwardParams<double>{c.rows, c.C, xh_d.data(), rs_d.data(), w.d.data(),
                                                       dy.d.data(), dx_ref.data(), write, dw_ref.data()}),
              Status::ok);
    ASSERT_EQ(run(RmsnormUnfusedBackwardParams<float>{c.rows, c.C, xh_f.data(), rs_f.data(), w.f.data(),
                                                      dy.f.data(), dx_cpu.data(), write, dw_cpu.data()}),
              Status::ok);
    DeviceArray<float> dxh(xh_f), drs(rs_f), ddw(dw0);
    DeviceArray<bf16> ddy(dy.bits), ddx(n);
    if (write == Write::accumulate) ddx.upload(dx0.bits);
    ASSERT_EQ(run_cuda(RmsnormUnfusedBackwardParams<bf16>{c.rows, c.C, dxh.data(), drs.data(), dw.data(),
                                                          ddy.data(), ddx.data(), write, ddw.data()}),
              Status::ok);
    expect_bf16_rule("dx", ddx.download(), dx_cpu, dx_ref);
    expect_fp32_rule("dweight", ddw.download(), dw_cpu, dw_ref);
  }
}

// grad:bf16: both backwards add their fp32 sum over rows to a bf16 dweight
// with one rounding; dx is as with fp32 gradients.
TEST_P(GpuRmsnorm, BackwardsIntoBf16Dweight) {
  const NormCase& c = GetParam();
  const int64_t n = c.rows * c.C;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values x = random_bf16(rng, n, -2.0, 2.0), w = random_bf16(rng, c.C, 0.5, 1.5),
                   dy = random_bf16(rng, n), dw0 = random_bf16(rng, c.C);
  const std::vector<float> rstd_f = rng.uniform<float>(c.rows, 0.5, 2.0);
  const std::vector<float> xh_f = rng.uniform<float>(n, -2.0, 2.0);
  const std::vector<double> rstd_d = cast<double>(rstd_f), xh_d = cast<double>(xh_f);
  DeviceArray<bf16> dx(n), dxs(x.bits), dws(w.bits), ddy(dy.bits);
  DeviceArray<float> rstd(rstd_f), xhat(xh_f);
  for (NormKind kind : {NormKind::fused, NormKind::unfused}) {
    SCOPED_TRACE(kind == NormKind::fused ? "fused" : "unfused");
    std::vector<double> dx_ref(n), dw_ref = dw0.d;
    std::vector<float> dx_cpu(n), dw_cpu = dw0.f;
    DeviceArray<bf16> dw(dw0.bits);
    dx.poison();
    if (kind == NormKind::fused) {
      ASSERT_EQ(run(RmsnormBackwardParams<double>{c.rows, c.C, x.d.data(), w.d.data(), rstd_d.data(),
                                                  dy.d.data(), dx_ref.data(), Write::overwrite,
                                                  dw_ref.data()}),
                Status::ok);
      ASSERT_EQ(run(RmsnormBackwardParams<float>{c.rows, c.C, x.f.data(), w.f.data(), rstd_f.data(),
                                                 dy.f.data(), dx_cpu.data(), Write::overwrite,
                                                 dw_cpu.data()}),
                Status::ok);
      ASSERT_EQ(run_cuda(RmsnormBackwardParams<bf16, bf16>{c.rows, c.C, dxs.data(), dws.data(),
                                                           rstd.data(), ddy.data(), dx.data(),
                                                           Write::overwrite, dw.data()}),
                Status::ok);
    } else {
      ASSERT_EQ(run(RmsnormUnfusedBackwardParams<double>{c.rows, c.C, xh_d.data(), rstd_d.data(),
                                                         w.d.data(), dy.d.data(), dx_ref.data(),
                                                         Write::overwrite, dw_ref.data()}),
                Status::ok);
      ASSERT_EQ(run(RmsnormUnfusedBackwardParams<float>{c.rows, c.C, xh_f.data(), rstd_f.data(),
                                                        w.f.data(), dy.f.data(), dx_cpu.data(),
                                                        Write::overwrite, dw_cpu.data()}),
                Status::ok);
      ASSERT_EQ(run_cuda(RmsnormUnfusedBackwardParams<bf16, bf16>{c.rows, c.C, xhat.data(), rstd.data(),
                                                                  dws.data(), ddy.data(), dx.data(),
                                                                  Write::overwrite, dw.data()}),
                Status::ok);
    }
    expect_bf16_rule("dx", dx.download(), dx_cpu, dx_ref);
    expect_bf16_rule("dweight (bf16)", dw.download(), dw_cpu, dw_ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuRmsnorm, ::testing::ValuesIn(gpu_norm_cases()), CaseName());

}  // namespace
}  // namespace weft::kernels::test
