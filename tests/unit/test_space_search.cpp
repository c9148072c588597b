// The search with bounds (tuner/space_bounds.h) and the bounded-memory scan
// (tuner/space_scan.h) against evaluate() over whole spaces.
#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "core/error.h"
#include "memory/shapes.h"
#include "report/report.h"
#include "tuner/space.h"
#include "tuner/space_bounds.h"
#include "tuner/space_scan.h"

namespace weft::tuner {
namespace {

namespace search_test {

struct Case {
  const char* model;
  const char* gpu;
  int64_t gpus, seq, batch, top;
  SpaceLimits limits;
  DeviceKind device = DeviceKind::gpu;
  double moe_imbalance = 0;  // MoE models: --moe-imbalance
};

// What a report lists: its rows (evaluate()'s are the whole space, in order).
void expect_same_rows(const SpaceReport& ex, const SpaceReport& se, int64_t top, const std::string& what) {
  const size_t rows = size_t(std::min<int64_t>(top, int64_t(ex.candidates.size())));
  ASSERT_GE(se.candidates.size(), rows) << what;
  for (size_t i = 0; i < rows; ++i) {
    const Candidate& a = ex.candidates[i];
    const Candidate& b = se.candidates[i];
    EXPECT_EQ(a.layout.to_string(), b.layout.to_string()) << what << " row " << i;
    EXPECT_EQ(a.verdict, b.verdict) << what << " row " << i;
    EXPECT_EQ(a.reason, b.reason) << what << " row " << i;
    EXPECT_EQ(a.cost.step, b.cost.step) << what << " row " << i;
    if (a.verdict != Verdict::invalid) { EXPECT_EQ(a.memory.peak(), b.memory.peak()) << what << " row " << i; }
  }
}

}  // namespace search_test

// The search lists exactly the rows evaluate() ranks first, whatever fits:
// many layouts, fewer than the rows, none (then the nearest follows), or
// none valid; with tied embeddings, on a CPU, and under context parallelism.
// Its counts cover the space, and the rules' counts are evaluate()'s.
TEST(SpaceSearch, ListsTheExhaustiveRows) {
  using search_test::Case;
  std::vector<Case> cases;
  {
    Case c{"llama-13b", "a100-80gb", 32, 2048, 512, 10, {}};
    c.limits.mb = {1, 2, 4};
    cases.push_back(c);
    c.top = 40;
    cases.push_back(c);
  }
  cases.push_back({"llama-65b", "a100-40gb", 8, 2048, 8, 4, {}});  // nothing fits
  {
    Case c{"llama-13b", "a100-40gb", 8, 2048, 2048, 6, {}};  // fewer than the rows fit
    c.limits.tp = {8};
    c.limits.mb = {4};
    c.limits.ckpt = {Checkpointing::none};
    c.limits.zero = {0};
    c.limits.sp = {true};
    c.limits.grad = {GradPrecision::fp32};
    cases.push_back(c);
  }
  {
    Case c{"tiny-test", "cpu", 8, 256, 64, 12, {}, DeviceKind::cpu};
    cases.push_back(c);
    c.limits.attention = {AttentionKind::cudnn, AttentionKind::flash};  // cudnn pinned on a CPU
    cases.push_back(c);
  }
  {
    // The even split only: uneven ones have a case of their own below, and
    // would multiply this space's pipelined shapes by three.
    Case c{"llama3.1-8b", "h100", 64, 32768, 64, 10, {}};
    c.limits.split = {{}};
    cases.push_back(c);
  }
  {
    // Uneven splits searched (the 128k table weighs 2.4 blocks), and L + 2
    // over vpp where pp does not divide L.
    Case c{"llama3.1-8b", "h100", 16, 8192, 32, 10, {}};
    c.limits.mb = {1};
    c.limits.fp8 = {{Fp8Recipe::off, 0}};
    cases.push_back(c);
  }
  cases.push_back({"llama3.2-1b", "h100", 16, 4096, 64, 10, {}});  // tied embeddings over stages
  {
    Case c{"llama-13b", "a100-80gb", 32, 2048, 512, 5, {}};  // none valid: 40 heads over cp 16 by a2a
    c.limits.tp = {1};
    c.limits.cp = {16};
    c.limits.cp_comm = {CpComm::a2a};
    cases.push_back(c);
  }
  {
    // FP8 pinned: every recipe, bf16 end blocks over pipeline stages; and on
    // an A100, where every FP8 layout breaks the device's rule first.
    Case c{"llama3.1-8b", "h100", 32, 8192, 64, 10, {}};
    c.limits.fp8 = {{Fp8Recipe::off, 0}, {Fp8Recipe::tensorwise, 0}, {Fp8Recipe::delayed, 2}};
    c.limits.mb = {1, 2};
    c.limits.split = {{}};
    cases.push_back(c);
    c.gpu = "a100-80gb";
    c.limits.fp8 = {{Fp8Recipe::tensorwise, 1}, {Fp8Recipe::off, 0}};
    cases.push_back(c);
    c.limits.fp8 = {{Fp8Recipe::tensorwise, 1}};
    c.top = 3;
    cases.push_back(c);
  }
  {
    // Tensors past 64-bit sizes at the larger micro-batch (its attention
    // scores): those shapes are counted under "size" as evaluate() counts
    // them, before any bound (the memory bound, which builds the tables,
    // is taken only for the shapes visited).
    Case c{"llama3.1-8b", "h100", 8, 1048576, 8192, 5, {}};
    c.limits.tp = {1, 8};
    c.limits.cp = {1};
    c.limits.pp = {1};
    c.limits.mb = {1, 8192};
    cases.push_back(c);
  }
  {
    // An MoE model's listed capacity factors, each a space of its own,
    // merged: at imbalance 1.5 the factor caps the busiest ep rank.
    Case c{"mixtral-8x7b", "h100", 64, 4096, 256, 12, {}};
    c.limits.ep = {8};
    c.limits.mb = {1};
    c.limits.capacity = {0.0, 1.25};
    c.moe_imbalance = 1.5;
    cases.push_back(c);
    c.top = 3;
    c.limits.capacity = {1.0, 0.0};
    cases.push_back(c);
  }
  {
    // An MoE model's FP8 layouts, pinned (not searched unless asked): each
    // FP8 shape's rules and memory bound are its bf16 twin's (search_one);
    // delayed follows tensorwise, so it is bounded on its own. On an A100
    // every FP8 layout breaks the device's rule.
    Case c{"mixtral-8x7b", "h100", 64, 4096, 256, 10, {}};
    c.limits.ep = {8};
    c.limits.mb = {1};
    c.limits.fp8 = {{Fp8Recipe::off, 0}, {Fp8Recipe::tensorwise, 0}, {Fp8Recipe::delayed, 0}};
    cases.push_back(c);
    c.gpu = "a100-80gb";
    c.limits.fp8 = {{Fp8Recipe::off, 0}, {Fp8Recipe::tensorwise, 0}};
    cases.push_back(c);
  }
  for (const auto& c : cases) {
    SpaceContext ctx;
    ctx.model = model_preset(c.model);
    ctx.model.moe.imbalance = c.moe_imbalance;
    ctx.run = RunSpec{c.seq, c.batch, c.device == DeviceKind::cpu ? Precision::fp32 : Precision::bf16};
    ctx.cluster = cluster_resolve(c.gpu, c.gpus, c.device == DeviceKind::cpu ? c.gpus : 8);
    ctx.constants = cost_defaults(ctx.cluster.device);
    const std::string what = fmt::format("{} on {} x {}, seq {}, top {}", c.model, c.gpus, c.gpu, c.seq, c.top);
    // The device as the CLI passes it: FP8 searched on the H100s.
    const auto all = enumerate(ctx.model, ctx.run, c.gpus, c.limits, ctx.cluster.device);
    const auto ex = evaluate(ctx.model, ctx.run, ctx.cluster, all, ctx.constants, ctx.memory, ctx.tie);
    const auto se = search(ctx, c.limits, c.top, ctx.cluster.device);
    search_test::expect_same_rows(ex, se, c.top, what);
    EXPECT_FALSE(se.exhaustive);
    EXPECT_EQ(se.evaluated, ex.evaluated) << what;
    EXPECT_LE(se.visited, se.evaluated) << what;
    EXPECT_LE(se.fitting, ex.fitting) << what;
    if (ex.fitting < c.top) { EXPECT_EQ(se.fitting, ex.fitting) << what; }
    int64_t counted = se.fitting;
    for (const auto& [why, n] : se.pruned) {
      counted += n;
      EXPECT_GT(n, 0) << what << ": " << why;
      if (why.rfind("invalid: ", 0) == 0 || why == "size") {
        EXPECT_EQ(n, ex.pruned.count(why) ? ex.pruned.at(why) : 0) << what << ": " << why;
      }
    }
    EXPECT_EQ(counted, se.evaluated) << what;
    for (const auto& [why, n] : ex.pruned)  // and none of evaluate()'s rules or sizes missed
      if (why.rfind("invalid: ", 0) == 0 || why == "size") {
        EXPECT_EQ(se.pruned.count(why) ? se.pruned.at(why) : 0, n) << what << ": " << why;
      }
    // When nothing fits, the layout nearest to fitting follows the rows.
    if (ex.fitting == 0 && ex.pruned.size() > 0) {
      const Candidate* near_ex = nullptr;
      for (const auto& x : ex.candidates)
        if (x.verdict == Verdict::out_of_memory && (!near_ex || x.memory.peak() < near_ex->memory.peak())) near_ex = &x;
      const Candidate* near_se = nullptr;
      for (const auto& x : se.candidates)
        if (x.verdict == Verdict::out_of_memory && (!near_se || x.memory.peak() < near_se->memory.peak())) near_se = &x;
      ASSERT_EQ(near_ex == nullptr, near_se == nullptr) << what;
      if (near_ex) { EXPECT_EQ(near_ex->layout, near_se->layout) << what; }
    }
  }
}

// A model on a cluster, and the FP8 recipes pinned (none: FP8 searched
// where the device has it).
struct Where {
  const char* model;
  const char* gpu;
  int64_t gpus, seq, batch;
  DeviceKind device;
  std::vector<std::pair<Fp8Recipe, int64_t>> fp8 = {};
};

SpaceContext context_of(const Where& w) {
  SpaceContext ctx;
  ctx.model = model_preset(w.model);
  ctx.run = RunSpec{w.seq, w.batch, w.device == DeviceKind::cpu ? Precision::fp32 : Precision::bf16};
  ctx.cluster = cluster_resolve(w.gpu, w.gpus, w.device == DeviceKind::cpu ? w.gpus : 8);
  ctx.constants = cost_defaults(ctx.cluster.device);
  return ctx;
}

TEST(SpaceSearch, BoundsNeverExceedTheLayouts) {
  for (const Where& w : {Where{"llama-13b", "a100-80gb", 32, 2048, 512, DeviceKind::gpu},
                         Where{"tiny-test", "cpu", 8, 256, 64, DeviceKind::cpu},
                         Where{"llama3.1-8b", "h100", 16, 32768, 16, DeviceKind::gpu},
                         Where{"llama3.2-1b", "h100", 16, 4096, 64, DeviceKind::gpu},
                         // bf16 end blocks make the first and last stage differ.
                         Where{"llama3.1-8b", "h100", 16, 8192, 32, DeviceKind::gpu,
                               {{Fp8Recipe::delayed, 3}, {Fp8Recipe::tensorwise, 1}}},
                         // FP8 emulated on the CPU, pinned.
                         Where{"tiny-test", "cpu", 8, 256, 64, DeviceKind::cpu, {{Fp8Recipe::tensorwise, 1}}}}) {
    const SpaceContext ctx = context_of(w);
    SpaceLimits lim;
    lim.mb = {1, 2};
    lim.fp8 = w.fp8;
    const auto subs = enumerate_subspaces(ctx.model, ctx.run, w.gpus, lim, ctx.cluster.device);
    int64_t checked = 0;
    for (size_t s = 0; s < subs.size(); s += 3) {
      const Subspace& sub = subs[s];
      const auto steps = step_bounds(ctx.model, ctx.run, sub.shape, ctx.cluster, ctx.constants, sub.ckpts,
                                     sub.attentions, sub.norms, sub.zeros, sub.grads);
      MemoryBounds memory(ctx, sub);
      // The shape's bound over the attention kinds some valid layout has,
      // and asked whether it lies past a value: the same answer, for values
      // around it too.
      std::vector<size_t> valid_attentions;
      for (int64_t i = 0; i < sub.size(); ++i) {
        const size_t a = member_of(sub, i).a;
        if (sub.at(i).violations(ctx.model, ctx.run, w.gpus).empty() &&
            std::find(valid_attentions.begin(), valid_attentions.end(), a) == valid_attentions.end())
          valid_attentions.push_back(a);
      }
      std::sort(valid_attentions.begin(), valid_attentions.end());
      int64_t shape_bound = 0;
      if (!valid_attentions.empty()) {
        try {
          shape_bound = memory_lower_bound(ctx, sub, valid_attentions);
        } catch (const InputError&) {
          continue;  // (sizes past 64 bits)
        }
        // (In both orders of the kinds: the least need not come first.)
        std::vector<size_t> reversed(valid_attentions.rbegin(), valid_attentions.rend());
        EXPECT_EQ(memory_lower_bound(ctx, sub, reversed), shape_bound) << sub.shape.to_string();
        for (const auto* kinds : {&valid_attentions, &reversed})
          for (const int64_t past : {int64_t{0}, shape_bound / 2, shape_bound - 1, shape_bound, shape_bound + 1,
                                     int64_t(ctx.cluster.device.memory_bytes)}) {
            const int64_t asked = memory_lower_bound(ctx, sub, *kinds, past);
            EXPECT_EQ(asked > past, shape_bound > past) << sub.shape.to_string() << " past " << past;
            if (asked > past) { EXPECT_LE(asked, shape_bound) << sub.shape.to_string() << " past " << past; }
          }
      }
      for (int64_t i = 0; i < sub.size(); ++i) {
        const Layout l = sub.at(i);
        if (!l.violations(ctx.model, ctx.run, w.gpus).empty()) continue;
        const Member x = member_of(sub, i);
        const auto est = memory::estimate(ctx.model, ctx.run, l, ctx.cluster.device, ctx.memory);
        EXPECT_LE(shape_bound, est.peak()) << l.to_string();
        const int64_t bound = memory.of(x);
        EXPECT_LE(bound, est.peak()) << l.to_string();
        for (const int64_t past : {int64_t{0}, bound - 1, bound}) {
          const int64_t asked = memory.of(x, past);
          EXPECT_EQ(asked > past, bound > past) << l.to_string() << " past " << past;
          EXPECT_LE(asked, bound) << l.to_string() << " past " << past;
        }
        EXPECT_LE(steps.of(x.c, x.a, x.n, x.z, x.g), predict(ctx.model, ctx.run, l, ctx.cluster, ctx.constants).step)
            << l.to_string();
        ++checked;
      }
    }
    EXPECT_GT(checked, 100) << w.model;
    if (!w.fp8.empty() || ctx.cluster.device.has_fp8()) {
      bool fp8_seen = false;
      for (const auto& sub : subs) fp8_seen = fp8_seen || sub.shape.fp8 != Fp8Recipe::off;
      EXPECT_TRUE(fp8_seen) << w.model << " on " << w.gpu;
    }
  }
}

// The memory bounds take a stage's table in two parts (memory/shapes.h):
// the entries after the state, which must be the whole table's after its
// state entries, name for name and byte for byte, and the state's bytes,
// which must be every weights, grads and optimizer entry of the whole table
// (FP8's weight copies and scaling state among them). Over the layouts of
// dense, tied, LoRA and MoE spaces with every FP8 recipe, ZeRO stage,
// expert grid and gradient type, on a GPU and a CPU, each stage.
TEST(MemoryBounds, StateBytesAreTheTables) {
  using memory::Category;
  struct Case {
    Where where;
    int64_t lora_rank = 0;
  };
  const std::vector<std::pair<Fp8Recipe, int64_t>> recipes = {
      {Fp8Recipe::off, 0}, {Fp8Recipe::tensorwise, 0}, {Fp8Recipe::delayed, 1}, {Fp8Recipe::blockwise, 0}};
  int64_t checked = 0, fp8_state = 0, moe = 0;
  for (const Case& c : {Case{Where{"tiny-moe", "h100", 8, 256, 32, DeviceKind::gpu, recipes}},
                        Case{Where{"tiny-moe", "cpu", 4, 128, 16, DeviceKind::cpu, recipes}},
                        Case{Where{"tiny-tied", "h100", 8, 256, 32, DeviceKind::gpu, recipes}},
                        Case{Where{"tiny", "h100", 8, 256, 32, DeviceKind::gpu, recipes}, 8},
                        Case{Where{"tiny-test", "cpu", 8, 256, 64, DeviceKind::cpu, recipes}}}) {
    SpaceContext ctx = context_of(c.where);
    if (c.lora_rank > 0) ctx.run.lora = LoraSpec::with_rank(c.lora_rank);
    SpaceLimits lim;
    lim.mb = {1, 2};
    lim.fp8 = c.where.fp8;
    const auto subs = enumerate_subspaces(ctx.model, ctx.run, c.where.gpus, lim, ctx.cluster.device);
    for (size_t s = 0; s < subs.size(); s += 5) {
      const Subspace& sub = subs[s];
      for (int64_t i = int64_t(s) % 7; i < sub.size(); i += 7) {
        const Layout l = sub.at(i);
        if (!l.violations(ctx.model, ctx.run, c.where.gpus).empty()) continue;
        for (const int64_t stage : {int64_t{0}, l.pp - 1}) {
          const memory::StagePlan plan = memory::stage_plan(ctx.model, ctx.run, l, stage);
          std::vector<memory::TensorShape> whole, other;
          try {
            memory::stage_shapes(ctx.model, ctx.run, l, ctx.cluster.device, plan, whole);
          } catch (const InputError&) {
            continue;  // (an FP8 layout with no GEMM in FP8, refused by the table)
          }
          memory::stage_other_shapes(ctx.model, ctx.run, l, ctx.cluster.device, plan, other);
          ASSERT_LE(other.size(), whole.size()) << l.to_string();
          const size_t state = whole.size() - other.size();
          int64_t state_bytes = 0;
          for (size_t k = 0; k < whole.size(); ++k) {
            const memory::TensorShape& t = whole[k];
            const bool is_state =
                t.category == Category::weights || t.category == Category::grads || t.category == Category::optimizer;
            if (is_state) state_bytes += t.bytes();
            if (k < state) {
              EXPECT_TRUE(is_state) << l.to_string() << " " << t.name;
              continue;
            }
            const memory::TensorShape& o = other[k - state];
            EXPECT_STREQ(o.name, t.name) << l.to_string();
            EXPECT_EQ(o.bytes(), t.bytes()) << l.to_string() << " " << t.name;
            EXPECT_EQ(o.category, t.category) << l.to_string() << " " << t.name;
            if (is_state) ++fp8_state;
          }
          EXPECT_EQ(memory::stage_state_bytes(ctx.model, ctx.run, l, ctx.cluster.device, plan), state_bytes)
              << l.to_string() << " stage " << stage;
          ++checked;
          moe += l.ep > 1;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(fp8_state, 100);  // FP8's state entries past the first part were met
  EXPECT_GT(moe, 100);
}

// One cache shared by every shape of a space, in the search's order, gives
// each shape exactly the bounds it gets alone: the shapes differ in pp, dp,
// vpp, the split and the FP8 recipe's edge blocks, which block costs must
// not depend on (or the cache's key must hold them), and in all but tp, cp,
// mb, sp and the norm, which the embedding's and head's costs must not.
TEST(SpaceSearch, BlockCostCacheChangesNoBound) {
  for (const Where& w : {Where{"llama3.1-8b", "h100", 64, 8192, 64, DeviceKind::gpu},
                         Where{"llama3.1-8b", "h100", 32, 8192, 32, DeviceKind::gpu,
                               {{Fp8Recipe::delayed, 3}, {Fp8Recipe::blockwise, 0}}},
                         Where{"tiny-test", "cpu", 8, 256, 64, DeviceKind::cpu, {{Fp8Recipe::tensorwise, 1}}},
                         // (expert grids and dispatchers too)
                         Where{"tiny-moe", "h100", 16, 256, 64, DeviceKind::gpu},
                         // (the CPU's emulated FP8 in MoE blocks reduces its scales over dp)
                         Where{"tiny-moe", "cpu", 8, 256, 32, DeviceKind::cpu,
                               {{Fp8Recipe::tensorwise, 0}, {Fp8Recipe::blockwise, 0}}}}) {
    const SpaceContext ctx = context_of(w);
    SpaceLimits lim;
    lim.fp8 = w.fp8;
    const auto subs = enumerate_subspaces(ctx.model, ctx.run, w.gpus, lim, ctx.cluster.device);
    BlockCostCache cache;
    std::set<std::tuple<int64_t, int64_t, int64_t>> pp_dp_vpp;
    for (const Subspace& sub : subs) {
      const auto alone = step_bounds(ctx.model, ctx.run, sub.shape, ctx.cluster, ctx.constants, sub.ckpts,
                                     sub.attentions, sub.norms, sub.zeros, sub.grads);
      const auto shared = step_bounds(ctx.model, ctx.run, sub.shape, ctx.cluster, ctx.constants, sub.ckpts,
                                      sub.attentions, sub.norms, sub.zeros, sub.grads, &cache);
      ASSERT_EQ(alone.kernels, shared.kernels) << sub.shape.to_string();
      ASSERT_EQ(alone.sharding, shared.sharding) << sub.shape.to_string();
      pp_dp_vpp.insert({sub.shape.pp, sub.shape.dp, sub.shape.vpp});
    }
    EXPECT_GT(pp_dp_vpp.size(), 4u) << w.model;  // shapes that share blocks across these knobs were compared
  }
}

// The search predicts a sliver of a large space: Llama 3.1 8B at 128k
// tokens on 64 H100s (the full product of the knobs is over a million).
TEST(SpaceSearch, VisitsFewOfALargeSpace) {
  SpaceContext ctx;
  ctx.model = model_preset("llama3.1-8b");
  ctx.run = RunSpec{131072, 64, Precision::bf16};
  ctx.cluster = cluster_resolve("h100", 64, 8);
  ctx.constants = cost_defaults(ctx.cluster.device);
  const auto r = search(ctx, {}, 10);
  EXPECT_GT(r.evaluated, 1'000'000);
  EXPECT_LT(r.visited * 50, r.evaluated) << r.visited << " of " << r.evaluated;
  ASSERT_GT(r.fitting, 0);
  // The best splits the sequence, and among the layouts within 1% of the
  // fastest (ties the model cannot tell apart; the ranking orders them by
  // memory) one splits it at least 8 ways, by cp and sequence-parallel tp
  // (NeMo's llama3_8b_128k recipe splits it 32 ways: tp4 with sp, cp8; the
  // model's fastest 4-way and 8-way splits are 0.1% apart).
  EXPECT_GE(r.candidates.front().layout.cp, 2) << r.candidates.front().layout.to_string();
  double fastest = r.candidates.front().cost.step;
  for (const auto& c : r.candidates)
    if (c.verdict == Verdict::fits) fastest = std::min(fastest, c.cost.step);
  int64_t widest = 0;
  for (const auto& c : r.candidates)
    if (c.verdict == Verdict::fits && c.cost.step <= 1.01 * fastest)
      widest = std::max(widest, c.layout.cp * (c.layout.sp ? c.layout.tp : 1));
  EXPECT_GE(widest, 8);
}

// LoRA on Llama 3.1 70B at T = 4096 on 8 H100s: the frozen base (bf16, whole
// on every dp rank) with adapters alone trainable fits, recomputing less
// than full fine-tuning, which fits on no layout of 8 GPUs and first fits on
// 16 with every block recomputed. (Not the ZeRO stage: at dp 1 the stages
// cost the same, and the tie goes to the least memory.) The search, which prunes with bounds, finds the same best LoRA layout
// as predicting every layout.
TEST(SpaceSearch, LoraFitsWhereFullFineTuningDoesNot) {
  SpaceContext ctx;
  ctx.model = model_preset("llama3.1-70b");
  ctx.run = RunSpec{.seq = 4096, .global_batch = 64, .precision = Precision::bf16, .lora = LoraSpec::with_rank(16)};
  ctx.cluster = cluster_resolve("h100", 8, 8);
  ctx.constants = cost_defaults(ctx.cluster.device);
  SpaceLimits limits;
  limits.fp8 = {{Fp8Recipe::off, 0}};
  const auto lora = search(ctx, limits, 1);
  ASSERT_GT(lora.fitting, 0);
  const Layout best = lora.candidates.front().layout;
  const auto all = evaluate(ctx.model, ctx.run, ctx.cluster,
                            enumerate(ctx.model, ctx.run, 8, limits, ctx.cluster.device), ctx.constants, ctx.memory);
  EXPECT_EQ(all.candidates.front().layout.to_string(), best.to_string());
  SpaceContext full = ctx;
  full.run.lora = {};
  EXPECT_EQ(search(full, limits, 1).fitting, 0);
  full.cluster = cluster_resolve("h100", 16, 8);
  const auto sixteen = search(full, limits, 1);
  ASSERT_GT(sixteen.fitting, 0);
  const Layout f = sixteen.candidates.front().layout;
  // (Full checkpointing with the even split; a split one layer lighter on
  // the first stage frees it enough for ffn's.)
  EXPECT_NE(f.ckpt, Checkpointing::none) << f.to_string();
  EXPECT_LT(int(best.ckpt), int(f.ckpt)) << best.to_string() << " against " << f.to_string();
  std::printf("LoRA r16 on 8 H100: %s; full fine-tuning on 16: %s\n", best.to_string().c_str(), f.to_string().c_str());
}

// The bounded-memory ranking of a whole space (what --all and --exhaustive
// use past the rows held in memory) lists the same layouts in the same order
// with the same numbers as evaluate(), and counts the same prunes.
TEST(SpaceScan, RanksAsEvaluateDoes) {
  for (const auto& [model, gpu, gpus, seq] : std::vector<std::tuple<std::string, std::string, int64_t, int64_t>>{
           {"llama-13b", "a100-80gb", 8, 2048}, {"llama3.1-8b", "h100", 4, 8192}, {"tiny", "h100", 4, 256}}) {
    SpaceContext ctx;
    ctx.model = model_preset(model);
    ctx.run = RunSpec{seq, 64, Precision::bf16};
    ctx.cluster = cluster_resolve(gpu, gpus, 8);
    ctx.constants = cost_defaults(ctx.cluster.device);
    SpaceLimits limits;
    limits.mb = {1, 2};
    const SpaceReport whole = evaluate(ctx.model, ctx.run, ctx.cluster,
                                       enumerate(ctx.model, ctx.run, gpus, limits, ctx.cluster.device), ctx.constants,
                                       ctx.memory);
    const SpaceScan scan = space_scan(ctx, limits, ctx.cluster.device);
    const std::string what = fmt::format("{} on {} x {}", model, gpus, gpu);
    ASSERT_EQ(scan.size(), int64_t(whole.candidates.size())) << what;
    EXPECT_EQ(space_size(ctx, limits, ctx.cluster.device), scan.size()) << what;
    EXPECT_EQ(scan.summary.fitting, whole.fitting) << what;
    EXPECT_EQ(scan.summary.pruned, whole.pruned) << what;
    EXPECT_GT(whole.fitting, 0) << what;
    for (int64_t i = 0; i < scan.size(); ++i) {
      const Candidate c = scan.candidate(ctx, i);
      const Candidate& w = whole.candidates[size_t(i)];
      ASSERT_EQ(c.layout.to_string(), w.layout.to_string()) << what << " row " << i;
      ASSERT_EQ(c.verdict, w.verdict) << what << " row " << i;
      if (c.verdict == Verdict::invalid) continue;  // no prediction
      ASSERT_EQ(c.cost.step, w.cost.step) << what << " row " << i;
      ASSERT_EQ(c.memory.peak(), w.memory.peak()) << what << " row " << i;
    }
  }
}

}  // namespace
}  // namespace weft::tuner
