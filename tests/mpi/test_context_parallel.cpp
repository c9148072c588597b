// Context parallelism's gradients, tensor by tensor, under mpirun (2 and 4
// ranks): a Llama stage whose sequence is split over every rank of the world
// (cp = world size), for each transport, against the same stage on one
// process computed on every rank. The batch's ignored targets (-100) sit
// mostly early in the sequences, so the cp ranks hold different numbers of
// valid tokens; the loss is normalised by the valid tokens of the whole
// batch, so every parameter's gradient, the loss and the gradient norm must
// equal the single-process ones (relative L2 within 1e-5 in fp32).
//
// Every rank runs the same collectives whatever its checks find (no ASSERT
// that could skip one).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/layout.h"
#include "core/model_spec.h"
#include "memory/arena.h"
#include "core/device_spec.h"
#include "memory/shapes.h"
#include "trainer/model/llama.h"
#include "trainer/model/params.h"
#include "trainer/parallel/comm_mpi.h"

namespace weft::trainer {
namespace {

constexpr int32_t kIgnore = -100;  // the cross-entropy kernel's default ignore_index

struct Batch {
  std::vector<int32_t> tokens, targets;  // (B, T)
  int64_t valid = 0;
};

// Random ids from a seed every rank shares; a target is ignored at 80% of the
// first quarter of each sequence's positions and 10% of the rest (cp rank 0
// holds the first chunk, so it sees fewer valid targets than the others).
Batch make_batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  for (int64_t s = 0; s < B; ++s)
    for (int64_t t = 0; t < T; ++t) {
      b.tokens.push_back(int32_t(rng() % uint64_t(V)));
      const bool ignored = double(rng() % 1000) / 1000.0 < (t < T / 4 ? 0.8 : 0.1);
      b.targets.push_back(ignored ? kIgnore : int32_t(rng() % uint64_t(V)));
      b.valid += ignored ? 0 : 1;
    }
  return b;
}

// This cp rank's rows: chunks r and 2 cp - 1 - r of each sequence.
std::vector<int32_t> local_rows(const std::vector<int32_t>& full, int64_t B, int64_t T, int64_t cp, int64_t r) {
  const int64_t c = T / (2 * cp);
  std::vector<int32_t> out;
  for (int64_t s = 0; s < B; ++s)
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t first = s * T + (k == 0 ? r : 2 * cp - 1 - r) * c;
      out.insert(out.end(), full.begin() + first, full.begin() + first + c);
    }
  return out;
}

struct Result {
  std::vector<float> grads;
  double loss = 0;
};

// One micro-batch forward and backward; gradients summed over the groups'
// dp x cp ranks by the stage's own final reduction.
Result run_stage(const ModelSpec& m, const RunSpec& run, const Layout& l, parallel::ProcessGroups& groups,
                 const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, double scale) {
  memory::Arena arena(memory::host_allocator());
  LlamaStage<float> stage(m, run, l, 0, device_preset("cpu"), arena, groups);
  stage.init_weights(20261125);
  stage.zero_grads();
  stage.forward(0, tokens.data(), targets.data(), scale);
  Result r;
  r.loss = stage.take_loss();
  stage.backward(0, 0, /*final=*/true);
  stage.finish_dp_reduction();
  groups.world->all_reduce(&r.loss, 1);
  r.grads.assign(stage.grads(), stage.grads() + stage.param_elements());
  return r;
}

double rel_l2(const float* a, const float* b, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    norm += double(b[i]) * double(b[i]);
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

TEST(ContextParallel, GradientsOfEveryTensorEqualOneRanksWithUnevenValidTokens) {
  const int64_t world = parallel::mpi_world_size();
  ModelSpec m = model_preset("tiny-test");  // V=96 C=32 F=80 H=4 H_kv=2 D=8
  m.layers = 2;
  const RunSpec run{16 * world, 2, Precision::fp32};  // T divisible by 2 cp
  const int64_t B = 2, T = run.seq;
  const Batch batch = make_batch(B, T, m.vocab, 1234 + uint64_t(world));
  const double scale = 1.0 / double(batch.valid);

  Layout one;
  one.mb = B;
  parallel::ProcessGroups single = parallel::single_process_groups();
  const Result ref = run_stage(m, run, one, single, batch.tokens, batch.targets, scale);
  double ref_norm = 0;
  for (float g : ref.grads) ref_norm += double(g) * g;

  for (const CpComm comm : {CpComm::ring, CpComm::allgather, CpComm::a2a}) {
    Layout l = one;
    l.cp = world;
    l.cp_comm = comm;
    SCOPED_TRACE(l.to_string());
    const bool a2a_fits = (m.heads % world == 0) && (m.kv_heads % world == 0);
    if (comm == CpComm::a2a && !a2a_fits) continue;  // the same on every rank
    EXPECT_TRUE(l.violations(m, run, world).empty());
    parallel::ProcessGroups groups = parallel::mpi_process_groups(l);
    const int64_t r = groups.cp_rank();
    const auto tok = local_rows(batch.tokens, B, T, world, r);
    const auto tgt = local_rows(batch.targets, B, T, world, r);
    // The ranks hold different numbers of valid targets.
    int64_t mine = 0;
    for (int32_t t : tgt) mine += t != kIgnore;
    int64_t lo = -mine, hi = mine;  // the fewest as minus the most of the negated counts
    groups.world->all_reduce(&lo, 1, parallel::ReduceOp::max);
    groups.world->all_reduce(&hi, 1, parallel::ReduceOp::max);
    EXPECT_LT(-lo, hi);

    const Result got = run_stage(m, run, l, groups, tok, tgt, scale);
    EXPECT_NEAR(got.loss * scale, ref.loss * scale, 1e-5 * std::fabs(ref.loss * scale));
    EXPECT_EQ(got.grads.size(), ref.grads.size());
    double norm = 0;
    for (float g : got.grads) norm += double(g) * g;
    EXPECT_NEAR(std::sqrt(norm), std::sqrt(ref_norm), 1e-5 * std::sqrt(ref_norm));
    // Tensor by tensor: the parameter specs are the same under both layouts.
    const StageParams specs = stage_params(m, l, memory::stage_plan(m, run, l, 0), 0);
    for (const auto& p : specs.specs) {
      if (got.grads.size() != ref.grads.size()) break;
      const double err = rel_l2(got.grads.data() + p.offset, ref.grads.data() + p.offset, p.local_elements());
      EXPECT_LE(err, 1e-5) << p.name;
    }
  }
}

}  // namespace
}  // namespace weft::trainer
