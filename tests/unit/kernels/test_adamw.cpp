// adamw against the update rule written from torch.optim.AdamW's
// documentation, in fp64, over several consecutive steps of several tensors.
// (The optimizer has no gradient of its own, so there is no
// finite-difference check here.)
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

struct Hyper {
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
};

// Decoupled decay, then Adam with bias-corrected moments:
// p -= lr * m_hat / (sqrt(v_hat) + eps).
template <typename R>
void reference_step(const Hyper& hp, const AdamwCase& c, int64_t step, bool decay,
                    std::vector<R>& p, const std::vector<R>& grad, std::vector<R>& m,
                    std::vector<R>& v) {
  for (size_t i = 0; i < p.size(); ++i) {
    const R g = grad[i] * R(c.grad_scale);
    if (decay) p[i] -= R(hp.lr) * R(c.weight_decay) * p[i];
    m[i] = R(hp.beta1) * m[i] + R(1 - hp.beta1) * g;
    v[i] = R(hp.beta2) * v[i] + R(1 - hp.beta2) * g * g;
    const R m_hat = m[i] / R(1 - std::pow(hp.beta1, double(step)));
    const R v_hat = v[i] / R(1 - std::pow(hp.beta2, double(step)));
    p[i] -= R(hp.lr) * m_hat / (std::sqrt(v_hat) + R(hp.eps));
  }
}

template <typename R>
struct State {
  std::vector<std::vector<R>> p, g, m, v;
};

class AdamwTest : public ::testing::TestWithParam<AdamwCase> {};

TEST_P(AdamwTest, ThreeStepsMatchFp64Reference) {
  const AdamwCase& c = GetParam();
  const Hyper hp;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  State<float> got;
  for (int64_t n : c.sizes) {
    got.p.push_back(rng.uniform<float>(n));
    got.m.push_back(rng.uniform<float>(n, -0.1, 0.1));
    got.v.push_back(rng.uniform<float>(n, 1e-4, 1e-2));  // a second moment is positive
  }
  State<double> ref{{}, {}, {}, {}};
  for (size_t t = 0; t < c.sizes.size(); ++t) {
    ref.p.push_back(cast<double>(got.p[t]));
    ref.m.push_back(cast<double>(got.m[t]));
    ref.v.push_back(cast<double>(got.v[t]));
  }
  State<float> naive = got;
  for (int64_t step = c.step; step < c.step + 3; ++step) {
    std::vector<AdamwTensor<float>> tensors;
    std::vector<std::vector<float>> grads;
    for (size_t t = 0; t < c.sizes.size(); ++t) grads.push_back(rng.uniform<float>(c.sizes[t]));
    for (size_t t = 0; t < c.sizes.size(); ++t) {
      const bool decay = t % 2 == 0;
      tensors.push_back({got.p[t].data(), nullptr, grads[t].data(), got.m[t].data(), got.v[t].data(),
                         c.sizes[t], decay ? WeightDecay::apply : WeightDecay::skip});
      reference_step(hp, c, step, decay, ref.p[t], cast<double>(grads[t]), ref.m[t], ref.v[t]);
      reference_step(hp, c, step, decay, naive.p[t], grads[t], naive.m[t], naive.v[t]);
    }
    ASSERT_EQ(run(AdamwParams<float>{.tensors = tensors, .step = step, .lr = hp.lr,
                                     .beta1 = hp.beta1, .beta2 = hp.beta2, .eps = hp.eps,
                                     .weight_decay = c.weight_decay,
                                     .grad_scale = c.grad_scale}),
              Status::ok);
  }
  for (size_t t = 0; t < c.sizes.size(); ++t) {
    SCOPED_TRACE("tensor " + std::to_string(t));
    expect_within_rule("param", got.p[t], naive.p[t], ref.p[t]);
    expect_within_rule("m", got.m[t], naive.m[t], ref.m[t]);
    expect_within_rule("v", got.v[t], naive.v[t], ref.v[t]);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AdamwTest, ::testing::ValuesIn(adamw_cases()), CaseName{});

// The first step of Adam moves every weight by about lr (m_hat / sqrt(v_hat)
// = sign(g)), whatever the gradient's size: a check that needs no reference.
TEST(Adamw, FirstStepMovesByLearningRate) {
  std::vector<float> p = {1.0f, -2.0f}, g = {1e-3f, -50.0f}, m = {0, 0}, v = {0, 0};
  const AdamwTensor<float> t{p.data(), nullptr, g.data(), m.data(), v.data(), 2, WeightDecay::skip};
  ASSERT_EQ(run(AdamwParams<float>{.tensors = {&t, 1}, .step = 1, .lr = 0.01, .eps = 0}), Status::ok);
  EXPECT_FLOAT_EQ(p[0], 0.99f);
  EXPECT_FLOAT_EQ(p[1], -1.99f);
}

TEST(AdamwArgs, RejectsImpossibleParams) {
  std::vector<float> p(3), g(3), m(3), v(3);
  const AdamwTensor<float> t{p.data(), nullptr, g.data(), m.data(), v.data(), 3, WeightDecay::apply};
  const AdamwParams<float> ok{.tensors = {&t, 1}, .step = 1, .lr = 1e-3};
  EXPECT_TRUE(supports(ok));
  EXPECT_EQ(workspace_bytes(ok), 0);
  auto bad = ok;
  bad.step = 0;  // bias correction divides by 1 - beta^0 = 0
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.lr = NAN;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.beta2 = 1.0;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.lr = -1e-3;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  const AdamwTensor<float> no_grad{p.data(), nullptr, nullptr, m.data(), v.data(), 3, WeightDecay::apply};
  bad = ok;
  bad.tensors = {&no_grad, 1};
  EXPECT_EQ(run(bad), Status::invalid_argument);
  EXPECT_EQ(launch(ok, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);
}

}  // namespace
}  // namespace weft::kernels::test
