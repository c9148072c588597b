// What the GPU attention tests share (test_gpu_attention.cpp, whole
// sequences; test_gpu_attention_blocks.cpp, blocks of the sequence):
// device buffers filled with NaN, the test stream, bf16 conversions, the
// inputs and references of a case, and the tolerance rule's pieces (the
// rule itself is stated at the top of test_gpu_attention.cpp).
#pragma once

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

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Launches go to a non-blocking stream of the test's own, so the backend
// must honour Stream::handle. Such a stream does not wait for the legacy
// default stream that cudaMemset and cudaMemcpy use, so those are followed by
// a device-wide synchronisation.
inline cudaStream_t test_stream() {
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

inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}
inline std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

template <typename R>
using Result = AttentionResult<R>;


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


inline constexpr double kBf16Multiple = 4.0;
inline constexpr double kBf16Roundoff = 1.0 / 512;  // 2^-9

inline double bound_of(const std::vector<float>& naive, const std::vector<double>& ref) {
  return kBf16Multiple * std::max(rel_l2(naive, ref), kBf16Roundoff);
}

inline int64_t non_finite(const std::vector<float>& v) {
  int64_t n = 0;
  for (float x : v) n += !std::isfinite(x);
  return n;
}

// ||a - b|| / ||ref|| (absolute when ref is zero), the rule's scale.
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}


struct Inputs {
  std::vector<float> q, k, v, dout;  // bf16-rounded
  std::vector<bf16> bq, bk, bv, bdout;
};

inline Inputs draw(const AttentionCase& c, Rng& rng) {
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

inline Prepared prepare(const AttentionCase& c, Rng& rng) {
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
inline const Field kFields[] = {{"out", &Result<float>::out, &Result<double>::out},
                         {"lse", &Result<float>::lse, &Result<double>::lse},
                         {"dq", &Result<float>::dq, &Result<double>::dq},
                         {"dk", &Result<float>::dk, &Result<double>::dk},
                         {"dv", &Result<float>::dv, &Result<double>::dv}};

}  // namespace weft::kernels::test
