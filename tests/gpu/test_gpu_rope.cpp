// rope on CUDA (bf16) against the CPU backend, both directions, on the shared
// cases (D = 6, 8: one pair per thread; Llama 3 scaled frequencies at D = 6
// and 16) and on head dims whose halves are multiples of 8 (16-byte pieces),
// with long position offsets, plain and with Llama 3.1's scaling.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/rope/rope.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

std::vector<RopeCase> gpu_rope_cases() {
  std::vector<RopeCase> cases = rope_cases();
  cases.push_back({"b2_t37_h4_kv2_d16_vector", 2, 37, 4, 2, 16, 5, 10000.0});
  cases.push_back({"b1_t64_h8_kv2_d128_vector_offset4000_theta5e5", 1, 64, 8, 2, 128, 4000, 500000.0});
  // Llama 3.1's scaling (factor 8, 1, 4, 8192): of the 64 pairs, 0-28 are
  // kept, 29-34 interpolated and 35-63 slowed.
  cases.push_back({"b1_t64_h8_kv2_d128_vector_offset4000_llama3_1", 1, 64, 8, 2, 128, 4000, 500000.0,
                   rope_scaling_llama3(8.0, 1.0, 4.0, 8192)});
  return cases;
}

class GpuRope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(GpuRope, ForwardAndBackward) {
  const RopeCase& c = GetParam();
  const int64_t nq = c.B * c.T * c.H * c.D, nk = c.B * c.T * c.H_kv * c.D;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Bf16Values q = random_bf16(rng, nq), k = random_bf16(rng, nk);
  for (RopeDirection direction : {RopeDirection::forward, RopeDirection::backward}) {
    SCOPED_TRACE(direction == RopeDirection::forward ? "forward" : "backward");
    std::vector<double> q_ref = q.d, k_ref = k.d;
    std::vector<float> q_cpu = q.f, k_cpu = k.f;
    ASSERT_EQ(run(RopeParams<double>{direction, c.B, c.T, c.H, c.H_kv, c.D, c.position_offset,
                                     c.theta, c.scaling, q_ref.data(), k_ref.data()}),
              Status::ok);
    ASSERT_EQ(run(RopeParams<float>{direction, c.B, c.T, c.H, c.H_kv, c.D, c.position_offset,
                                    c.theta, c.scaling, q_cpu.data(), k_cpu.data()}),
              Status::ok);
    DeviceArray<bf16> dq(q.bits), dk(k.bits);
    ASSERT_EQ(run_cuda(RopeParams<bf16>{direction, c.B, c.T, c.H, c.H_kv, c.D, c.position_offset,
                                        c.theta, c.scaling, dq.data(), dk.data()}),
              Status::ok);
    expect_bf16_rule("q", dq.download(), q_cpu, q_ref);
    expect_bf16_rule("k", dk.download(), k_cpu, k_ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuRope, ::testing::ValuesIn(gpu_rope_cases()), CaseName());

}  // namespace
}  // namespace weft::kernels::test
