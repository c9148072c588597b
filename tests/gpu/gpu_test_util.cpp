#include "tests/gpu/gpu_test_util.h"

#include <algorithm>
#include <cstring>

namespace weft::kernels::test {

bool fp8_gemm_here() {
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor >= 89;
}

cudaStream_t gpu_stream() {
  static const cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}

Bf16Values bf16_values(const std::vector<double>& values) {
  Bf16Values v;
  for (double x : values) {
    const bf16 b = float_to_bf16(float(x));
    v.bits.push_back(b);
    v.f.push_back(bf16_to_float(b));
    v.d.push_back(double(bf16_to_float(b)));
  }
  return v;
}

Bf16Values random_bf16(Rng& rng, int64_t n, double lo, double hi) {
  return bf16_values(rng.uniform<double>(n, lo, hi));
}

std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> out;
  out.reserve(v.size());
  for (bf16 b : v) out.push_back(bf16_to_float(b));
  return out;
}

std::vector<float> rounded_to_bf16(const std::vector<float>& v) {
  std::vector<float> out;
  out.reserve(v.size());
  for (float x : v) out.push_back(bf16_to_float(float_to_bf16(x)));
  return out;
}

namespace {

template <typename G>
void expect_rule(const std::string& what, const std::vector<G>& got, const std::vector<float>& naive,
                 const std::vector<double>& ref, double multiple, double floor) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  ASSERT_EQ(naive.size(), ref.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(std::isfinite(double(got[i])))
        << what << ": element " << i << " is " << double(got[i])
        << " (not written, or the kernel made a NaN/inf where the reference has " << ref[i] << ")";
  const double naive_err = rel_l2(naive, ref);
  const double bound = multiple * std::max(naive_err, floor);
  const double err = rel_l2(got, ref);
  EXPECT_LE(err, bound) << what << ": relative L2 error " << err << ", naive error " << naive_err
                        << ", bound " << bound;
}

}  // namespace

void expect_bf16_rule(const std::string& what, const std::vector<bf16>& got,
                      const std::vector<float>& cpu_fp32, const std::vector<double>& ref) {
  expect_rule(what, to_float(got), rounded_to_bf16(cpu_fp32), ref, kBf16Multiple, kBf16Floor);
}

void expect_fp32_rule(const std::string& what, const std::vector<float>& got,
                      const std::vector<float>& cpu_fp32, const std::vector<double>& ref) {
  expect_rule(what, got, cpu_fp32, ref, kFp32Multiple, kFp32Floor);
}

void expect_same_bits(const std::string& what, const std::vector<bf16>& got,
                      const std::vector<bf16>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i].bits, want[i].bits)
        << what << ": element " << i << " is " << bf16_to_float(got[i]) << ", expected "
        << bf16_to_float(want[i]);
}

}  // namespace weft::kernels::test
