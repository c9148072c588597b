// Dry-run speed: the full unconstrained layout space of llama-65b on 1024
// A100-80GB evaluated layout by layout, the dry-run's bounded search of it
// and of Llama 3.1 405B on 16384 H100s at 8k tokens, and the per-layout cost
// of the memory and cost models. Reports layouts evaluated per second, and
// the layouts a search predicted of its space. The whole process's time and
// memory: benchmarks/dry_run_time.sh.
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

// The dry-run's search (tuner::search): the same first rows as evaluating
// the whole space, from the layouts its bounds leave. Reports the space's
// size and the layouts it predicted.
void BM_DryRunSearch(benchmark::State& state, const char* model, const char* gpu, int64_t gpus, int64_t seq) {
  tuner::SpaceContext ctx;
  ctx.model = model_preset(model);
  ctx.run = RunSpec{seq, 2048, Precision::bf16};
  ctx.cluster = cluster_resolve(gpu, gpus, 8);
  ctx.constants = tuner::cost_defaults(ctx.cluster.device);
  int64_t space = 0, visited = 0;
  for (auto _ : state) {
    const auto r = tuner::search(ctx, {}, 10);
    benchmark::DoNotOptimize(r.fitting);
    space = r.evaluated;
    visited = r.visited;
  }
  state.counters["layouts"] = double(space);
  state.counters["visited"] = double(visited);
}
BENCHMARK_CAPTURE(BM_DryRunSearch, llama65b_1024_a100, "llama-65b", "a100-80gb", 1024, 2048)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_DryRunSearch, llama31_405b_16384_h100, "llama3.1-405b", "h100", 16384, 8192)
    ->Unit(benchmark::kMillisecond);

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
