// attention: both variants against an fp64 reference and finite differences,
// and against each other.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/attention/attention.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/attention_reference.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

constexpr AttentionKind kKinds[] = {AttentionKind::flash, AttentionKind::materialized};

// One forward and backward of the kernel; lse is written by both variants.
template <typename E>
struct Run {
  std::vector<E> out, probs, dq, dk, dv;
  std::vector<E> lse;
};

template <typename E>
Run<E> run_kernel(const AttentionCase& c, AttentionKind kind, const std::vector<E>& q,
                  const std::vector<E>& k, const std::vector<E>& v, const std::vector<E>& dout) {
  Run<E> r;
  r.out.resize(q.size());
  r.dq.resize(q.size());
  r.dk.resize(k.size());
  r.dv.resize(v.size());
  r.lse.resize(c.B * c.H * c.T);
  if (kind == AttentionKind::materialized) r.probs.resize(c.B * c.H * c.T * c.T);
  run_or_throw(AttentionForwardParams<E>{.kind = kind, .B = c.B, .T = c.T, .H = c.H,
                                         .H_kv = c.H_kv, .D = c.D, .q = q.data(), .k = k.data(),
                                         .v = v.data(), .out = r.out.data(), .lse = r.lse.data(),
                                         .probs = r.probs.data()});
  run_or_throw(AttentionBackwardParams<E>{
      .kind = kind, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D, .q = q.data(),
      .k = k.data(), .v = v.data(), .out = r.out.data(), .lse = r.lse.data(),
      .probs = r.probs.data(), .dout = dout.data(), .dq = r.dq.data(), .dk = r.dk.data(),
      .dv = r.dv.data()});
  return r;
}

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionTest, ForwardBackwardMatchFp64Reference) {
  const AttentionCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  // Scores of order a few units, so the softmax is neither flat nor one-hot.
  auto q = rng.uniform<float>(nq, -2, 2), k = rng.uniform<float>(nkv, -2, 2);
  auto v = rng.uniform<float>(nkv), dout = rng.uniform<float>(nq);
  const auto ref = textbook_attention<double>(c, q, k, v, dout);
  const auto naive = textbook_attention<float>(c, q, k, v, dout);
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const auto got = run_kernel(c, kind, q, k, v, dout);
    expect_within_rule("out", got.out, naive.out, ref.out);
    expect_within_rule("lse", got.lse, naive.lse, ref.lse);
    if (kind == AttentionKind::materialized) expect_within_rule("probs", got.probs, naive.probs, ref.probs);
    expect_within_rule("dq", got.dq, naive.dq, ref.dq);
    expect_within_rule("dk", got.dk, naive.dk, ref.dk);
    expect_within_rule("dv", got.dv, naive.dv, ref.dv);
  }
}

// Each variant is within the rule of the reference, so the two may differ by
// twice the rule's bound at most.
TEST_P(AttentionTest, FlashAndMaterializedAgree) {
  const AttentionCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  auto q = rng.uniform<float>(nq, -2, 2), k = rng.uniform<float>(nkv, -2, 2);
  auto v = rng.uniform<float>(nkv), dout = rng.uniform<float>(nq);
  const auto ref = textbook_attention<double>(c, q, k, v, dout);
  const auto naive = textbook_attention<float>(c, q, k, v, dout);
  const auto flash = run_kernel(c, AttentionKind::flash, q, k, v, dout);
  const auto mat = run_kernel(c, AttentionKind::materialized, q, k, v, dout);
  auto agree = [](const char* what, const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<float>& naive_fp32, const std::vector<double>& reference) {
    const double bound = 2 * kErrorMultiple *
                         std::max(rel_l2(naive_fp32, reference),
                                  double(std::numeric_limits<float>::epsilon()));
    double diff = 0, norm = 0;  // ||a - b|| / ||reference||, the rule's scale
    for (size_t i = 0; i < a.size(); ++i) {
      diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
      norm += reference[i] * reference[i];
    }
    EXPECT_LE(norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff), bound) << what;
  };
  agree("out", flash.out, mat.out, naive.out, ref.out);
  agree("lse", flash.lse, mat.lse, naive.lse, ref.lse);
  agree("dq", flash.dq, mat.dq, naive.dq, ref.dq);
  agree("dk", flash.dk, mat.dk, naive.dk, ref.dk);
  agree("dv", flash.dv, mat.dv, naive.dv, ref.dv);
}

TEST_P(AttentionTest, GradientsMatchFiniteDifferences) {
  const AttentionCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  auto q = rng.uniform<double>(nq, -2, 2), k = rng.uniform<double>(nkv, -2, 2);
  auto v = rng.uniform<double>(nkv);
  const auto r_out = rng.uniform<double>(nq);
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const auto grads = run_kernel(c, kind, q, k, v, r_out);
    std::vector<double> out(nq), lse(c.B * c.H * c.T), probs(c.B * c.H * c.T * c.T);
    auto loss = [&] {
      run_or_throw(AttentionForwardParams<double>{
          .kind = kind, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D, .q = q.data(),
          .k = k.data(), .v = v.data(), .out = out.data(), .lse = lse.data(),
          .probs = probs.data()});
      return dot(r_out, out);
    };
    EXPECT_LE(fd_error(q, grads.dq, loss, rng), kFdTolerance) << "dq";
    EXPECT_LE(fd_error(k, grads.dk, loss, rng), kFdTolerance) << "dk";
    EXPECT_LE(fd_error(v, grads.dv, loss, rng), kFdTolerance) << "dv";
  }
}

// The backward's dk, dv sum over query heads and rows; the kernel promises
// the same bits on any number of threads.
TEST_P(AttentionTest, ResultsDoNotDependOnThreadCount) {
  const AttentionCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  auto q = rng.uniform<float>(nq, -2, 2), k = rng.uniform<float>(nkv, -2, 2);
  auto v = rng.uniform<float>(nkv), dout = rng.uniform<float>(nq);
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const auto one = with_threads(1, [&] { return run_kernel(c, kind, q, k, v, dout); });
    const auto three = with_threads(3, [&] { return run_kernel(c, kind, q, k, v, dout); });
    EXPECT_EQ(one.out, three.out);
    EXPECT_EQ(one.lse, three.lse);
    EXPECT_EQ(one.dq, three.dq);
    EXPECT_EQ(one.dk, three.dk);
    EXPECT_EQ(one.dv, three.dv);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionTest, ::testing::ValuesIn(attention_cases()), CaseName{});

// Blocks of the sequence, as context parallelism computes them: the queries
// cut into blocks, each against every key block in turn (offsets and strides
// into the whole tensors), the partial outputs merged through their lse by
// attention_merge (the running result starting as no key seen), and
// the backward of each pair, given the merged out and lse, accumulated into
// dq, dk and dv: the whole causal attention, within the rule of the fp64
// reference. Materialized, whose probabilities are per call, runs each query
// block against its whole key prefix in one call (the all-gather way).
TEST_P(AttentionTest, BlocksOfTheSequenceMergeToTheWhole) {
  const AttentionCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D, nrow = c.B * c.H * c.T;
  auto q = rng.uniform<float>(nq, -2, 2), k = rng.uniform<float>(nkv, -2, 2);
  auto v = rng.uniform<float>(nkv), dout = rng.uniform<float>(nq);
  const auto ref = textbook_attention<double>(c, q, k, v, dout);
  const auto naive = textbook_attention<float>(c, q, k, v, dout);
  // Three blocks of unequal lengths (fewer when T is short).
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (offset, length)
  for (int64_t at = 0, i = 0; at < c.T; ++i) {
    const int64_t len = std::min(c.T - at, std::max<int64_t>(1, c.T * (i + 1) / 6 + 1));
    blocks.push_back({at, len});
    at += len;
  }
  const AttentionIndex at{c};
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const bool flash = kind == AttentionKind::flash;
    std::vector<float> out(nq, 0), lse(nrow, 0), dq(nq, 0), dk(nkv, 0), dv(nkv, 0);
    // Forward: flash block by block, merged; materialized over each prefix.
    std::vector<std::vector<float>> probs(blocks.size());
    std::fill(lse.begin(), lse.end(), -INFINITY);
    for (size_t qi = 0; qi < blocks.size(); ++qi) {
      const auto [qo, tq] = blocks[qi];
      const size_t key_blocks = flash ? blocks.size() : 1;
      for (size_t kj = 0; kj < key_blocks; ++kj) {
        const auto [ko, tk] = flash ? blocks[kj] : std::pair<int64_t, int64_t>{0, qo + tq};
        std::vector<float> b_out(nq, 7), b_lse(nrow, 7);
        if (!flash) probs[qi].assign(c.B * c.H * tq * tk, 0);
        run_or_throw(AttentionForwardParams<float>{
            .kind = kind, .B = c.B, .T = tq, .H = c.H, .H_kv = c.H_kv, .D = c.D, .q = q.data() + at.q(0, qo, 0),
            .k = k.data() + at.kv(0, ko, 0), .v = v.data() + at.kv(0, ko, 0), .out = b_out.data() + at.q(0, qo, 0),
            .lse = b_lse.data() + qo, .probs = flash ? nullptr : probs[qi].data(), .Tk = tk, .q_offset = qo,
            .k_offset = ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T});
        run_or_throw(AttentionMergeParams<float>{.B = c.B, .T = tq, .H = c.H, .D = c.D,
                                                 .out = out.data() + at.q(0, qo, 0), .lse = lse.data() + qo,
                                                 .part_out = b_out.data() + at.q(0, qo, 0),
                                                 .part_lse = b_lse.data() + qo, .q_batch_rows = c.T,
                                                 .lse_batch_rows = c.T});
      }
    }
    expect_within_rule("out", out, naive.out, ref.out);
    expect_within_rule("lse", lse, naive.lse, ref.lse);
    // Backward: every pair, accumulating.
    for (size_t qi = 0; qi < blocks.size(); ++qi) {
      const auto [qo, tq] = blocks[qi];
      const size_t key_blocks = flash ? blocks.size() : 1;
      for (size_t kj = 0; kj < key_blocks; ++kj) {
        const auto [ko, tk] = flash ? blocks[kj] : std::pair<int64_t, int64_t>{0, qo + tq};
        run_or_throw(AttentionBackwardParams<float>{
            .kind = kind, .B = c.B, .T = tq, .H = c.H, .H_kv = c.H_kv, .D = c.D, .q = q.data() + at.q(0, qo, 0),
            .k = k.data() + at.kv(0, ko, 0), .v = v.data() + at.kv(0, ko, 0), .out = out.data() + at.q(0, qo, 0),
            .lse = lse.data() + qo, .probs = flash ? nullptr : probs[qi].data(), .dout = dout.data() + at.q(0, qo, 0),
            .dq = dq.data() + at.q(0, qo, 0), .dk = dk.data() + at.kv(0, ko, 0), .dv = dv.data() + at.kv(0, ko, 0),
            .Tk = tk, .q_offset = qo, .k_offset = ko, .q_batch_rows = c.T, .kv_batch_rows = c.T,
            .lse_batch_rows = c.T, .dq_write = Write::accumulate, .dkv_write = Write::accumulate});
      }
    }
    expect_within_rule("dq", dq, naive.dq, ref.dq);
    expect_within_rule("dk", dk, naive.dk, ref.dk);
    expect_within_rule("dv", dv, naive.dv, ref.dv);
  }
}

// A block whose keys all lie after its queries sees nothing: out 0, lse
// -inf, and its backward adds nothing.
TEST(AttentionBlocks, KeysAfterEveryQuerySeeNothing) {
  const AttentionCase c{"b1_t4_h2_kv1_d4", 1, 4, 2, 1, 4};
  Rng rng;
  auto q = rng.uniform<float>(16 * 2, -2, 2), k = rng.uniform<float>(16, -2, 2), v = rng.uniform<float>(16);
  auto dout = rng.uniform<float>(32);
  std::vector<float> out(32, 5), lse(8, 5), dq(32, 1), dk(16, 1), dv(16, 1);
  run_or_throw(AttentionForwardParams<float>{.B = 1, .T = 4, .H = 2, .H_kv = 1, .D = 4, .q = q.data(),
                                             .k = k.data(), .v = v.data(), .out = out.data(), .lse = lse.data(),
                                             .q_offset = 0, .k_offset = 4});
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -INFINITY);
  run_or_throw(AttentionBackwardParams<float>{.B = 1, .T = 4, .H = 2, .H_kv = 1, .D = 4, .q = q.data(),
                                              .k = k.data(), .v = v.data(), .out = out.data(), .lse = lse.data(),
                                              .dout = dout.data(), .dq = dq.data(), .dk = dk.data(), .dv = dv.data(),
                                              .q_offset = 0, .k_offset = 4, .dq_write = Write::accumulate,
                                              .dkv_write = Write::accumulate});
  for (auto* t : {&dq, &dk, &dv})
    for (float x : *t) EXPECT_EQ(x, 1.0f);
}

TEST(AttentionArgs, RejectsImpossibleParams) {
  const int64_t B = 1, T = 3, H = 4, H_kv = 2, D = 2;
  std::vector<float> q(B * T * H * D), kv(B * T * H_kv * D), out(q.size()), lse(B * H * T);
  std::vector<float> dq(q.size()), dk(kv.size()), dv(kv.size());
  AttentionForwardParams<float> fwd{.kind = AttentionKind::flash, .B = B, .T = T, .H = H,
                                    .H_kv = H_kv, .D = D, .q = q.data(), .k = kv.data(),
                                    .v = kv.data(), .out = out.data(), .lse = lse.data()};
  EXPECT_TRUE(supports(fwd));
  // One (T x T) score tile per (batch, kv head) at this T; none materialized,
  // whose scores go straight into the saved probabilities.
  EXPECT_GE(workspace_bytes(fwd), int64_t{B * H_kv * T * T * 4}) << "score tiles";
  EXPECT_EQ(launch(fwd, {}, {}), Status::invalid_argument) << "no workspace";
  {
    auto mat = fwd;
    mat.kind = AttentionKind::materialized;
    std::vector<float> probs(B * H * T * T);
    mat.probs = probs.data();
    EXPECT_EQ(workspace_bytes(mat), 0);
    EXPECT_EQ(launch(mat, {}, {}), Status::ok);
  }

  auto bad = fwd;
  bad.H_kv = 3;  // 4 query heads cannot share 3 kv heads evenly
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = fwd;
  bad.D = 0;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = fwd;
  bad.lse = nullptr;  // flash must save lse for its backward
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = fwd;
  bad.kind = AttentionKind::materialized;  // and materialized its probabilities
  EXPECT_EQ(run(bad), Status::invalid_argument);
  EXPECT_EQ(launch(fwd, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);

  AttentionBackwardParams<float> bwd{.kind = AttentionKind::flash, .B = B, .T = T, .H = H,
                                     .H_kv = H_kv, .D = D, .q = q.data(), .k = kv.data(),
                                     .v = kv.data(), .out = out.data(), .lse = lse.data(),
                                     .dout = out.data(), .dq = dq.data(), .dk = dk.data(),
                                     .dv = dv.data()};
  EXPECT_GE(workspace_bytes(bwd), int64_t{2 * B * H_kv * T * T * 4}) << "P and dP tiles";
  EXPECT_EQ(launch(bwd, {}, {}), Status::invalid_argument) << "no workspace";
  auto mat = bwd;
  mat.kind = AttentionKind::materialized;
  std::vector<float> probs(B * H * T * T);
  mat.probs = probs.data();
  EXPECT_GE(workspace_bytes(mat), int64_t{B * H_kv * T * T * 4}) << "dP tiles";
  mat.dv = nullptr;
  EXPECT_EQ(run(mat), Status::invalid_argument);
}

// cudnn is cuDNN's kernels: valid params, but not the CPU's to run.
TEST(AttentionArgs, CpuHasNoCudnn) {
  const int64_t B = 1, T = 3, H = 4, H_kv = 2, D = 8;
  std::vector<float> q(B * T * H * D), kv(B * T * H_kv * D), out(q.size()), lse(B * H * T);
  std::vector<float> dq(q.size()), dk(kv.size()), dv(kv.size());
  AttentionForwardParams<float> fwd{.kind = AttentionKind::cudnn, .B = B, .T = T, .H = H,
                                    .H_kv = H_kv, .D = D, .q = q.data(), .k = kv.data(),
                                    .v = kv.data(), .out = out.data(), .lse = lse.data()};
  EXPECT_FALSE(supports(fwd));
  EXPECT_EQ(workspace_bytes(fwd), 0);
  EXPECT_EQ(launch(fwd, {}, {}), Status::unsupported);
  auto no_lse = fwd;
  no_lse.lse = nullptr;  // cudnn keeps lse as flash does: missing it is still invalid
  EXPECT_EQ(launch(no_lse, {}, {}), Status::invalid_argument);
  AttentionBackwardParams<float> bwd{.kind = AttentionKind::cudnn, .B = B, .T = T, .H = H,
                                     .H_kv = H_kv, .D = D, .q = q.data(), .k = kv.data(),
                                     .v = kv.data(), .out = out.data(), .lse = lse.data(),
                                     .dout = out.data(), .dq = dq.data(), .dk = dk.data(),
                                     .dv = dv.data()};
  EXPECT_FALSE(supports(bwd));
  EXPECT_EQ(launch(bwd, {}, {}), Status::unsupported);
  auto no_out = bwd;
  no_out.out = nullptr;
  EXPECT_EQ(launch(no_out, {}, {}), Status::invalid_argument);

  EXPECT_FALSE(attention_available(AttentionKind::cudnn, Backend::cpu));
  EXPECT_TRUE(attention_available(AttentionKind::flash, Backend::cpu));
  EXPECT_TRUE(attention_available(AttentionKind::materialized, Backend::cpu));
}

}  // namespace
}  // namespace weft::kernels::test
