// adamw on CUDA (bf16 weights, fp32 master weights and moments, fp32 or
// bf16 gradients) against the CPU backend: several tensors in one launch,
// with and without weight decay, clipping folded into grad_scale, late
// steps, more tensors than one launch's table holds, and tensors one element
// off a 16-byte boundary. The bf16 weights must be the new master's
// rounding, bit for bit. bf16 gradients (grad:bf16) are random values
// rounded to bf16, which the CPU and the fp64 reference read exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <type_traits>
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

// One tensor's state on the device, `offset` elements into each array
// (offset 1 puts every pointer off a 16-byte boundary); param starts
// poisoned. G: the gradients' type, float or bf16.
template <typename G>
struct DeviceTensor {
  DeviceTensor(int64_t offset, const std::vector<float>& master0, const std::vector<G>& grad0,
               const std::vector<float>& m0, const std::vector<float>& v0)
      : offset(offset),
        param(offset + int64_t(master0.size())),
        master(padded(master0)),
        grad(padded(grad0)),
        m(padded(m0)),
        v(padded(v0)) {}

  template <typename T>
  std::vector<T> padded(const std::vector<T>& values) const {
    std::vector<T> out(size_t(offset), T{});
    out.insert(out.end(), values.begin(), values.end());
    return out;
  }
  template <typename T>
  std::vector<T> download(const DeviceArray<T>& a) const {
    std::vector<T> out = a.download();
    out.erase(out.begin(), out.begin() + offset);
    return out;
  }

  int64_t offset;
  DeviceArray<bf16> param;
  DeviceArray<float> master;
  DeviceArray<G> grad;
  DeviceArray<float> m, v;
};

// The update on the GPU with gradients in G against the CPU's fp32 and fp64
// updates on the same (for bf16, the rounded) gradient values.
template <typename G>
void expect_adamw_matches_cpu(const AdamwCase& c) {
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const double lr = 0.02;
  const size_t count = c.sizes.size();
  std::vector<std::vector<float>> master0, grad, m0, v0;
  std::vector<std::vector<G>> grad_gpu;
  for (int64_t n : c.sizes) {
    master0.push_back(rng.uniform<float>(n));
    if constexpr (std::is_same_v<G, bf16>) {
      const Bf16Values g = random_bf16(rng, n, -2.0, 2.0);
      grad.push_back(g.f);
      grad_gpu.push_back(g.bits);
    } else {
      grad.push_back(rng.uniform<float>(n, -2.0, 2.0));
      grad_gpu.push_back(grad.back());
    }
    m0.push_back(rng.uniform<float>(n, -0.1, 0.1));
    v0.push_back(rng.uniform<float>(n, 0.0, 0.05));
  }
  // fp32 and fp64 weights are their own master.
  std::vector<std::vector<double>> p_ref, m_ref, v_ref, g_ref;
  std::vector<std::vector<float>> p_cpu = master0, m_cpu = m0, v_cpu = v0;
  for (size_t i = 0; i < count; ++i) {
    p_ref.push_back(cast<double>(master0[i])), m_ref.push_back(cast<double>(m0[i]));
    v_ref.push_back(cast<double>(v0[i])), g_ref.push_back(cast<double>(grad[i]));
  }
  std::vector<AdamwTensor<double>> t_ref;
  std::vector<AdamwTensor<float>> t_cpu;
  std::vector<std::unique_ptr<DeviceTensor<G>>> d;
  std::vector<AdamwTensor<bf16, G>> t_gpu;
  for (size_t i = 0; i < count; ++i) {
    const WeightDecay decay = i % 2 == 0 ? WeightDecay::apply : WeightDecay::skip;
    const int64_t n = c.sizes[i];
    t_ref.push_back({p_ref[i].data(), nullptr, g_ref[i].data(), m_ref[i].data(), v_ref[i].data(), n, decay});
    t_cpu.push_back({p_cpu[i].data(), nullptr, grad[i].data(), m_cpu[i].data(), v_cpu[i].data(), n, decay});
    const int64_t offset = i % 3 == 2 ? 1 : 0;
    d.push_back(std::make_unique<DeviceTensor<G>>(offset, master0[i], grad_gpu[i], m0[i], v0[i]));
    const DeviceTensor<G>& t = *d.back();
    t_gpu.push_back({t.param.data() + offset, t.master.data() + offset, t.grad.data() + offset,
                     t.m.data() + offset, t.v.data() + offset, n, decay});
  }
  ASSERT_EQ(run(AdamwParams<double>{.tensors = t_ref, .step = c.step, .lr = lr,
                                    .weight_decay = c.weight_decay, .grad_scale = c.grad_scale}),
            Status::ok);
  ASSERT_EQ(run(AdamwParams<float>{.tensors = t_cpu, .step = c.step, .lr = lr,
                                   .weight_decay = c.weight_decay, .grad_scale = c.grad_scale}),
            Status::ok);
  ASSERT_EQ(run_cuda(AdamwParams<bf16, G>{.tensors = t_gpu, .step = c.step, .lr = lr,
                                          .weight_decay = c.weight_decay, .grad_scale = c.grad_scale}),
            Status::ok);
  // Concatenated over tensors, so that a tensor of 3 elements is not judged
  // alone. The update (new master - old) is judged on its own too: against
  // weights of order 1 a wrong step of order lr would hide under the rule.
  std::vector<float> got_master, got_m, got_v, got_step, cpu_master, cpu_m, cpu_v, cpu_step;
  std::vector<double> ref_master, ref_m, ref_v, ref_step;
  for (size_t i = 0; i < count; ++i) {
    const DeviceTensor<G>& t = *d[i];
    const std::vector<float> master = t.download(t.master);
    const std::vector<bf16> param = t.download(t.param);
    for (size_t j = 0; j < master.size(); ++j) {
      ASSERT_EQ(param[j].bits, float_to_bf16(master[j]).bits)
          << "tensor " << i << " element " << j << ": param " << bf16_to_float(param[j])
          << " is not the rounding of master " << master[j];
      got_step.push_back(float(double(master[j]) - master0[i][j]));
      cpu_step.push_back(float(double(p_cpu[i][j]) - master0[i][j]));
      ref_step.push_back(p_ref[i][j] - master0[i][j]);
    }
    const auto append = [&](std::vector<float>& to, const DeviceArray<float>& from) {
      const std::vector<float> values = t.download(from);
      to.insert(to.end(), values.begin(), values.end());
    };
    append(got_master, t.master);
    append(got_m, t.m);
    append(got_v, t.v);
    cpu_master.insert(cpu_master.end(), p_cpu[i].begin(), p_cpu[i].end());
    cpu_m.insert(cpu_m.end(), m_cpu[i].begin(), m_cpu[i].end());
    cpu_v.insert(cpu_v.end(), v_cpu[i].begin(), v_cpu[i].end());
    ref_master.insert(ref_master.end(), p_ref[i].begin(), p_ref[i].end());
    ref_m.insert(ref_m.end(), m_ref[i].begin(), m_ref[i].end());
    ref_v.insert(ref_v.end(), v_ref[i].begin(), v_ref[i].end());
    // The gradients are read only.
    const std::vector<G> grad_after = t.download(t.grad);
    for (size_t j = 0; j < grad_after.size(); ++j)
      ASSERT_EQ(std::memcmp(&grad_after[j], &grad_gpu[i][j], sizeof(G)), 0)
          << "tensor " << i << " element " << j << ": grad was written";
  }
  expect_fp32_rule("master", got_master, cpu_master, ref_master);
  expect_fp32_rule("update", got_step, cpu_step, ref_step);
  expect_fp32_rule("m", got_m, cpu_m, ref_m);
  expect_fp32_rule("v", got_v, cpu_v, ref_v);
}

class GpuAdamw : public ::testing::TestWithParam<AdamwCase> {};

TEST_P(GpuAdamw, MatchesCpu) { expect_adamw_matches_cpu<float>(GetParam()); }

// grad:bf16: the same update, reading each bf16 gradient as its fp32 value.
TEST_P(GpuAdamw, MatchesCpuWithBf16Gradients) { expect_adamw_matches_cpu<bf16>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cases, GpuAdamw, ::testing::ValuesIn(gpu_adamw_cases()), CaseName());

}  // namespace
}  // namespace weft::kernels::test
