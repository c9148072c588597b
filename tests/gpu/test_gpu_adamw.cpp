// adamw on CUDA (bf16 state) against the CPU backend: several tensors in one
// launch, with and without weight decay, clipping folded into grad_scale,
// late steps, and more tensors than one launch's table holds.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

std::vector<AdamwCase> gpu_adamw_cases() {
  std::vector<AdamwCase> cases = adamw_cases();
  std::vector<int64_t> many;
  for (int i = 0; i < 600; ++i) many.push_back(1 + (i * 37) % 101);
  many[5] = 0;  // an empty tensor is skipped
  cases.push_back({"tensors600_two_launches", many, 5, 0.1, 0.7});
  cases.push_back({"tensor9000_chunks", {9000, 4100}, 2, 0.1, 1.0});
  return cases;
}

class GpuAdamw : public ::testing::TestWithParam<AdamwCase> {};

TEST_P(GpuAdamw, MatchesCpu) {
  const AdamwCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  // lr large enough that one step moves a bf16 parameter by more than its rounding.
  const double lr = 0.02;
  const size_t count = c.sizes.size();
  std::vector<Bf16Values> param, grad, m, v;
  for (int64_t n : c.sizes) {
    param.push_back(random_bf16(rng, n));
    grad.push_back(random_bf16(rng, n, -2.0, 2.0));
    m.push_back(random_bf16(rng, n, -0.1, 0.1));
    v.push_back(random_bf16(rng, n, 0.0, 0.05));
  }
  std::vector<std::vector<double>> p_ref, m_ref, v_ref;
  std::vector<std::vector<float>> p_cpu, m_cpu, v_cpu;
  std::vector<AdamwTensor<double>> t_ref;
  std::vector<AdamwTensor<float>> t_cpu;
  for (size_t i = 0; i < count; ++i) {
    p_ref.push_back(param[i].d), m_ref.push_back(m[i].d), v_ref.push_back(v[i].d);
    p_cpu.push_back(param[i].f), m_cpu.push_back(m[i].f), v_cpu.push_back(v[i].f);
  }
  std::vector<std::unique_ptr<DeviceArray<bf16>>> d;  // param, grad, m, v per tensor
  std::vector<AdamwTensor<bf16>> t_gpu;
  for (size_t i = 0; i < count; ++i) {
    const WeightDecay decay = i % 2 == 0 ? WeightDecay::apply : WeightDecay::skip;
    const int64_t n = c.sizes[i];
    t_ref.push_back({p_ref[i].data(), grad[i].d.data(), m_ref[i].data(), v_ref[i].data(), n, decay});
    t_cpu.push_back({p_cpu[i].data(), grad[i].f.data(), m_cpu[i].data(), v_cpu[i].data(), n, decay});
    for (const Bf16Values* src : {&param[i], &grad[i], &m[i], &v[i]})
      d.push_back(std::make_unique<DeviceArray<bf16>>(src->bits));
    t_gpu.push_back({d[4 * i]->data(), d[4 * i + 1]->data(), d[4 * i + 2]->data(), d[4 * i + 3]->data(),
                     n, decay});
  }
  ASSERT_EQ(run(AdamwParams<double>{.tensors = t_ref, .step = c.step, .lr = lr,
                                    .weight_decay = c.weight_decay, .grad_scale = c.grad_scale}),
            Status::ok);
  ASSERT_EQ(run(AdamwParams<float>{.tensors = t_cpu, .step = c.step, .lr = lr,
                                   .weight_decay = c.weight_decay, .grad_scale = c.grad_scale}),
            Status::ok);
  ASSERT_EQ(run_cuda(AdamwParams<bf16>{.tensors = t_gpu, .step = c.step, .lr = lr,
                                       .weight_decay = c.weight_decay, .grad_scale = c.grad_scale}),
            Status::ok);
  // Concatenated over tensors, so that a tensor of 3 elements is not judged alone.
  std::vector<bf16> got_p, got_m, got_v;
  std::vector<float> cpu_p, cpu_m, cpu_v;
  std::vector<double> ref_p, ref_m, ref_v;
  for (size_t i = 0; i < count; ++i) {
    for (bf16 x : d[4 * i]->download()) got_p.push_back(x);
    for (bf16 x : d[4 * i + 2]->download()) got_m.push_back(x);
    for (bf16 x : d[4 * i + 3]->download()) got_v.push_back(x);
    cpu_p.insert(cpu_p.end(), p_cpu[i].begin(), p_cpu[i].end());
    cpu_m.insert(cpu_m.end(), m_cpu[i].begin(), m_cpu[i].end());
    cpu_v.insert(cpu_v.end(), v_cpu[i].begin(), v_cpu[i].end());
    ref_p.insert(ref_p.end(), p_ref[i].begin(), p_ref[i].end());
    ref_m.insert(ref_m.end(), m_ref[i].begin(), m_ref[i].end());
    ref_v.insert(ref_v.end(), v_ref[i].begin(), v_ref[i].end());
  }
  expect_bf16_rule("param", got_p, cpu_p, ref_p);
  expect_bf16_rule("m", got_m, cpu_m, ref_m);
  expect_bf16_rule("v", got_v, cpu_v, ref_v);
  // The gradients are read only.
  for (size_t i = 0; i < count; ++i) expect_same_bits("grad", d[4 * i + 1]->download(), grad[i].bits);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuAdamw, ::testing::ValuesIn(gpu_adamw_cases()), CaseName());

}  // namespace
}  // namespace weft::kernels::test
