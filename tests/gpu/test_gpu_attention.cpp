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
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
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

}  // namespace
}  // namespace weft::kernels::test
