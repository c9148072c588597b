// Dry-run speed: the full unconstrained layout space of llama-65b on 1024
// A100-80GB (target: under one second), and the per-layout cost of the memory
// and cost models. Reports layouts evaluated per second.
#include <benchmark/benchmark.h>

#include "tuner/space.h"

namespace {

using namespace weft;

void BM_DryRunFullSpace(benchmark::State& state, const char* model, int64_t gpus) {
  const ModelSpec m = model_preset(model);
  const RunSpec run{2048, 2048, Precision::bf16};
  const ClusterSpec c = cluster_resolve("a100-80gb", gpus, 8);
  const auto k = tuner::cost_defaults(c.device);
  int64_t layouts = 0;
  for (auto _ : state) {
    const auto space = tuner::enumerate(m, run, gpus, {});
    const auto r = tuner::evaluate(m, run, c, space, k);
    benchmark::DoNotOptimize(r.fitting);
    layouts += r.evaluated;
  }
  state.counters["layouts"] = double(layouts) / double(state.iterations());
  state.counters["layouts_per_s"] = benchmark::Counter(double(layouts), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_DryRunFullSpace, llama65b_1024_a100, "llama-65b", 1024)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DryRunFullSpace, llama13b_64_a100, "llama-13b", 64)->Unit(benchmark::kMillisecond);

void BM_MemoryEstimate(benchmark::State& state) {
  const ModelSpec m = model_preset("llama-65b");
  const RunSpec run{2048, 2048, Precision::bf16};
  const auto dev = device_preset("a100-80gb");
  const Layout l = Layout::parse("tp8-pp8-dp16-mb1-vpp2-sp-ckpt:full@3-zero1");
  for (auto _ : state) benchmark::DoNotOptimize(memory::estimate(m, run, l, dev).peak());
}
BENCHMARK(BM_MemoryEstimate);

void BM_CostPredict(benchmark::State& state) {
  const ModelSpec m = model_preset("llama-65b");
  const RunSpec run{2048, 2048, Precision::bf16};
  const ClusterSpec c = cluster_resolve("a100-80gb", 1024, 8);
  const auto k = tuner::cost_defaults(c.device);
  const Layout l = Layout::parse("tp8-pp8-dp16-mb1-vpp2-sp-ckpt:full@3-zero1");
  for (auto _ : state) benchmark::DoNotOptimize(tuner::predict(m, run, l, c, k).step);
}
BENCHMARK(BM_CostPredict);

}  // namespace

BENCHMARK_MAIN();
