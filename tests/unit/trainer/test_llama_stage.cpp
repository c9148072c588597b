// The single-rank Llama stage: finite-difference gradients in float64 through
// the very same code, bit-identical gradients under every checkpointing mode,
// agreement of the attention and norm variants, and the arena's measured
// peaks against the memory model.
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "kernels/fp8/fp8_ops.h"
#include "kernels/attention/attention.h"
#include "memory/estimate.h"
#include "trainer/loop.h"
#include "trainer/model/llama.h"
#include "../test_util.h"
#include "stage_test_util.h"

namespace weft::trainer {
namespace {

using test_stage::Batch;
using test_stage::cpu;
using test_stage::random_batch;

ModelSpec small_model(bool tied = false) {
  ModelSpec m = model_preset("tiny-test");  // V=96 C=32 F=80 H=4 H_kv=2 D=8
  m.layers = 2;
  m.tied_embeddings = tied;
  return m;
}

template <typename Elem>
struct Harness : test_stage::Stage<Elem> {
  using test_stage::Stage<Elem>::Stage;
  using test_stage::Stage<Elem>::stage;
  // Mean loss over the batch of micro-batches, gradients accumulated.
  double step(const Batch& b, int64_t micro_batches) {
    stage.zero_grads();
    const int64_t rows = b.tokens.size() / micro_batches;
    const double scale = 1.0 / double(b.tokens.size());
    double loss = 0;
    for (int64_t i = 0; i < micro_batches; ++i) {
      stage.forward(0, b.tokens.data() + i * rows, b.targets.data() + i * rows, scale);
      loss += stage.take_loss();
      stage.backward(0);
    }
    return loss * scale;
  }
  double loss_only(const Batch& b, int64_t micro_batches) {
    const int64_t rows = b.tokens.size() / micro_batches;
    double loss = 0;
    for (int64_t i = 0; i < micro_batches; ++i) {
      stage.forward(0, b.tokens.data() + i * rows, b.targets.data() + i * rows, 1.0);
      loss += stage.take_loss();
    }
    return loss / double(b.tokens.size());
  }
};

TEST(LlamaStage, FiniteDifferenceGradients) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (const char* layout : {"mb1-attn:flash-norm:fused", "mb1-attn:materialized-norm:unfused-ckpt:full"}) {
    for (bool tied : {false, true}) {
      const ModelSpec m = small_model(tied);
      const RunSpec run{5, 2, Precision::fp32};
      const Layout l = Layout::parse(layout);
      Harness<double> h(m, run, l, seed);
      std::mt19937_64 rng = h.spread_weights(seed);
      const Batch b = random_batch(2 * 5, m.vocab, seed + 1);
      h.step(b, 2);
      std::vector<double> grads(h.stage.grads(), h.stage.grads() + h.stage.param_elements());
      for (const auto& p : h.stage.params().specs) {
        for (int trial = 0; trial < 3; ++trial) {
          const int64_t i = p.offset + int64_t(rng() % uint64_t(p.local_elements()));
          double& w = h.stage.weights()[i];
          const double w0 = w, eps = 1e-5;
          w = w0 + eps;
          const double up = h.loss_only(b, 2);
          w = w0 - eps;
          const double down = h.loss_only(b, 2);
          w = w0;
          const double fd = (up - down) / (2 * eps);
          EXPECT_NEAR(grads[size_t(i)], fd, 1e-7 + 1e-5 * std::fabs(fd))
              << layout << (tied ? " tied " : " ") << p.name << " element " << i - p.offset;
        }
      }
    }
  }
}

TEST(LlamaStage, CheckpointingGivesBitIdenticalGradients) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  ModelSpec m = small_model();
  m.layers = 4;
  const RunSpec run{7, 4, Precision::fp32};
  const Batch b = random_batch(4 * 7, m.vocab, seed);
  for (const char* base : {"attn:flash-norm:fused", "attn:materialized-norm:unfused"}) {
    Harness<float> ref(m, run, Layout::parse(fmt::format("mb2-{}", base)), seed);
    const double loss = ref.step(b, 2);
    for (const char* ck : {"selective", "ffn", "full", "full@1", "selective@3"}) {
      Harness<float> h(m, run, Layout::parse(fmt::format("mb2-{}-ckpt:{}", base, ck)), seed);
      EXPECT_EQ(h.step(b, 2), loss) << ck;
      EXPECT_EQ(0, std::memcmp(h.stage.grads(), ref.stage.grads(),
                               size_t(ref.stage.param_elements()) * sizeof(float)))
          << base << " ckpt:" << ck;
    }
  }
}

TEST(LlamaStage, VariantsAgreeAndMicroBatchesAccumulate) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  const ModelSpec m = small_model();
  const RunSpec run{9, 4, Precision::fp32};
  const Batch b = random_batch(4 * 9, m.vocab, seed);
  Harness<double> exact(m, run, Layout::parse("mb4"), seed);
  const double loss64 = exact.step(b, 1);
  auto rel = [&](const float* g) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < exact.stage.param_elements(); ++i) {
      num += std::pow(double(g[i]) - exact.stage.grads()[i], 2);
      den += std::pow(exact.stage.grads()[i], 2);
    }
    return std::sqrt(num / den);
  };
  for (const char* layout : {"mb4", "mb1", "mb2-attn:materialized", "mb2-norm:unfused"}) {
    Harness<float> h(m, run, Layout::parse(layout), seed);
    const int64_t mbs = 4 / Layout::parse(layout).mb;
    const double loss = h.step(b, mbs);
    // fp32 against fp64 through the same code: a few hundred ulps at most.
    EXPECT_NEAR(loss, loss64, 1e-5 * loss64) << layout;
    EXPECT_LT(rel(h.stage.grads()), 1e-4) << layout;
  }
}

TEST(LlamaStage, ArenaPeaksEqualTheMemoryModel) {
  const ModelSpec m = small_model();
  const RunSpec run{7, 4, Precision::fp32};
  for (const char* layout : {"mb1", "mb2-ckpt:full", "mb2-ckpt:selective-attn:materialized",
                             "mb1-norm:unfused-ckpt:ffn"}) {
    const Layout l = Layout::parse(layout);
    Harness<float> h(m, run, l, 1);
    h.step(random_batch(4 * 7, m.vocab, 2), 4 / l.mb);
    memory::MemoryOptions o;
    const auto e = memory::estimate(m, run, l, cpu(), o);
    for (auto c : memory::kAllCategories)
      EXPECT_EQ(h.arena.peak(c), e.stages[0].bytes[size_t(c)]) << layout << " " << memory::to_string(c);
    EXPECT_EQ(h.arena.peak_total(), e.peak()) << layout;
  }
}

TEST(LlamaStage, LayoutIndependentInitialisation) {
  const ModelSpec m = small_model();
  const RunSpec run{5, 2, Precision::fp32};
  Harness<float> a(m, run, Layout::parse("mb1"), 42);
  Harness<float> b(m, run, Layout::parse("mb2-ckpt:full"), 42);
  Harness<float> c(m, run, Layout::parse("mb1"), 43);
  EXPECT_EQ(0, std::memcmp(a.stage.weights(), b.stage.weights(), size_t(a.stage.param_elements()) * 4));
  EXPECT_NE(0, std::memcmp(a.stage.weights(), c.stage.weights(), size_t(a.stage.param_elements()) * 4));
}

// cuDNN's attention is refused up front where it cannot run: on a CPU, and on
// a GPU in a build without the cuDNN frontend.
TEST(LlamaStage, CudnnAttentionOnlyWhereBuilt) {
  const Layout l = Layout::parse("mb1-attn:cudnn");
  WEFT_EXPECT_THROW_MSG(check_trainable(l, DeviceKind::cpu), LayoutError, "attn:cudnn",
                        "needs a GPU");
  if (kernels::attention_available(AttentionKind::cudnn, kernels::Backend::cuda))
    EXPECT_NO_THROW(check_trainable(l, DeviceKind::gpu));
  else
    WEFT_EXPECT_THROW_MSG(check_trainable(l, DeviceKind::gpu), LayoutError, "cuDNN frontend");
  EXPECT_NO_THROW(check_trainable(Layout::parse("mb1-attn:flash"), DeviceKind::cpu));
}

// Asked for anywhere (a dry-run for a cluster that is not this machine),
// only the trainer's own limits count: FP8 and cuDNN's attention on a GPU
// are trainable whatever this build and device are, cuDNN under cp's ring
// too; cp's ring with materialized attention, bf16
// gradients on a CPU and cuDNN on a CPU are not.
TEST(LlamaStage, TrainableAnywhereAsksTheTrainerNotThisMachine) {
  const auto anywhere = [](const char* text, DeviceKind d) {
    check_trainable(Layout::parse(text), d, Trainable::anywhere);
  };
  EXPECT_NO_THROW(anywhere("mb1-attn:cudnn-fp8:tensorwise", DeviceKind::gpu));
  EXPECT_NO_THROW(anywhere("mb1-attn:flash-fp8:blockwise-grad:bf16", DeviceKind::gpu));
  EXPECT_NO_THROW(anywhere("cp2-mb1-attn:cudnn-cp:ring", DeviceKind::gpu));
  WEFT_EXPECT_THROW_MSG(anywhere("cp2-mb1-attn:materialized-cp:ring", DeviceKind::gpu), LayoutError,
                        "needs attn:flash or attn:cudnn");
  WEFT_EXPECT_THROW_MSG(anywhere("mb1-grad:bf16", DeviceKind::cpu), LayoutError, "grad:bf16");
  WEFT_EXPECT_THROW_MSG(anywhere("mb1-attn:cudnn", DeviceKind::cpu), LayoutError, "needs a GPU");
}

// Context parallelism's ring and all-gather call attention on blocks of the
// sequence: the CPU takes them with flash and materialized, a GPU with flash
// and cudnn. Its all-to-all calls attention on the whole sequence of fewer
// heads, which every kind takes.
TEST(LlamaStage, ContextParallelOnAGpuWithEveryKindThatTakesItsCalls) {
  for (const char* cp : {"cp:ring", "cp:allgather", "cp:a2a"}) {
    const std::string base = std::string("cp2-mb1-") + cp;
    EXPECT_NO_THROW(check_trainable(Layout::parse(base + "-attn:flash"), DeviceKind::gpu)) << cp;
    EXPECT_NO_THROW(check_trainable(Layout::parse(base + "-attn:flash"), DeviceKind::cpu)) << cp;
    EXPECT_NO_THROW(check_trainable(Layout::parse(base + "-attn:materialized"), DeviceKind::cpu)) << cp;
    EXPECT_NO_THROW(check_trainable(Layout::parse(base + "-attn:cudnn"), DeviceKind::gpu, Trainable::anywhere)) << cp;
    if (std::string(cp) == "cp:a2a") {
      EXPECT_NO_THROW(check_trainable(Layout::parse(base + "-attn:materialized"), DeviceKind::gpu));
      continue;
    }
    WEFT_EXPECT_THROW_MSG(check_trainable(Layout::parse(base + "-attn:materialized"), DeviceKind::gpu), LayoutError,
                          "cp=2", cp, "needs attn:flash or attn:cudnn", "materialized", "cp:a2a");
  }
  // cuDNN's chunks under the ring and the all-gather: a multiple of 4
  // positions (their lse on 16 bytes); a2a's calls are whole sequences.
  TrainConfig c;
  c.model = model_preset("tiny");
  c.device = device_preset("h100");
  c.run = RunSpec{200, 8, Precision::bf16};  // cp 2: chunks of 50
  for (const char* cp : {"cp:ring", "cp:allgather"}) {
    c.layout = Layout::parse(std::string("cp2-mb1-attn:cudnn-") + cp);
    WEFT_EXPECT_THROW_MSG(validate_config(c), InputError, "--seq 200", "chunks of 50", "a multiple of 16", "cp:a2a");
    c.layout.attention = AttentionKind::flash;
    EXPECT_NO_THROW(validate_config(c));
  }
  c.layout = Layout::parse("cp2-mb1-attn:cudnn-cp:a2a");
  EXPECT_NO_THROW(validate_config(c));
  c.layout = Layout::parse("cp2-mb1-attn:cudnn-cp:ring");
  c.run.seq = 208;  // chunks of 52
  EXPECT_NO_THROW(validate_config(c));
  // Given T, the dry-run's and the tuner's check refuses the same by name.
  const auto trainable = [&](const char* text, int64_t seq) {
    check_trainable(c.model, Layout::parse(text), DeviceKind::gpu, Trainable::anywhere, seq);
  };
  WEFT_EXPECT_THROW_MSG(trainable("cp2-mb1-attn:cudnn-cp:allgather", 200), LayoutError, "layout ", "chunks of 50");
  EXPECT_NO_THROW(trainable("cp2-mb1-attn:cudnn-cp:allgather", 208));
  EXPECT_NO_THROW(trainable("cp2-mb1-attn:cudnn-cp:a2a", 200));
  EXPECT_NO_THROW(trainable("cp2-mb1-attn:flash-cp:ring", 200));
  EXPECT_NO_THROW(trainable("cp2-mb1-attn:cudnn-cp:ring", 0));  // (T not given)
}

// FP8 GEMMs run on the CPU (emulated) and on GPUs with FP8 tensor cores
// (sm_89 and newer); elsewhere (an older GPU, no device, a build without
// CUDA) the GPU trainer refuses them up front, naming what it found.
TEST(LlamaStage, Fp8GemmsOnlyWhereTheDeviceHasThem) {
  for (const char* text : {"mb1-fp8:tensorwise", "mb1-fp8:delayed@1"}) {
    const Layout l = Layout::parse(text);
    EXPECT_NO_THROW(check_trainable(l, DeviceKind::cpu)) << text;
    std::string here;
    if (kernels::fp8_gemm_available(kernels::Backend::cuda, &here))
      EXPECT_NO_THROW(check_trainable(l, DeviceKind::gpu)) << text;
    else
      WEFT_EXPECT_THROW_MSG(check_trainable(l, DeviceKind::gpu), LayoutError, "FP8 tensor cores",
                            "compute capability 8.9", here, "fp8:off");
  }
}

// bf16 gradients are the GPU trainer's (LlamaStage<bf16, bf16>); the CPU
// trainer computes and accumulates in fp32 and refuses them up front, and a
// stage whose gradient type is not the layout's is a bug caught before it
// allocates anything.
TEST(LlamaStage, Bf16GradientsOnlyOnTheGpu) {
  for (const char* text : {"mb1-grad:bf16", "tp2-pp2-dp2-mb1-sp-zero2-grad:bf16", "dp4-mb1-zero1-grad:bf16"}) {
    const Layout l = Layout::parse(text);
    EXPECT_NO_THROW(check_trainable(l, DeviceKind::gpu)) << text;
    WEFT_EXPECT_THROW_MSG(check_trainable(l, DeviceKind::cpu), LayoutError, "grad:bf16", "CPU trainer");
  }
  const ModelSpec m = small_model();
  memory::Arena arena;
  parallel::ProcessGroups groups = parallel::single_process_groups();
  WEFT_EXPECT_THROW_MSG(LlamaStage<float>(m, RunSpec{7, 4, Precision::fp32}, Layout::parse("mb1-grad:bf16"), 0,
                                          cpu(), arena, groups),
                        InternalError, "4-byte gradients", "grad:bf16");
  EXPECT_EQ(arena.in_use_total(), 0);
}

}  // namespace
}  // namespace weft::trainer
