// Helpers shared by the CUDA kernel benchmarks (bench_gpu_kernels.cpp and
// bench_gpu_fp8.cpp, one program): a stream, device buffers of random
// values, timing with CUDA events, and the registration of a benchmark that
// reports its rate beside the ceilings measured at the program's start.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/kernel.h"

namespace weft::bench {

using namespace weft::kernels;

// A Llama-7B micro-batch of 8192 tokens (C 4096, F 11008, V 32000, H 32, D 128).
constexpr int64_t kRows = 8192, kC = 4096, kF = 11008, kV = 32000, kH = 32, kD = 128;
constexpr int64_t kB = 4, kT = 2048;  // kB * kT = kRows

// A blocking stream: its launches wait for the inputs' cudaMemcpy and
// cudaMemset on the legacy default stream (a non-blocking one raced them).
inline cudaStream_t stream() {
  static const cudaStream_t s = [] {
    cudaStream_t created = nullptr;
    CUDA_CHECK(cudaStreamCreate(&created));
    return created;
  }();
  return s;
}

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t n) : n_(n) {
    if (n_ > 0) CUDA_CHECK(cudaMalloc(&ptr_, size_t(n_) * sizeof(T)));
  }
  ~DeviceArray() { (void)cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* data() const { return static_cast<T*>(ptr_); }

 private:
  int64_t n_;
  void* ptr_ = nullptr;
};

// Random values in [lo, hi): a block of 2^22 drawn on the host, repeated.
template <typename T>
void fill_random(T* dst, int64_t n, double lo = -1.0, double hi = 1.0) {
  static std::mt19937_64 gen(12345);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> block(size_t(std::min<int64_t>(n, int64_t{1} << 22)));
  for (T& v : block) {
    if constexpr (std::is_same_v<T, bf16>)
      v = float_to_bf16(float(dist(gen)));
    else
      v = T(dist(gen));
  }
  for (int64_t done = 0; done < n; done += int64_t(block.size())) {
    const int64_t count = std::min<int64_t>(int64_t(block.size()), n - done);
    CUDA_CHECK(cudaMemcpy(dst + done, block.data(), size_t(count) * sizeof(T), cudaMemcpyHostToDevice));
  }
}

template <typename T>
DeviceArray<T>* random_array(std::vector<std::shared_ptr<void>>& keep, int64_t n, double lo = -1.0,
                             double hi = 1.0) {
  auto a = std::make_shared<DeviceArray<T>>(n);
  fill_random(a->data(), n, lo, hi);
  keep.push_back(a);
  return a.get();
}

// Median milliseconds of `reps` timed runs of op after one warm-up.
inline double median_ms(const std::function<void()>& op, int reps) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  op();
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  std::vector<float> ms(size_t(reps), 0.0f);
  for (float& m : ms) {
    CUDA_CHECK(cudaEventRecord(start, stream()));
    op();
    CUDA_CHECK(cudaEventRecord(stop, stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&m, start, stop));
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename P>
Status launch_with_workspace(const P& p, DeviceArray<std::byte>& ws, int64_t bytes) {
  return launch(p, Workspace{ws.data(), bytes}, make_cuda_stream(stream()));
}

// Launches p, checking its status (a refused launch would time nothing).
template <typename P>
std::function<void()> op_of(const P& p, std::vector<std::shared_ptr<void>>& keep) {
  const int64_t bytes = workspace_bytes(p, Backend::cuda);
  auto ws = std::make_shared<DeviceArray<std::byte>>(bytes);
  keep.push_back(ws);
  return [p, ws, bytes] { status_check(launch_with_workspace(p, *ws, bytes), "benchmark"); };
}

// The two ceilings of this device, measured once (bench_gpu_kernels.cpp).
struct Ceilings {
  double copy_gbps = 0, gemm_tflops = 0;
};
inline Ceilings g_ceilings;  // set by main before any benchmark runs

// One benchmark: times op per iteration and reports the rate next to its ceiling.
inline void run(benchmark::State& state, const std::function<void()>& op, double bytes, double flops) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  op();
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  double total_s = 0;
  for (auto _ : state) {
    CUDA_CHECK(cudaEventRecord(start, stream()));
    op();
    CUDA_CHECK(cudaEventRecord(stop, stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms * 1e-3);
    total_s += ms * 1e-3;
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  const double per_s = double(state.iterations()) / total_s;
  if (flops > 0) {
    const double tflops = flops * per_s / 1e12;
    state.counters["TFLOP/s"] = tflops;
    state.counters["ceiling_TFLOP/s"] = g_ceilings.gemm_tflops;
    state.counters["pct_of_ceiling"] = 100.0 * tflops / g_ceilings.gemm_tflops;
  } else {
    const double gbps = bytes * per_s / 1e9;
    state.counters["GB/s"] = gbps;
    state.counters["ceiling_GB/s"] = g_ceilings.copy_gbps;
    state.counters["pct_of_ceiling"] = 100.0 * gbps / g_ceilings.copy_gbps;
  }
}

using Setup = std::function<void(benchmark::State&)>;

// Registers name -> setup; the setup allocates and fills its buffers, then calls run().
inline void add(const std::string& name, Setup setup) {
  benchmark::RegisterBenchmark(name.c_str(), std::move(setup))
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}
// Registered from their own file.
void register_fp8();

}  // namespace weft::bench
