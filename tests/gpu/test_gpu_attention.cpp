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
// to the same rule at the end of the file: each kind of block against the
// CPU at fp64 on that block, and the ring's blocks, merged and accumulated,
// against whole-sequence attention.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/attention/attention.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/attention_reference.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

// Exits 77 (ctest: skipped) when no CUDA device is present.
class GpuEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      std::fprintf(stderr, "test_gpu_attention: no CUDA device, skipping\n");
      std::exit(77);
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kGpu = ::testing::AddGlobalTestEnvironment(new GpuEnvironment);

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Launches go to a non-blocking stream of the test's own, so the backend
// must honour Stream::handle. Such a stream does not wait for the legacy
// default stream that cudaMemset and cudaMemcpy use, so those are followed by
// a device-wide synchronisation.
cudaStream_t test_stream() {
  static const cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }();
  return stream;
}

// A device allocation, filled with 0xff bytes (NaN as bf16 and as fp32).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) {
      cuda_ok(cudaMalloc(&ptr_, size_t(bytes_)), "cudaMalloc");
      poison();
    }
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void poison() {
    if (bytes_ > 0) cuda_ok(cudaMemset(ptr_, 0xff, size_t(bytes_)), "cudaMemset");
    cuda_ok(cudaDeviceSynchronize(), "poison");
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  void upload(const std::vector<T>& v) {
    cuda_ok(cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaDeviceSynchronize(), "upload");
  }
  template <typename T>
  std::vector<T> download(int64_t n) const {
    cuda_ok(cudaDeviceSynchronize(), "download");
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) cuda_ok(cudaMemcpy(v.data(), ptr_, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_;
};

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}
std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

template <typename R>
using Result = AttentionResult<R>;

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

struct DeviceInputs {
  DeviceBuffer q, k, v, dout;
  DeviceInputs(const AttentionCase& c, const std::vector<bf16>& hq, const std::vector<bf16>& hk,
               const std::vector<bf16>& hv, const std::vector<bf16>& hdout)
      : q(c.B * c.T * c.H * c.D * 2), k(c.B * c.T * c.H_kv * c.D * 2), v(k.bytes()), dout(q.bytes()) {
    q.upload(hq);
    k.upload(hk);
    v.upload(hv);
    dout.upload(hdout);
  }
};

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

constexpr double kBf16Multiple = 4.0;
constexpr double kBf16Roundoff = 1.0 / 512;  // 2^-9

double bound_of(const std::vector<float>& naive, const std::vector<double>& ref) {
  return kBf16Multiple * std::max(rel_l2(naive, ref), kBf16Roundoff);
}

int64_t non_finite(const std::vector<float>& v) {
  int64_t n = 0;
  for (float x : v) n += !std::isfinite(x);
  return n;
}

// ||a - b|| / ||ref|| (absolute when ref is zero), the rule's scale.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
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

struct Inputs {
  std::vector<float> q, k, v, dout;  // bf16-rounded
  std::vector<bf16> bq, bk, bv, bdout;
};

Inputs draw(const AttentionCase& c, Rng& rng) {
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  Inputs in;
  // Scores of order a few units, so the softmax is neither flat nor one-hot.
  in.bq = to_bf16(rng.uniform<float>(nq, -2, 2));
  in.bk = to_bf16(rng.uniform<float>(nkv, -2, 2));
  in.bv = to_bf16(rng.uniform<float>(nkv));
  in.bdout = to_bf16(rng.uniform<float>(nq));
  in.q = to_float(in.bq);
  in.k = to_float(in.bk);
  in.v = to_float(in.bv);
  in.dout = to_float(in.bdout);
  return in;
}

// One case's inputs with its references: fp64, and the naive bf16-rounding
// one whose error sets the bound.
struct Prepared {
  Inputs in;
  Result<double> ref;
  Result<float> naive;
};

Prepared prepare(const AttentionCase& c, Rng& rng) {
  Prepared p{draw(c, rng), {}, {}};
  p.ref = textbook_attention<double>(c, p.in.q, p.in.k, p.in.v, p.in.dout);
  p.naive = textbook_attention<float>(c, p.in.q, p.in.k, p.in.v, p.in.dout, round_bf16);
  return p;
}

// The outputs every kind is held to, with their reference.
struct Field {
  const char* name;
  std::vector<float> Result<float>::*member;
  std::vector<double> Result<double>::*ref;
};
const Field kFields[] = {{"out", &Result<float>::out, &Result<double>::out},
                         {"lse", &Result<float>::lse, &Result<double>::lse},
                         {"dq", &Result<float>::dq, &Result<double>::dq},
                         {"dk", &Result<float>::dk, &Result<double>::dk},
                         {"dv", &Result<float>::dv, &Result<double>::dv}};

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


// ------------------------------------------------------------- blocks of the sequence
//
// Context parallelism calls flash on blocks: T queries at q_offset against Tk
// keys at k_offset, inside larger tensors (batch row strides), the backward
// adding into dq, dk and dv. The blocks below live in the whole (B, T, ...)
// tensors of a case, at their positions, so B > 1 exercises the strides.

// One block, in sequence positions: queries [qo, qo + tq), keys [ko, ko + tk).
struct SeqBlock {
  const char* name;
  int64_t qo, tq, ko, tk;
};

// Whether every row of (values, ref) that ref holds -inf holds -inf too, and
// the rest as a vector each, for the rule's norms.
struct FiniteSplit {
  int64_t mismatched_inf = 0;
  std::vector<float> got;
  std::vector<double> ref;
};
FiniteSplit split_inf(const std::vector<float>& got, const std::vector<double>& ref) {
  FiniteSplit s;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      s.mismatched_inf += !(ref[i] == -INFINITY && got[i] == -INFINITY);
    } else {
      s.got.push_back(got[i]);
      s.ref.push_back(ref[i]);
    }
  }
  return s;
}

// The block's results: forward out and lse (B, H, T of the case, only the
// block's rows written), backward dq, dk, dv (whole-tensor sized, the
// block's rows only).
template <typename R>
struct BlockResult {
  std::vector<R> out, lse, dq, dk, dv;
};

// The CPU at fp64 on one block of the case's (rounded) inputs: the oracle.
// The backward takes the block's own out and lse, which is what a block's
// gradient is given only that block's keys.
BlockResult<double> cpu_block(const AttentionCase& c, const SeqBlock& s, const Inputs& in) {
  const AttentionIndex at{c};
  std::vector<double> q(in.q.begin(), in.q.end()), k(in.k.begin(), in.k.end()), v(in.v.begin(), in.v.end());
  std::vector<double> dout(in.dout.begin(), in.dout.end());
  BlockResult<double> r;
  r.out.assign(q.size(), 0);
  r.lse.assign(c.B * c.H * c.T, 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  run_or_throw(AttentionForwardParams<double>{
      .kind = AttentionKind::flash, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
      .q = q.data() + at.q(0, s.qo, 0), .k = k.data() + at.kv(0, s.ko, 0), .v = v.data() + at.kv(0, s.ko, 0),
      .out = r.out.data() + at.q(0, s.qo, 0), .lse = r.lse.data() + s.qo, .Tk = s.tk, .q_offset = s.qo,
      .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T});
  run_or_throw(AttentionBackwardParams<double>{
      .kind = AttentionKind::flash, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
      .q = q.data() + at.q(0, s.qo, 0), .k = k.data() + at.kv(0, s.ko, 0), .v = v.data() + at.kv(0, s.ko, 0),
      .out = r.out.data() + at.q(0, s.qo, 0), .lse = r.lse.data() + s.qo,
      .dout = dout.data() + at.q(0, s.qo, 0), .dq = r.dq.data() + at.q(0, s.qo, 0),
      .dk = r.dk.data() + at.kv(0, s.ko, 0), .dv = r.dv.data() + at.kv(0, s.ko, 0), .Tk = s.tk,
      .q_offset = s.qo, .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T});
  return r;
}

// The rows of a whole (B, T, heads, D) tensor, or (B, H, T) lse, that a block
// covers, as one vector, for comparisons that leave the rest out.
template <typename V>
V rows_of(const V& x, int64_t B, int64_t T, int64_t width, int64_t t0, int64_t n) {
  V r;
  for (int64_t b = 0; b < B; ++b)
    r.insert(r.end(), x.begin() + (b * T + t0) * width, x.begin() + (b * T + t0 + n) * width);
  return r;
}

struct BlockDevice {
  DeviceBuffer out, lse, dq, dk, dv, ws;
};

AttentionForwardParams<bf16> block_forward(const AttentionCase& c, const SeqBlock& s, const DeviceInputs& in,
                                           bf16* out, float* lse) {
  const AttentionIndex at{c};
  return {.kind = AttentionKind::flash, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
          .q = in.q.as<bf16>() + at.q(0, s.qo, 0), .k = in.k.as<bf16>() + at.kv(0, s.ko, 0),
          .v = in.v.as<bf16>() + at.kv(0, s.ko, 0), .out = out + at.q(0, s.qo, 0), .lse = lse + s.qo,
          .Tk = s.tk, .q_offset = s.qo, .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T,
          .lse_batch_rows = c.T};
}

AttentionBackwardParams<bf16> block_backward(const AttentionCase& c, const SeqBlock& s, const DeviceInputs& in,
                                             const bf16* out, const float* lse, bf16* dq, bf16* dk, bf16* dv,
                                             Write write) {
  const AttentionIndex at{c};
  return {.kind = AttentionKind::flash, .B = c.B, .T = s.tq, .H = c.H, .H_kv = c.H_kv, .D = c.D,
          .q = in.q.as<bf16>() + at.q(0, s.qo, 0), .k = in.k.as<bf16>() + at.kv(0, s.ko, 0),
          .v = in.v.as<bf16>() + at.kv(0, s.ko, 0), .out = out + at.q(0, s.qo, 0), .lse = lse + s.qo,
          .dout = in.dout.as<bf16>() + at.q(0, s.qo, 0), .dq = dq + at.q(0, s.qo, 0),
          .dk = dk + at.kv(0, s.ko, 0), .dv = dv + at.kv(0, s.ko, 0), .Tk = s.tk, .q_offset = s.qo,
          .k_offset = s.ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T,
          .dq_write = write, .dkv_write = write};
}

template <typename P>
void launch_on_gpu(const P& p, const char* what) {
  ASSERT_TRUE(supports(p, Backend::cuda)) << what;
  const int64_t bytes = workspace_bytes(p, Backend::cuda);
  DeviceBuffer ws(bytes);
  status_check(launch(p, Workspace{ws.as<void>(), bytes}, Stream{Backend::cuda, test_stream()}), what);
  cuda_ok(cudaStreamSynchronize(test_stream()), what);
  cuda_ok(cudaGetLastError(), what);
}

// Every kind of block a context-parallel layout calls, against the CPU at
// fp64 on the same block. The bound of each field is the rule's bound for the
// whole sequence of the same inputs (the naive bf16 implementation's error
// there, times kBf16Multiple): a block computes the same rows with fewer keys.
TEST(GpuAttentionBlocks, FlashBlocksMatchTheCpu) {
  const std::vector<AttentionCase> cases = {{"b2_t200_h4_kv2_d64", 2, 200, 4, 2, 64},
                                            {"b1_t200_h4_kv1_d128", 1, 200, 4, 1, 128},
                                            {"b2_t200_h4_kv4_d128", 2, 200, 4, 4, 128}};
  const SeqBlock blocks[] = {
      {"diagonal", 37, 90, 37, 90},
      {"diagonal_tile_aligned", 64, 128, 64, 128},
      {"off_diagonal_fully_visible", 130, 60, 10, 100},
      {"partly_visible_tk_gt_t", 100, 50, 60, 120},
      {"fully_masked", 0, 50, 100, 60},
      {"some_rows_see_nothing", 20, 100, 70, 80},
      {"prefix_of_keys", 150, 30, 0, 180},
      {"one_query_one_key", 5, 1, 5, 1},
  };
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.name);
    Rng rng;
    SCOPED_TRACE(rng.trace());
    const auto [in, ref, naive] = prepare(c, rng);
    const DeviceInputs dev(c, in.bq, in.bk, in.bv, in.bdout);
    const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D, nrow = c.B * c.H * c.T;
    for (const SeqBlock& s : blocks) {
      SCOPED_TRACE(s.name);
      const BlockResult<double> want = cpu_block(c, s, in);
      DeviceBuffer out(nq * 2), lse(nrow * 4), dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
      launch_on_gpu(block_forward(c, s, dev, out.as<bf16>(), lse.as<float>()), "block forward");
      const auto g_out = rows_of(to_float(out.download<bf16>(nq)), c.B, c.T, c.H * c.D, s.qo, s.tq);
      const auto w_out = rows_of(want.out, c.B, c.T, c.H * c.D, s.qo, s.tq);
      EXPECT_EQ(non_finite(g_out), 0) << "out";
      EXPECT_LE(rel_diff(g_out, std::vector<float>(w_out.begin(), w_out.end()), w_out),
                bound_of(naive.out, ref.out))
          << "out";
      const auto g_lse = rows_of(lse.download<float>(nrow), c.B * c.H, c.T, 1, s.qo, s.tq);
      const auto w_lse = rows_of(want.lse, c.B * c.H, c.T, 1, s.qo, s.tq);
      const FiniteSplit l = split_inf(g_lse, w_lse);
      EXPECT_EQ(l.mismatched_inf, 0) << "lse: rows that see no key must hold -inf, and only they";
      if (!l.ref.empty()) {
        EXPECT_LE(rel_l2(l.got, l.ref), bound_of(naive.lse, ref.lse)) << "lse";
      }
      // A row that sees no key has out exactly 0.
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.H; ++h)
          for (int64_t i = 0; i < s.tq; ++i)
            if (want.lse[(b * c.H + h) * c.T + s.qo + i] == -INFINITY) {
              for (int64_t d = 0; d < c.D; ++d)
                ASSERT_EQ(g_out[((b * s.tq + i) * c.H + h) * c.D + d], 0.0f) << "out of a row that sees no key";
            }

      // Backward, given the oracle's out and lse, overwriting.
      DeviceBuffer r_out(nq * 2), r_lse(nrow * 4);
      {
        std::vector<float> wo(want.out.begin(), want.out.end()), wl(want.lse.begin(), want.lse.end());
        r_out.upload(to_bf16(wo));
        r_lse.upload(wl);
      }
      launch_on_gpu(block_backward(c, s, dev, r_out.as<bf16>(), r_lse.as<float>(), dq.as<bf16>(), dk.as<bf16>(),
                                   dv.as<bf16>(), Write::overwrite),
                    "block backward");
      struct Grad {
        const char* name;
        DeviceBuffer* buf;
        const std::vector<double>* want;
        int64_t n, width, t0, rows;
        const std::vector<float>* naive;
        const std::vector<double>* ref;
      };
      const Grad grads[] = {{"dq", &dq, &want.dq, nq, c.H * c.D, s.qo, s.tq, &naive.dq, &ref.dq},
                            {"dk", &dk, &want.dk, nkv, c.H_kv * c.D, s.ko, s.tk, &naive.dk, &ref.dk},
                            {"dv", &dv, &want.dv, nkv, c.H_kv * c.D, s.ko, s.tk, &naive.dv, &ref.dv}};
      std::vector<std::vector<float>> once;
      for (const Grad& gr : grads) {
        const auto got = rows_of(to_float(gr.buf->download<bf16>(gr.n)), c.B, c.T, gr.width, gr.t0, gr.rows);
        const auto w = rows_of(*gr.want, c.B, c.T, gr.width, gr.t0, gr.rows);
        EXPECT_EQ(non_finite(got), 0) << gr.name;
        EXPECT_LE(rel_diff(got, std::vector<float>(w.begin(), w.end()), w), bound_of(*gr.naive, *gr.ref))
            << gr.name;
        once.push_back(to_float(gr.buf->download<bf16>(gr.n)));
      }
      // Accumulating twice onto what the overwrite left gives three times it
      // (up to rounding each sum once); regions outside the block stay as
      // they were, bit for bit.
      for (int rep = 0; rep < 2; ++rep)
        launch_on_gpu(block_backward(c, s, dev, r_out.as<bf16>(), r_lse.as<float>(), dq.as<bf16>(),
                                     dk.as<bf16>(), dv.as<bf16>(), Write::accumulate),
                      "block backward, accumulating");
      for (size_t i = 0; i < std::size(grads); ++i) {
        const Grad& gr = grads[i];
        SCOPED_TRACE(gr.name);
        const auto all = to_float(gr.buf->download<bf16>(gr.n));
        const auto got = rows_of(all, c.B, c.T, gr.width, gr.t0, gr.rows);
        const auto base = rows_of(once[i], c.B, c.T, gr.width, gr.t0, gr.rows);
        std::vector<float> thrice(base.size());
        std::vector<double> thrice_ref(base.size());
        for (size_t j = 0; j < base.size(); ++j) thrice[j] = 3 * base[j], thrice_ref[j] = 3 * double(base[j]);
        EXPECT_LE(rel_diff(got, thrice, thrice_ref), 2 * kBf16Roundoff) << "accumulated three times";
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t = 0; t < c.T; ++t) {
            if (t >= gr.t0 && t < gr.t0 + gr.rows) continue;
            for (int64_t e = 0; e < gr.width; ++e)
              ASSERT_TRUE(std::isnan(all[(b * c.T + t) * gr.width + e])) << "wrote outside the block";
          }
      }
    }
  }
}

// Blocks of the sequence are flash's on CUDA: materialized and cudnn refuse them.
TEST(GpuAttentionBlocks, OnlyFlashTakesBlocks) {
  DeviceBuffer buf(1 << 20);
  bf16* t = buf.as<bf16>();
  float* f = buf.as<float>();
  AttentionForwardParams<bf16> fwd{.kind = AttentionKind::flash, .B = 1, .T = 8, .H = 4, .H_kv = 2, .D = 64,
                                   .q = t, .k = t, .v = t, .out = t, .lse = f, .probs = t,
                                   .Tk = 16, .q_offset = 16, .k_offset = 0};
  AttentionBackwardParams<bf16> bwd{.kind = AttentionKind::flash, .B = 1, .T = 8, .H = 4, .H_kv = 2, .D = 64,
                                    .q = t, .k = t, .v = t, .out = t, .lse = f, .probs = t, .dout = t,
                                    .dq = t, .dk = t, .dv = t, .dq_write = Write::accumulate,
                                    .dkv_write = Write::accumulate};
  ASSERT_TRUE(attention_is_block(fwd));
  ASSERT_TRUE(attention_is_block(bwd));
  EXPECT_TRUE(supports(fwd, Backend::cuda));
  EXPECT_TRUE(supports(bwd, Backend::cuda));
  EXPECT_EQ(workspace_bytes(fwd, Backend::cuda), 0);
  for (AttentionKind kind : {AttentionKind::materialized, AttentionKind::cudnn}) {
    auto f2 = fwd;
    f2.kind = kind;
    auto b2 = bwd;
    b2.kind = kind;
    EXPECT_FALSE(supports(f2, Backend::cuda)) << to_string(kind);
    EXPECT_FALSE(supports(b2, Backend::cuda)) << to_string(kind);
    EXPECT_EQ(launch(f2, Workspace{}, Stream{Backend::cuda, test_stream()}), Status::unsupported) << to_string(kind);
  }
}

// A block whose keys all follow its queries: out 0, lse -inf, and its
// backward adds exactly nothing to gradients that already hold values.
TEST(GpuAttentionBlocks, FullyMaskedBlockAddsNothing) {
  const AttentionCase c{"b2_t160_h4_kv2_d64", 2, 160, 4, 2, 64};
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const Inputs in = draw(c, rng);
  const DeviceInputs dev(c, in.bq, in.bk, in.bv, in.bdout);
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D, nrow = c.B * c.H * c.T;
  const SeqBlock s{"keys_after_queries", 0, 70, 80, 80};
  DeviceBuffer out(nq * 2), lse(nrow * 4), dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
  launch_on_gpu(block_forward(c, s, dev, out.as<bf16>(), lse.as<float>()), "forward");
  const auto o = rows_of(to_float(out.download<bf16>(nq)), c.B, c.T, c.H * c.D, s.qo, s.tq);
  for (float x : o) ASSERT_EQ(x, 0.0f);
  const auto l = rows_of(lse.download<float>(nrow), c.B * c.H, c.T, 1, s.qo, s.tq);
  for (float x : l) ASSERT_EQ(x, -INFINITY);
  const auto g0 = to_bf16(rng.uniform<float>(nq)), k0 = to_bf16(rng.uniform<float>(nkv)),
             v0 = to_bf16(rng.uniform<float>(nkv));
  dq.upload(g0);
  dk.upload(k0);
  dv.upload(v0);
  launch_on_gpu(block_backward(c, s, dev, out.as<bf16>(), lse.as<float>(), dq.as<bf16>(), dk.as<bf16>(),
                               dv.as<bf16>(), Write::accumulate),
                "backward");
  EXPECT_EQ(to_float(dq.download<bf16>(nq)), to_float(g0));
  EXPECT_EQ(to_float(dk.download<bf16>(nkv)), to_float(k0));
  EXPECT_EQ(to_float(dv.download<bf16>(nkv)), to_float(v0));
}

// The ring of trainer/model/llama_context.cpp on one device: the sequence in
// 2 cp chunks of c, rank r holding chunks r and 2 cp - 1 - r (rows of its
// local (B, 2c, ...) tensors); at step s it computes on rank (r - s) mod cp's
// K/V, skipping chunk pairs whose keys all follow the queries, and merges
// each block's out and lse into its own through attention_merge. The
// backward accumulates every pair's dq into the rank's and dk, dv into the
// key owner's. Put back in sequence order, the results are whole-sequence
// attention, held to the file's rule against the fp64 reference.
struct RingCase {
  const char* name;
  int64_t B, cp, c, H, H_kv, D;
};

TEST(GpuAttentionBlocks, RingMergesToTheWhole) {
  const RingCase rings[] = {{"cp2_c70_b2_h4_kv2_d64", 2, 2, 70, 4, 2, 64},
                            {"cp3_c48_b1_h4_kv1_d128", 1, 3, 48, 4, 1, 128},
                            {"cp2_c64_b1_h4_kv4_d128", 1, 2, 64, 4, 4, 128},
                            {"cp4_c33_b2_h8_kv2_d64", 2, 4, 33, 8, 2, 64}};
  for (const RingCase& rc : rings) {
    SCOPED_TRACE(rc.name);
    const int64_t cp = rc.cp, c = rc.c, Tl = 2 * c;
    const AttentionCase whole{rc.name, rc.B, 2 * cp * c, rc.H, rc.H_kv, rc.D};
    Rng rng;
    SCOPED_TRACE(rng.trace());
    const auto [in, ref, naive] = prepare(whole, rng);
    const AttentionCase local{rc.name, rc.B, Tl, rc.H, rc.H_kv, rc.D};
    auto chunk_offset = [&](int64_t r, int64_t k) { return (k == 0 ? r : 2 * cp - 1 - r) * c; };
    // Whole (B, T, w) rows <-> rank r's local (B, 2c, w) rows.
    auto to_local = [&](const auto& x, int64_t w, int64_t r) {
      std::remove_cvref_t<decltype(x)> y(size_t(rc.B * Tl * w));
      for (int64_t b = 0; b < rc.B; ++b)
        for (int64_t k = 0; k < 2; ++k)
          std::copy_n(x.begin() + (b * whole.T + chunk_offset(r, k)) * w, c * w, y.begin() + (b * Tl + k * c) * w);
      return y;
    };
    // nb sequences of rows: B, or B H for lse.
    auto to_whole = [&](const std::vector<float>& y, std::vector<float>& x, int64_t w, int64_t r, int64_t nb) {
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t k = 0; k < 2; ++k)
          std::copy_n(y.begin() + (b * Tl + k * c) * w, c * w, x.begin() + (b * whole.T + chunk_offset(r, k)) * w);
    };
    const int64_t wq = rc.H * rc.D, wkv = rc.H_kv * rc.D;
    const int64_t nq = rc.B * Tl * wq, nkv = rc.B * Tl * wkv, nrow = rc.B * rc.H * Tl;
    std::vector<std::unique_ptr<DeviceInputs>> dev;
    std::vector<std::unique_ptr<DeviceBuffer>> out, lse, dq, dk, dv;
    for (int64_t r = 0; r < cp; ++r) {
      dev.push_back(std::make_unique<DeviceInputs>(local, to_local(in.bq, wq, r), to_local(in.bk, wkv, r),
                                                   to_local(in.bv, wkv, r), to_local(in.bdout, wq, r)));
      out.push_back(std::make_unique<DeviceBuffer>(nq * 2));
      lse.push_back(std::make_unique<DeviceBuffer>(nrow * 4));
      dq.push_back(std::make_unique<DeviceBuffer>(nq * 2));
      dk.push_back(std::make_unique<DeviceBuffer>(nkv * 2));
      dv.push_back(std::make_unique<DeviceBuffer>(nkv * 2));
      out[r]->upload(std::vector<bf16>(size_t(nq), float_to_bf16(0.0f)));
      lse[r]->upload(std::vector<float>(size_t(nrow), -INFINITY));
      for (auto* g : {dq[r].get(), dk[r].get(), dv[r].get()})
        g->upload(std::vector<bf16>(size_t(g->bytes() / 2), float_to_bf16(0.0f)));
    }
    DeviceBuffer part_out(nq * 2), part_lse(nrow * 4);
    for (int64_t r = 0; r < cp; ++r)
      for (int64_t s = 0; s < cp; ++s) {
        const int64_t src = (r - s + cp) % cp;
        for (int64_t qc = 0; qc < 2; ++qc)
          for (int64_t kc = 0; kc < 2; ++kc) {
            const int64_t qo = chunk_offset(r, qc), ko = chunk_offset(src, kc);
            if (ko > qo) continue;
            launch_on_gpu(AttentionForwardParams<bf16>{
                              .kind = AttentionKind::flash, .B = rc.B, .T = c, .H = rc.H, .H_kv = rc.H_kv,
                              .D = rc.D, .q = dev[r]->q.as<bf16>() + qc * c * wq,
                              .k = dev[src]->k.as<bf16>() + kc * c * wkv, .v = dev[src]->v.as<bf16>() + kc * c * wkv,
                              .out = part_out.as<bf16>() + qc * c * wq, .lse = part_lse.as<float>() + qc * c,
                              .Tk = c, .q_offset = qo, .k_offset = ko, .q_batch_rows = Tl, .kv_batch_rows = Tl,
                              .lse_batch_rows = Tl},
                          "ring block forward");
            const AttentionMergeParams<bf16> merge{.B = rc.B, .T = c, .H = rc.H, .D = rc.D,
                                                   .out = out[r]->as<bf16>() + qc * c * wq,
                                                   .lse = lse[r]->as<float>() + qc * c,
                                                   .part_out = part_out.as<bf16>() + qc * c * wq,
                                                   .part_lse = part_lse.as<float>() + qc * c,
                                                   .q_batch_rows = Tl, .lse_batch_rows = Tl};
            ASSERT_TRUE(supports(merge, Backend::cuda));
            const int64_t mb = workspace_bytes(merge, Backend::cuda);
            DeviceBuffer mws(mb);
            status_check(launch(merge, Workspace{mws.as<void>(), mb}, Stream{Backend::cuda, test_stream()}),
                         "attention_merge");
            cuda_ok(cudaStreamSynchronize(test_stream()), "attention_merge");
          }
      }
    for (int64_t r = 0; r < cp; ++r)
      for (int64_t s = 0; s < cp; ++s) {
        const int64_t src = (r - s + cp) % cp;
        for (int64_t qc = 0; qc < 2; ++qc)
          for (int64_t kc = 0; kc < 2; ++kc) {
            const int64_t qo = chunk_offset(r, qc), ko = chunk_offset(src, kc);
            if (ko > qo) continue;
            launch_on_gpu(AttentionBackwardParams<bf16>{
                              .kind = AttentionKind::flash, .B = rc.B, .T = c, .H = rc.H, .H_kv = rc.H_kv,
                              .D = rc.D, .q = dev[r]->q.as<bf16>() + qc * c * wq,
                              .k = dev[src]->k.as<bf16>() + kc * c * wkv, .v = dev[src]->v.as<bf16>() + kc * c * wkv,
                              .out = out[r]->as<bf16>() + qc * c * wq, .lse = lse[r]->as<float>() + qc * c,
                              .dout = dev[r]->dout.as<bf16>() + qc * c * wq, .dq = dq[r]->as<bf16>() + qc * c * wq,
                              .dk = dk[src]->as<bf16>() + kc * c * wkv, .dv = dv[src]->as<bf16>() + kc * c * wkv,
                              .Tk = c, .q_offset = qo, .k_offset = ko, .q_batch_rows = Tl, .kv_batch_rows = Tl,
                              .lse_batch_rows = Tl, .dq_write = Write::accumulate, .dkv_write = Write::accumulate},
                          "ring block backward");
          }
      }
    Result<float> got;
    got.out.assign(ref.out.size(), NAN);
    got.lse.assign(ref.lse.size(), NAN);
    got.dq.assign(ref.dq.size(), NAN);
    got.dk.assign(ref.dk.size(), NAN);
    got.dv.assign(ref.dv.size(), NAN);
    for (int64_t r = 0; r < cp; ++r) {
      to_whole(to_float(out[r]->download<bf16>(nq)), got.out, wq, r, rc.B);
      to_whole(to_float(dq[r]->download<bf16>(nq)), got.dq, wq, r, rc.B);
      to_whole(to_float(dk[r]->download<bf16>(nkv)), got.dk, wkv, r, rc.B);
      to_whole(to_float(dv[r]->download<bf16>(nkv)), got.dv, wkv, r, rc.B);
      to_whole(lse[r]->download<float>(nrow), got.lse, 1, r, rc.B * rc.H);
    }
    for (const Field& f : kFields) {
      SCOPED_TRACE(f.name);
      const std::vector<double>& r = ref.*f.ref;
      EXPECT_EQ(non_finite(got.*f.member), 0) << "left elements unwritten or non-finite";
      const double e = rel_l2(got.*f.member, r), bound = bound_of(naive.*f.member, r);
      EXPECT_LE(e, bound) << "ring vs fp64: error " << e << ", naive bf16 error " << rel_l2(naive.*f.member, r);
    }
  }
}

}  // namespace
}  // namespace weft::kernels::test
