// swiglu on CUDA (bf16) against the CPU backend, forward and backward, with
// gates far past sigmoid's saturation, in place, and off a 16-byte boundary.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/swiglu/swiglu.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

class GpuSwiglu : public ::testing::TestWithParam<SwigluCase> {};

TEST_P(GpuSwiglu, ForwardBackward) {
  const SwigluCase& c = GetParam();
  const int64_t n = c.rows * c.F;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values gate = random_bf16(rng, n, -12.0, 12.0), up = random_bf16(rng, n),
                   dact = random_bf16(rng, n);

  std::vector<double> act_ref(n), dgate_ref(n), dup_ref(n);
  std::vector<float> act_cpu(n), dgate_cpu(n), dup_cpu(n);
  ASSERT_EQ(run(SwigluForwardParams<double>{c.rows, c.F, gate.d.data(), up.d.data(), act_ref.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluForwardParams<float>{c.rows, c.F, gate.f.data(), up.f.data(), act_cpu.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluBackwardParams<double>{c.rows, c.F, gate.d.data(), up.d.data(), dact.d.data(),
                                             dgate_ref.data(), dup_ref.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluBackwardParams<float>{c.rows, c.F, gate.f.data(), up.f.data(), dact.f.data(),
                                            dgate_cpu.data(), dup_cpu.data()}),
            Status::ok);

  DeviceArray<bf16> dg(gate.bits), du(up.bits), dda(dact.bits), act(n), dgate(n), dup(n);
  ASSERT_EQ(run_cuda(SwigluForwardParams<bf16>{c.rows, c.F, dg.data(), du.data(), act.data()}),
            Status::ok);
  expect_bf16_rule("act", act.download(), act_cpu, act_ref);
  ASSERT_EQ(run_cuda(SwigluBackwardParams<bf16>{c.rows, c.F, dg.data(), du.data(), dda.data(),
                                                dgate.data(), dup.data()}),
            Status::ok);
  expect_bf16_rule("dgate", dgate.download(), dgate_cpu, dgate_ref);
  expect_bf16_rule("dup", dup.download(), dup_cpu, dup_ref);

  // The backward in the forward's buffers (dgate = gate, dup = up).
  ASSERT_EQ(run_cuda(SwigluBackwardParams<bf16>{c.rows, c.F, dg.data(), du.data(), dda.data(),
                                                dg.data(), du.data()}),
            Status::ok);
  expect_bf16_rule("dgate in place", dg.download(), dgate_cpu, dgate_ref);
  expect_bf16_rule("dup in place", du.download(), dup_cpu, dup_ref);
}

// With a row scale (an MoE expert's rows): act scaled, and the backward's
// row sums dw against the CPU backend's and an fp64 run's.
TEST_P(GpuSwiglu, RowScale) {
  const SwigluCase& c = GetParam();
  const int64_t n = c.rows * c.F;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values gate = random_bf16(rng, n, -12.0, 12.0), up = random_bf16(rng, n), dact = random_bf16(rng, n);
  const std::vector<float> w = rng.uniform<float>(c.rows, 0.05, 1);
  const std::vector<double> w64(w.begin(), w.end());
  std::vector<double> act_ref(n), dgate_ref(n), dup_ref(n), dw_ref(size_t(c.rows));
  std::vector<float> act_cpu(n), dgate_cpu(n), dup_cpu(n), dw_cpu(size_t(c.rows));
  ASSERT_EQ(run(SwigluForwardParams<double>{c.rows, c.F, gate.d.data(), up.d.data(), act_ref.data(), w64.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluForwardParams<float>{c.rows, c.F, gate.f.data(), up.f.data(), act_cpu.data(), w.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluBackwardParams<double>{c.rows, c.F, gate.d.data(), up.d.data(), dact.d.data(),
                                             dgate_ref.data(), dup_ref.data(), w64.data(), dw_ref.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluBackwardParams<float>{c.rows, c.F, gate.f.data(), up.f.data(), dact.f.data(),
                                            dgate_cpu.data(), dup_cpu.data(), w.data(), dw_cpu.data()}),
            Status::ok);
  DeviceArray<bf16> dg(gate.bits), du(up.bits), dda(dact.bits), act(n), dgate(n), dup(n);
  DeviceArray<float> dw_scale(w), dw(c.rows);
  ASSERT_EQ(run_cuda(SwigluForwardParams<bf16>{c.rows, c.F, dg.data(), du.data(), act.data(), dw_scale.data()}),
            Status::ok);
  expect_bf16_rule("act", act.download(), act_cpu, act_ref);
  ASSERT_EQ(run_cuda(SwigluBackwardParams<bf16>{c.rows, c.F, dg.data(), du.data(), dda.data(), dgate.data(),
                                                dup.data(), dw_scale.data(), dw.data()}),
            Status::ok);
  expect_bf16_rule("dgate", dgate.download(), dgate_cpu, dgate_ref);
  expect_bf16_rule("dup", dup.download(), dup_cpu, dup_ref);
  expect_fp32_rule("dw", dw.download(), dw_cpu, dw_ref);
}

TEST_P(GpuSwiglu, Misaligned) {
  const SwigluCase& c = GetParam();
  const int64_t n = c.rows * c.F;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values gate = random_bf16(rng, n + 1, -6.0, 6.0), up = random_bf16(rng, n + 1);
  std::vector<double> ref(n);
  std::vector<float> cpu(n);
  ASSERT_EQ(run(SwigluForwardParams<double>{c.rows, c.F, gate.d.data() + 1, up.d.data() + 1, ref.data()}),
            Status::ok);
  ASSERT_EQ(run(SwigluForwardParams<float>{c.rows, c.F, gate.f.data() + 1, up.f.data() + 1, cpu.data()}),
            Status::ok);
  DeviceArray<bf16> dg(gate.bits), du(up.bits), act(n + 1);
  ASSERT_EQ(run_cuda(SwigluForwardParams<bf16>{c.rows, c.F, misaligned(dg), misaligned(du),
                                               misaligned(act)}),
            Status::ok);
  std::vector<bf16> got = act.download();
  got.erase(got.begin());
  expect_bf16_rule("act misaligned", got, cpu, ref);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuSwiglu, ::testing::ValuesIn(swiglu_cases()), CaseName());

}  // namespace
}  // namespace weft::kernels::test
