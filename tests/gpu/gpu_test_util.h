// Helpers for the CUDA-vs-CPU kernel tests (test_gpu_kernels): device arrays
// that start poisoned, bf16 inputs, the CUDA launch protocol with a device
// workspace, and the tolerance rule for bf16 and fp32 results.
//
// The tolerance rule. Inputs are random, rounded to bf16, and every
// reference sees the rounded values, so all compute the same function:
//   ref    the CPU backend's fp64 instantiation on those inputs;
//   naive  the CPU backend's fp32 instantiation on those inputs, its output
//          rounded to the storage type of the CUDA output (bf16 for Elem
//          outputs, fp32 for Acc ones): what a straightforward kernel with
//          fp32 arithmetic and one rounding at the store would give.
// A CUDA output's relative L2 error against ref may be at most
//   bf16 outputs: 4 x max(naive's error, 2^-9)
//   fp32 outputs: 8 x max(naive's error, 2^-20)
// The multiple leaves room for another summation order, for a kernel that
// rounds an intermediate to bf16 where the fp32 reference does not (rmsnorm's
// x * rstd, Hugging Face's order) and for the fast exponential; the floors
// stand in for outputs a naive loop happens to get exact: 2^-9 is half of
// bf16's unit roundoff 2^-8, about the relative L2 error that rounding random
// values to bf16 leaves, and 2^-20 is 8 fp32 ulps, the error of the fast
// fp32 intrinsics and of tensor-core accumulation orders. An indexing, masking
// or aliasing bug gives errors of order 1; a NaN (a poisoned element the
// kernel never wrote) fails outright. Gathers, fills and casts, which round
// nothing or round exactly once, are compared bit for bit instead.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/kernel.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace weft::kernels::test {

// The stream every test launches on: a non-blocking stream of its own, not
// the default stream, so the backend must honour Stream::handle.
cudaStream_t gpu_stream();

// Whether this device runs FP8 GEMMs (compute capability 8.9 or newer); the
// FP8 GEMM tests skip otherwise, after checking that the backend says so.
bool fp8_gemm_here();

// A device array of n elements, filled with 0xff bytes (NaN as bf16 and as
// fp32) until written.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t n) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(&ptr_, bytes()));
    poison();
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(int64_t(host.size())) { upload(host); }
  ~DeviceArray() { (void)cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() const { return static_cast<T*>(ptr_); }
  int64_t size() const { return n_; }
  size_t bytes() const { return size_t(n_) * sizeof(T); }

  // cudaMemset and cudaMemcpy run on the legacy default stream, which the
  // non-blocking test stream does not wait for (cudaMemset of device memory
  // and a copy from pageable memory may return before the device is done):
  // both are followed by a device-wide synchronisation.
  void poison() {
    if (n_ > 0) CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes()));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(int64_t(host.size()), n_);
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Waits for the test stream first.
  std::vector<T> download() const {
    CUDA_CHECK(cudaStreamSynchronize(gpu_stream()));
    std::vector<T> host(static_cast<size_t>(n_));
    if (n_ > 0) CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  int64_t n_;
  void* ptr_ = nullptr;
};

// Values rounded to bf16, in the three forms the backends take.
struct Bf16Values {
  std::vector<bf16> bits;    // the CUDA input
  std::vector<float> f;      // the CPU fp32 input
  std::vector<double> d;     // the CPU fp64 (reference) input
};
Bf16Values bf16_values(const std::vector<double>& values);
Bf16Values random_bf16(Rng& rng, int64_t n, double lo = -1.0, double hi = 1.0);

std::vector<float> to_float(const std::vector<bf16>& v);
// Each value rounded to the nearest bf16, as fp32.
std::vector<float> rounded_to_bf16(const std::vector<float>& v);

// Launches through the CUDA protocol on gpu_stream() with a poisoned device
// workspace of the size workspace_bytes() asks, then waits for the stream.
template <typename P>
Status run_cuda(const P& p) {
  EXPECT_TRUE(supports(p, Backend::cuda));
  const int64_t bytes = workspace_bytes(p, Backend::cuda);
  DeviceArray<std::byte> ws(bytes);
  const Status s = launch(p, Workspace{ws.data(), bytes}, make_cuda_stream(gpu_stream()));
  CUDA_CHECK(cudaStreamSynchronize(gpu_stream()));
  return s;
}

constexpr double kBf16Multiple = 4.0;
constexpr double kBf16Floor = 1.0 / 512;  // 2^-9
constexpr double kFp32Multiple = 8.0;
constexpr double kFp32Floor = 1.0 / (1 << 20);

// The rule above for a bf16 result (got) and for an fp32 one; cpu_fp32 is
// the fp32 CPU backend's output before any rounding to bf16.
void expect_bf16_rule(const std::string& what, const std::vector<bf16>& got,
                      const std::vector<float>& cpu_fp32, const std::vector<double>& ref);
void expect_fp32_rule(const std::string& what, const std::vector<float>& got,
                      const std::vector<float>& cpu_fp32, const std::vector<double>& ref);

// Bit-for-bit equality, naming the first differing element.
void expect_same_bits(const std::string& what, const std::vector<bf16>& got,
                      const std::vector<bf16>& want);

// The array's second element, one element past a 16-byte boundary: every
// vectorised kernel must take its element-by-element path there.
template <typename T>
T* misaligned(const DeviceArray<T>& a) {
  return a.data() + 1;
}

}  // namespace weft::kernels::test
