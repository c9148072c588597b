// One training step (forward, backward, AdamW) of a fixed small Llama on the
// CPU, timed: the weft side of benchmarks/cpu_step_vs_pytorch.py. Prints one
// JSON line: {"impl": "weft", "tokens_per_s": ..., "step_s": ...}.
//
//   bench_train_step [--model small] [--seq 256] [--batch 8] [--threads N] [--steps 5]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "trainer/model/llama.h"
#include "trainer/optim/optimizer.h"

extern "C" void openblas_set_num_threads(int);

int main(int argc, char** argv) {
  using namespace weft;
  std::string model = "small";
  int64_t seq = 256, batch = 8, threads = 0, steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--model") model = v;
    else if (k == "--seq") seq = std::stoll(v);
    else if (k == "--batch") batch = std::stoll(v);
    else if (k == "--threads") threads = std::stoll(v);
    else if (k == "--steps") steps = std::stoll(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int n = threads > 0 ? int(threads) : omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);

  const ModelSpec m = model_preset(model);
  const RunSpec run{seq, batch, Precision::fp32};
  Layout l;
  l.mb = batch;
  memory::Arena arena;
  auto groups = parallel::single_process_groups();
  trainer::LlamaStage<float> stage(m, run, l, 0, device_preset("cpu"), arena, groups);
  stage.init_weights(1);
  trainer::OptimConfig oc;
  oc.warmup_steps = 0;
  trainer::Optimizer<float> opt(stage, oc);
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(size_t(batch * seq)), targets(size_t(batch * seq));
  for (auto& t : tokens) t = int32_t(rng() % uint32_t(m.vocab));
  for (auto& t : targets) t = int32_t(rng() % uint32_t(m.vocab));

  auto one = [&](int64_t step) {
    stage.zero_grads();
    stage.forward(0, tokens.data(), targets.data(), 1.0 / double(batch * seq));
    const double loss = stage.take_loss();
    stage.backward(0);
    opt.step(step, loss / double(batch * seq));
  };
  one(1);  // warm-up: first-touch of every buffer, BLAS thread start
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) one(s + 2);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(steps);
  fmt::print("{{\"impl\": \"weft\", \"model\": \"{}\", \"threads\": {}, \"step_s\": {:.6f}, \"tokens_per_s\": {:.1f}}}\n",
             model, n, dt, double(batch * seq) / dt);
  return 0;
}
