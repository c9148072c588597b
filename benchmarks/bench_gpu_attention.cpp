// bench_gpu_attention: the CUDA attention kernels (flash, materialized and
// cudnn, cuDNN's fused SDPA, when built with the cuDNN frontend), forward +
// backward, bf16, causal, GQA 4:1 (H 32, H_kv 8), D 128, at T 2048 (B 8) and
// T 8192 (B 2), 16384 tokens either way; the weft side of
// attention_vs_pytorch.py.
//
// Time comes from CUDA events around the forward and the backward of each
// iteration (manual time, milliseconds); the counters give TFLOP/s counting
// the causal work only: the forward's two products over the T (T + 1) / 2
// (query, key) pairs, 4 B H D T (T + 1) / 2, and the backward's five, 2.5
// times that. The materialized variant computes every product over all T^2
// pairs and is counted the same, as useful work. Inputs are random bf16, not
// zeros. Without a CUDA device it says so and exits 0.
//
//   bench_gpu_attention [--benchmark_filter='flash|cudnn'] [--benchmark_format=json] ...
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"

namespace {

using namespace weft::kernels;
using weft::AttentionKind;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Shape {
  int64_t B, T, H, H_kv, D;
};

// Causal multiply-adds x 2 of one forward.
double forward_flops(const Shape& s) {
  return 4.0 * double(s.B) * double(s.H) * double(s.D) * double(s.T) * double(s.T + 1) / 2;
}

class DeviceBytes {
 public:
  explicit DeviceBytes(int64_t bytes) {
    if (bytes > 0) cuda_ok(cudaMalloc(&ptr_, size_t(bytes)), "cudaMalloc");
  }
  ~DeviceBytes() { cudaFree(ptr_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

void fill_random(bf16* dst, int64_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<bf16> host(static_cast<size_t>(n));
  for (bf16& x : host) x = float_to_bf16(dist(gen));
  cuda_ok(cudaMemcpy(dst, host.data(), size_t(n) * sizeof(bf16), cudaMemcpyHostToDevice), "upload");
}

void bench_attention(benchmark::State& state, AttentionKind kind, Shape s) {
  try {
    const int64_t nq = s.B * s.T * s.H * s.D, nkv = s.B * s.T * s.H_kv * s.D, nrow = s.B * s.H * s.T;
    const int64_t nprobs = kind == AttentionKind::materialized ? nrow * s.T : 0;
    DeviceBytes q(nq * 2), k(nkv * 2), v(nkv * 2), out(nq * 2), dout(nq * 2), dq(nq * 2), dk(nkv * 2),
        dv(nkv * 2), lse(nrow * 4), probs(nprobs * 2);
    fill_random(q.as<bf16>(), nq, -2, 2, 1);
    fill_random(k.as<bf16>(), nkv, -2, 2, 2);
    fill_random(v.as<bf16>(), nkv, -1, 1, 3);
    fill_random(dout.as<bf16>(), nq, -1, 1, 4);
    const AttentionForwardParams<bf16> fwd{.kind = kind, .B = s.B, .T = s.T, .H = s.H, .H_kv = s.H_kv,
                                           .D = s.D, .q = q.as<bf16>(), .k = k.as<bf16>(),
                                           .v = v.as<bf16>(), .out = out.as<bf16>(),
                                           .lse = lse.as<float>(), .probs = probs.as<bf16>()};
    const AttentionBackwardParams<bf16> bwd{
        .kind = kind, .B = s.B, .T = s.T, .H = s.H, .H_kv = s.H_kv, .D = s.D, .q = q.as<bf16>(),
        .k = k.as<bf16>(), .v = v.as<bf16>(), .out = out.as<bf16>(), .lse = lse.as<float>(),
        .probs = probs.as<bf16>(), .dout = dout.as<bf16>(), .dq = dq.as<bf16>(), .dk = dk.as<bf16>(),
        .dv = dv.as<bf16>()};
    if (!attention_available(kind, Backend::cuda)) {
      state.SkipWithError("this build has no such kind (cudnn needs the cuDNN frontend at configure time)");
      return;
    }
    if (!supports(fwd, Backend::cuda) || !supports(bwd, Backend::cuda)) {
      state.SkipWithError("params not supported by the CUDA backend");
      return;
    }
    const int64_t ws_fwd = workspace_bytes(fwd, Backend::cuda), ws_bwd = workspace_bytes(bwd, Backend::cuda);
    DeviceBytes ws(std::max(ws_fwd, ws_bwd));
    cudaStream_t stream = nullptr;
    cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
    const Stream st{Backend::cuda, stream};
    auto step = [&] {
      status_check(launch(fwd, Workspace{ws.as<void>(), ws_fwd}, st), "attention forward");
      status_check(launch(bwd, Workspace{ws.as<void>(), ws_bwd}, st), "attention backward");
    };
    // Warm-up: module load, the cuBLAS and cuDNN handles, the shared-memory
    // attributes, and the cudnn kind's graph builds (once per shape).
    step();
    cuda_ok(cudaStreamSynchronize(stream), "warm-up");

    cudaEvent_t e0, e1, e2;
    cuda_ok(cudaEventCreate(&e0), "event");
    cuda_ok(cudaEventCreate(&e1), "event");
    cuda_ok(cudaEventCreate(&e2), "event");
    double fwd_s = 0, bwd_s = 0;
    int64_t iters = 0;
    for (auto _ : state) {
      cuda_ok(cudaEventRecord(e0, stream), "record");
      status_check(launch(fwd, Workspace{ws.as<void>(), ws_fwd}, st), "attention forward");
      cuda_ok(cudaEventRecord(e1, stream), "record");
      status_check(launch(bwd, Workspace{ws.as<void>(), ws_bwd}, st), "attention backward");
      cuda_ok(cudaEventRecord(e2, stream), "record");
      cuda_ok(cudaEventSynchronize(e2), "sync");
      float f_ms = 0, b_ms = 0;
      cuda_ok(cudaEventElapsedTime(&f_ms, e0, e1), "elapsed");
      cuda_ok(cudaEventElapsedTime(&b_ms, e1, e2), "elapsed");
      fwd_s += f_ms / 1e3;
      bwd_s += b_ms / 1e3;
      ++iters;
      state.SetIterationTime((f_ms + b_ms) / 1e3);
    }
    const double ff = forward_flops(s);
    if (iters > 0) {
      state.counters["fwd_ms"] = fwd_s / double(iters) * 1e3;
      state.counters["bwd_ms"] = bwd_s / double(iters) * 1e3;
      state.counters["fwd_TFLOPs"] = ff * double(iters) / fwd_s / 1e12;
      state.counters["bwd_TFLOPs"] = 2.5 * ff * double(iters) / bwd_s / 1e12;
      state.counters["TFLOPs"] = 3.5 * ff * double(iters) / (fwd_s + bwd_s) / 1e12;
    }
    if (kind == AttentionKind::cudnn) {
      // What cuDNN's graphs asked for against the bound weft reserves
      // (attention_cudnn.h; the memory model uses the same bound).
      state.counters["ws_fwd_MiB"] = double(cudnn_graph_workspace(fwd)) / (1 << 20);
      state.counters["ws_bwd_MiB"] = double(cudnn_graph_workspace(bwd)) / (1 << 20);
      state.counters["ws_bound_MiB"] = double(ws_bwd) / (1 << 20);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaEventDestroy(e2);
    cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_gpu_attention: no CUDA device, nothing to measure\n");
    return 0;
  }
  const Shape shapes[] = {{8, 2048, 32, 8, 128}, {2, 8192, 32, 8, 128}};
  for (const Shape& s : shapes)
    for (AttentionKind kind : {AttentionKind::flash, AttentionKind::materialized, AttentionKind::cudnn}) {
      const std::string name = std::string("attention_fwd_bwd/") + weft::to_string(kind) +
                               "/B" + std::to_string(s.B) + "_T" + std::to_string(s.T) + "_H" +
                               std::to_string(s.H) + "_Hkv" + std::to_string(s.H_kv) + "_D" +
                               std::to_string(s.D);
      benchmark::RegisterBenchmark(name.c_str(), [kind, s](benchmark::State& st) { bench_attention(st, kind, s); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
