// attention on CUDA (bf16): flash, materialized and cudnn (cuDNN's fused
// SDPA, in builds with the cuDNN frontend), forward and backward, against an
// fp64 reference, the CPU float backend and each other.
//
// Inputs are drawn fresh each run (the seed is printed with a failure;
// WEFT_TEST_SEED replays it) and rounded to bf16; every reference sees the
// rounded values, so all of them compute the same function. Outputs and the
// workspace are filled with NaN before each launch, so an element a kernel
// forgets to write fails the finiteness check and the comparisons.
//
// The tolerance rule for bf16: a result's relative L2 error against the fp64
// reference may be at most kBf16Multiple times the error of a naive bf16
// implementation, floored at one bf16 unit roundoff (2^-9). The naive
// implementation is the textbook loop in fp32 that rounds to bf16 wherever
// an eager bf16 framework stores a tensor: scores, P, O, dP, dS, dQ, dK and
// dV (dK and dV summed over the group's heads in fp32 first). The materialized
// path rounds at those same points and should land near 1x; flash and cuDNN
// round fewer (P and dS only), so they land under it. This naive is coarser than the
// CPU fp32 result rounded once (the rule of the other GPU tests) on purpose:
// the materialized variant stores its scores in bf16, as an eager framework
// does, which puts its lse error near 1e-3 by design. 4 leaves room for other
// summation orders and the approximate exponentials; an indexing or masking
// bug shows up as errors of order 1. The CPU float backend and the other CUDA
// variant are compared through the triangle inequality: ||a - b|| / ||ref||
// may be at most the sum of the two results' own bounds.
//
// Blocks of the sequence (context parallelism, flash only on CUDA) are held
// to the same rule in test_gpu_attention_blocks.cpp.
#include "tests/gpu/attention_gpu_util.h"

namespace weft::kernels::test {
namespace {

[[maybe_unused]] ::testing::Environment* const kGpu = ::testing::AddGlobalTestEnvironment(new GpuEnvironment);

// The CPU float backend (flash) on the same rounded inputs.
Result<float> cpu_float(const AttentionCase& c, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, const std::vector<float>& dout) {
  Result<float> r;
  r.out.resize(q.size());
  r.dq.resize(q.size());
  r.dk.resize(k.size());
  r.dv.resize(v.size());
  r.lse.resize(c.B * c.H * c.T);
  run_or_throw(AttentionForwardParams<float>{.kind = AttentionKind::flash, .B = c.B, .T = c.T, .H = c.H,
                                             .H_kv = c.H_kv, .D = c.D, .q = q.data(), .k = k.data(),
                                             .v = v.data(), .out = r.out.data(), .lse = r.lse.data()});
  run_or_throw(AttentionBackwardParams<float>{
      .kind = AttentionKind::flash, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D, .q = q.data(),
      .k = k.data(), .v = v.data(), .out = r.out.data(), .lse = r.lse.data(), .dout = dout.data(),
      .dq = r.dq.data(), .dk = r.dk.data(), .dv = r.dv.data()});
  return r;
}

// One forward and backward on the GPU, every output and the workspace
// poisoned first; results as floats.
Result<float> run_gpu(const AttentionCase& c, AttentionKind kind, const DeviceInputs& in) {
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D, nrow = c.B * c.H * c.T;
  const int64_t nprobs = kind == AttentionKind::materialized ? nrow * c.T : 0;
  DeviceBuffer out(nq * 2), lse(nrow * 4), probs(nprobs * 2), dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
  AttentionForwardParams<bf16> fwd{.kind = kind, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D,
                                   .q = in.q.as<bf16>(), .k = in.k.as<bf16>(), .v = in.v.as<bf16>(),
                                   .out = out.as<bf16>(), .lse = lse.as<float>(),
                                   .probs = probs.as<bf16>()};
  AttentionBackwardParams<bf16> bwd{.kind = kind, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D,
                                    .q = in.q.as<bf16>(), .k = in.k.as<bf16>(), .v = in.v.as<bf16>(),
                                    .out = out.as<bf16>(), .lse = lse.as<float>(),
                                    .probs = probs.as<bf16>(), .dout = in.dout.as<bf16>(),
                                    .dq = dq.as<bf16>(), .dk = dk.as<bf16>(), .dv = dv.as<bf16>()};
  EXPECT_TRUE(supports(fwd, Backend::cuda));
  EXPECT_TRUE(supports(bwd, Backend::cuda));
  const int64_t ws_fwd = workspace_bytes(fwd, Backend::cuda), ws_bwd = workspace_bytes(bwd, Backend::cuda);
  DeviceBuffer ws(std::max(ws_fwd, ws_bwd));
  const Stream stream{Backend::cuda, test_stream()};
  status_check(launch(fwd, Workspace{ws.as<void>(), ws_fwd}, stream), "attention forward");
  cuda_ok(cudaStreamSynchronize(test_stream()), "attention forward");
  ws.poison();
  status_check(launch(bwd, Workspace{ws.as<void>(), ws_bwd}, stream), "attention backward");
  cuda_ok(cudaStreamSynchronize(test_stream()), "attention backward");
  cuda_ok(cudaGetLastError(), "attention");
  Result<float> r;
  r.out = to_float(out.download<bf16>(nq));
  r.lse = lse.download<float>(nrow);
  r.probs = to_float(probs.download<bf16>(nprobs));
  r.dq = to_float(dq.download<bf16>(nq));
  r.dk = to_float(dk.download<bf16>(nkv));
  r.dv = to_float(dv.download<bf16>(nkv));
  return r;
}

const std::vector<AttentionCase>& gpu_attention_cases() {
  // Query and key blocks are 64 rows: T = 1 and 7 end inside the first,
  // 113 and 257 inside a later one (257: one row past four full blocks),
  // 64 and 128 end exactly on one.
  static const std::vector<AttentionCase> cases = {
      {"b1_t1_h4_kv1_d64", 1, 1, 4, 1, 64},
      {"b2_t1_h4_kv4_d128", 2, 1, 4, 4, 128},
      {"b2_t7_h4_kv2_d64", 2, 7, 4, 2, 64},
      {"b1_t7_h4_kv1_d128", 1, 7, 4, 1, 128},
      {"b1_t64_h4_kv2_d64_one_full_block", 1, 64, 4, 2, 64},
      {"b1_t113_h4_kv4_d64", 1, 113, 4, 4, 64},
      {"b2_t113_h4_kv2_d128", 2, 113, 4, 2, 128},
      {"b1_t128_h4_kv1_d128_two_full_blocks", 1, 128, 4, 1, 128},
      {"b2_t257_h4_kv1_d64", 2, 257, 4, 1, 64},
      {"b1_t257_h4_kv2_d128", 1, 257, 4, 2, 128},
      {"b2_t257_h4_kv4_d128", 2, 257, 4, 4, 128},
      {"b1_t7_h4_kv2_d32", 1, 7, 4, 2, 32},
      {"b2_t257_h4_kv1_d32", 2, 257, 4, 1, 32},
  };
  return cases;
}


class GpuAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(GpuAttentionTest, FlashAndMaterializedMatchReferences) {
  const AttentionCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto [in, ref, naive] = prepare(c, rng);
  const auto cpu = cpu_float(c, in.q, in.k, in.v, in.dout);
  const DeviceInputs dev(c, in.bq, in.bk, in.bv, in.bdout);
  const auto flash = run_gpu(c, AttentionKind::flash, dev);
  const auto mat = run_gpu(c, AttentionKind::materialized, dev);
  for (const Field& f : kFields) {
    SCOPED_TRACE(f.name);
    const std::vector<double>& r = ref.*f.ref;
    const double bound = bound_of(naive.*f.member, r);
    const double naive_err = rel_l2(naive.*f.member, r);
    EXPECT_EQ(non_finite(flash.*f.member), 0) << "flash left elements unwritten or non-finite";
    EXPECT_EQ(non_finite(mat.*f.member), 0) << "materialized left elements unwritten or non-finite";
    // (c) fp64 reference
    const double e_flash = rel_l2(flash.*f.member, r), e_mat = rel_l2(mat.*f.member, r);
    EXPECT_LE(e_flash, bound) << "flash vs fp64: error " << e_flash << ", naive bf16 error " << naive_err;
    EXPECT_LE(e_mat, bound) << "materialized vs fp64: error " << e_mat << ", naive bf16 error " << naive_err;
    // (a) the CPU float backend on the same rounded inputs
    const double e_cpu = rel_l2(cpu.*f.member, r);
    EXPECT_LE(rel_diff(flash.*f.member, cpu.*f.member, r), bound + e_cpu) << "flash vs CPU float";
    // (b) the two CUDA variants
    EXPECT_LE(rel_diff(flash.*f.member, mat.*f.member, r), 2 * bound) << "flash vs materialized";
  }
  EXPECT_EQ(non_finite(mat.probs), 0);
  const double e_probs = rel_l2(mat.probs, ref.probs);
  EXPECT_LE(e_probs, bound_of(naive.probs, ref.probs))
      << "materialized probs vs fp64: error " << e_probs << ", naive " << rel_l2(naive.probs, ref.probs);
}

// cuDNN's fused SDPA on the same inputs: against the fp64 reference by the
// rule, and against weft's flash by the triangle inequality. Its lse is
// cuDNN's softmax stats, the natural-log log-sum-exp of the scaled scores,
// so it is held to the reference lse like the others.
TEST_P(GpuAttentionTest, CudnnMatchesReferencesAndFlash) {
  if (!attention_available(AttentionKind::cudnn, Backend::cuda))
    GTEST_SKIP() << "built without the cuDNN frontend";
  const AttentionCase& c = GetParam();
  if (c.T < 2) GTEST_SKIP() << "cudnn takes T >= 2 (GpuAttentionProtocol checks that it refuses T = 1)";
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto [in, ref, naive] = prepare(c, rng);
  const DeviceInputs dev(c, in.bq, in.bk, in.bv, in.bdout);
  const auto flash = run_gpu(c, AttentionKind::flash, dev);
  const auto cudnn = run_gpu(c, AttentionKind::cudnn, dev);
  for (const Field& f : kFields) {
    SCOPED_TRACE(f.name);
    const std::vector<double>& r = ref.*f.ref;
    const double bound = bound_of(naive.*f.member, r);
    EXPECT_EQ(non_finite(cudnn.*f.member), 0) << "cudnn left elements unwritten or non-finite";
    const double e = rel_l2(cudnn.*f.member, r);
    EXPECT_LE(e, bound) << "cudnn vs fp64: error " << e << ", naive bf16 error " << rel_l2(naive.*f.member, r);
    EXPECT_LE(rel_diff(cudnn.*f.member, flash.*f.member, r), 2 * bound) << "cudnn vs flash";
  }
}

// A moving error is a race: the same inputs twice give the same bits, except
// dQ, whose fp32 atomic sums may round differently at the last bf16 bit.
TEST_P(GpuAttentionTest, FlashRepeatsItself) {
  const AttentionCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Inputs in = draw(c, rng);
  const DeviceInputs dev(c, in.bq, in.bk, in.bv, in.bdout);
  const auto a = run_gpu(c, AttentionKind::flash, dev);
  const auto b = run_gpu(c, AttentionKind::flash, dev);
  auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(a.out, b.out)) << "out";
  EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dk";
  EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dv";
  std::vector<double> dq_ref(a.dq.begin(), a.dq.end());
  EXPECT_LE(rel_l2(b.dq, dq_ref), kBf16Roundoff) << "dq";
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuAttentionTest, ::testing::ValuesIn(gpu_attention_cases()), CaseName{});

// The protocol without the arithmetic: what supports, workspace_bytes and
// launch say for params the CUDA backend does not take.
TEST(GpuAttentionProtocol, RefusesWhatItDoesNotHandle) {
  DeviceBuffer buf(1 << 20);
  bf16* t = buf.as<bf16>();
  float* f = buf.as<float>();
  AttentionForwardParams<bf16> fwd{.kind = AttentionKind::flash, .B = 1, .T = 8, .H = 4, .H_kv = 2, .D = 64,
                                   .q = t, .k = t, .v = t, .out = t, .lse = f, .probs = t};
  AttentionBackwardParams<bf16> bwd{.kind = AttentionKind::flash, .B = 1, .T = 8, .H = 4, .H_kv = 2, .D = 64,
                                    .q = t, .k = t, .v = t, .out = t, .lse = f, .probs = t, .dout = t,
                                    .dq = t, .dk = t, .dv = t};
  const Stream cuda{Backend::cuda, test_stream()};
  EXPECT_TRUE(supports(fwd, Backend::cuda));
  EXPECT_FALSE(supports(fwd, Backend::cpu)) << "the CPU backend has no bf16";
  EXPECT_EQ(launch(fwd, Workspace{}, Stream{}), Status::unsupported);
  EXPECT_EQ(workspace_bytes(fwd, Backend::cuda), 0);
  EXPECT_GT(workspace_bytes(bwd, Backend::cuda), 0);
  EXPECT_EQ(launch(bwd, Workspace{}, cuda), Status::invalid_argument) << "flash backward needs workspace";

  auto fwd96 = fwd;
  fwd96.D = 96;
  EXPECT_FALSE(supports(fwd96, Backend::cuda)) << "flash takes D of 64 and 128";
  EXPECT_EQ(launch(fwd96, Workspace{}, cuda), Status::unsupported);
  fwd96.kind = AttentionKind::materialized;
  EXPECT_TRUE(supports(fwd96, Backend::cuda)) << "materialized takes any D";

  auto misaligned = fwd;
  misaligned.q = t + 1;
  EXPECT_EQ(launch(misaligned, Workspace{}, cuda), Status::unsupported);

  auto bad_heads = fwd;
  bad_heads.H_kv = 3;
  EXPECT_EQ(launch(bad_heads, Workspace{}, cuda), Status::invalid_argument);
  auto no_lse = fwd;
  no_lse.lse = nullptr;
  EXPECT_EQ(launch(no_lse, Workspace{}, cuda), Status::invalid_argument);

  // cudnn: the bound of attention_cudnn.h as workspace, both directions;
  // head dims of whole 16-byte rows up to 128; lse required as for flash.
  auto cf = fwd;
  cf.kind = AttentionKind::cudnn;
  auto cb = bwd;
  cb.kind = AttentionKind::cudnn;
  if (!attention_available(AttentionKind::cudnn, Backend::cuda)) {
    EXPECT_FALSE(supports(cf, Backend::cuda));
    EXPECT_EQ(launch(cf, Workspace{}, cuda), Status::unsupported);
    return;
  }
  EXPECT_TRUE(supports(cf, Backend::cuda));
  EXPECT_TRUE(supports(cb, Backend::cuda));
  EXPECT_GT(workspace_bytes(cf, Backend::cuda), 0);
  EXPECT_GT(workspace_bytes(cb, Backend::cuda), workspace_bytes(cf, Backend::cuda));
  EXPECT_EQ(launch(cb, Workspace{}, cuda), Status::invalid_argument) << "cudnn backward needs workspace";
  auto c12 = cf;
  c12.D = 12;
  EXPECT_FALSE(supports(c12, Backend::cuda)) << "cudnn takes D in multiples of 8";
  auto c256 = cf;
  c256.D = 256;
  EXPECT_FALSE(supports(c256, Backend::cuda)) << "cudnn takes D up to 128";
  auto c_t1 = cb;
  c_t1.T = 1;
  EXPECT_FALSE(supports(c_t1, Backend::cuda)) << "cuDNN refuses a backward with one query and one key";
  auto c_no_lse = cf;
  c_no_lse.lse = nullptr;
  EXPECT_EQ(launch(c_no_lse, Workspace{}, cuda), Status::invalid_argument);
}

}  // namespace
}  // namespace weft::kernels::test
