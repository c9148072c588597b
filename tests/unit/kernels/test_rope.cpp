// rope: the Hugging Face rotate_half layout against an fp64 reference (plain
// and with Llama 3 scaled frequencies), the backward as the exact transpose
// (finite differences), and round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/rope/rope.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

// Llama 3's frequency, written from the Llama 3.1 reference code's view: a
// pair that turns more than high_freq_factor times within the original
// context keeps f, one that turns fewer than low_freq_factor times takes
// f / factor, and in between the weight of f grows linearly with the turns.
template <typename R>
R llama3_frequency(R f, const RopeScaling& s) {
  if (!s.enabled()) return f;
  const R turns = R(s.original_max_position) * f / R(2 * 3.14159265358979323846);
  if (turns > R(s.high_freq_factor)) return f;
  if (turns < R(s.low_freq_factor)) return f / R(s.factor);
  const R w = (turns - R(s.low_freq_factor)) / R(s.high_freq_factor - s.low_freq_factor);
  return w * f + (R(1) - w) * f / R(s.factor);
}

// transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin with
// rotate_half(x) = cat(-x[D/2:], x[:D/2]) and cos, sin of
// cat(freqs, freqs), freqs = position * theta^(-2i / D) (scaled). `sign` = -1
// applies the transpose (the backward).
template <typename R>
void reference(const RopeCase& c, int64_t heads, std::vector<R>& x, R sign) {
  const int64_t half = c.D / 2;
  std::vector<R> rotated(c.D);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        R* v = &x[((b * c.T + t) * heads + h) * c.D];
        for (int64_t i = 0; i < c.D; ++i) {
          const int64_t f = i % half;
          const R angle = R(c.position_offset + t) *
                          llama3_frequency(std::pow(R(c.theta), -R(2 * f) / R(c.D)), c.scaling);
          const R other = i < half ? -v[i + half] : v[i - half];
          rotated[i] = v[i] * std::cos(angle) + sign * other * std::sin(angle);
        }
        std::copy(rotated.begin(), rotated.end(), v);
      }
}

template <typename E>
RopeParams<E> params(const RopeCase& c, RopeDirection dir, std::vector<E>& q, std::vector<E>& k) {
  return {.direction = dir, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D,
          .position_offset = c.position_offset, .theta = c.theta, .scaling = c.scaling,
          .q = q.data(), .k = k.data()};
}

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, ForwardAndBackwardMatchFp64Reference) {
  const RopeCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  for (RopeDirection dir : {RopeDirection::forward, RopeDirection::backward}) {
    SCOPED_TRACE(dir == RopeDirection::forward ? "forward" : "backward");
    const double sign = dir == RopeDirection::forward ? 1.0 : -1.0;
    auto q = rng.uniform<float>(c.B * c.T * c.H * c.D), k = rng.uniform<float>(c.B * c.T * c.H_kv * c.D);
    auto ref_q = cast<double>(q), ref_k = cast<double>(k);
    auto naive_q = q, naive_k = k;
    reference(c, c.H, ref_q, sign);
    reference(c, c.H_kv, ref_k, sign);
    reference(c, c.H, naive_q, float(sign));
    reference(c, c.H_kv, naive_k, float(sign));
    ASSERT_EQ(run(params(c, dir, q, k)), Status::ok);
    expect_within_rule("q", q, naive_q, ref_q);
    expect_within_rule("k", k, naive_k, ref_k);
  }
}

// The rotation is linear, so the backward must be exactly the gradient of
// L = <r_q, rope(q)> + <r_k, rope(k)>.
TEST_P(RopeTest, BackwardMatchesFiniteDifferences) {
  const RopeCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  auto q = rng.uniform<double>(c.B * c.T * c.H * c.D), k = rng.uniform<double>(c.B * c.T * c.H_kv * c.D);
  const auto r_q = rng.uniform<double>(q.size()), r_k = rng.uniform<double>(k.size());
  auto loss = [&] {
    auto q1 = q, k1 = k;
    run_or_throw(params(c, RopeDirection::forward, q1, k1));
    return dot(r_q, q1) + dot(r_k, k1);
  };
  auto dq = r_q, dk = r_k;
  ASSERT_EQ(run(params(c, RopeDirection::backward, dq, dk)), Status::ok);
  EXPECT_LE(fd_error(q, dq, loss, rng), kFdTolerance) << "dq";
  EXPECT_LE(fd_error(k, dk, loss, rng), kFdTolerance) << "dk";
}

TEST_P(RopeTest, BackwardUndoesForward) {
  const RopeCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto q0 = rng.uniform<double>(c.B * c.T * c.H * c.D);
  const auto k0 = rng.uniform<double>(c.B * c.T * c.H_kv * c.D);
  auto q = q0, k = k0;
  ASSERT_EQ(run(params(c, RopeDirection::forward, q, k)), Status::ok);
  ASSERT_EQ(run(params(c, RopeDirection::backward, q, k)), Status::ok);
  // Two rotations in double: a few ulps of the inputs.
  EXPECT_LE(rel_l2(q, q0), 1e-14);
  EXPECT_LE(rel_l2(k, k0), 1e-14);
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeTest, ::testing::ValuesIn(rope_cases()), CaseName{});

// A sequence shard starting at position s must rotate its rows exactly as the
// full sequence rotates rows s, s + 1, ...
TEST(RopeOffset, ShardMatchesSliceOfFullSequence) {
  const RopeCase full{"full", 1, 13, 4, 2, 8, 0, 10000.0};
  Rng rng;
  SCOPED_TRACE(rng.trace());
  auto q = rng.uniform<float>(13 * 4 * 8), k = rng.uniform<float>(13 * 2 * 8);
  std::vector<float> q_shard(q.begin() + 5 * 32, q.end()), k_shard(k.begin() + 5 * 16, k.end());
  ASSERT_EQ(run(params(full, RopeDirection::forward, q, k)), Status::ok);
  const RopeCase shard{"shard", 1, 8, 4, 2, 8, 5, 10000.0};
  ASSERT_EQ(run(params(shard, RopeDirection::forward, q_shard, k_shard)), Status::ok);
  EXPECT_EQ(q_shard, std::vector<float>(q.begin() + 5 * 32, q.end()));
  EXPECT_EQ(k_shard, std::vector<float>(k.begin() + 5 * 16, k.end()));
}

TEST(RopeArgs, RejectsImpossibleParams) {
  std::vector<float> q(2 * 4 * 6), k(2 * 2 * 6);
  const RopeCase c{"args", 1, 2, 4, 2, 6, 0, 10000.0};
  const auto ok = params(c, RopeDirection::forward, q, k);
  EXPECT_TRUE(supports(ok));
  EXPECT_GE(workspace_bytes(ok), int64_t{2 * 2 * 3 * 4}) << "cos and sin, (T, D/2) each";
  auto bad = ok;
  bad.D = 5;  // rotate_half pairs need an even head dim
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.theta = 0;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.position_offset = -1;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  auto scaled = ok;
  scaled.scaling = rope_scaling_llama3(8.0, 1.0, 4.0, 8192);
  EXPECT_TRUE(supports(scaled));
  for (auto broken : {rope_scaling_llama3(0.5, 1.0, 4.0, 8192), rope_scaling_llama3(8.0, 4.0, 4.0, 8192),
                      rope_scaling_llama3(8.0, 1.0, 4.0, 0)}) {
    bad = ok;
    bad.scaling = broken;
    EXPECT_EQ(run(bad), Status::invalid_argument);
  }
  EXPECT_EQ(launch(ok, {}, {}), Status::invalid_argument) << "no workspace for the table";
}

}  // namespace
}  // namespace weft::kernels::test
