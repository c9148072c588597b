// The dense split of expert parallelism under ZeRO (memory/dense_split.h):
// every dense element of a shard is kept by exactly one replica, every
// expert element by all of them; the replicas' parts of any dense run are
// contiguous and in order; and the memory model's optimizer state is the
// largest part any rank keeps, with the trainer's expert positions.
#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memory/dense_split.h"
#include "memory/shapes.h"
#include "test_util.h"

namespace weft::memory {
namespace {

uint32_t seed() {
  if (const char* s = std::getenv("WEFT_TEST_SEED")) return uint32_t(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

// Element i of [lo, hi): an expert position, or the replica keeping it.
std::vector<int64_t> keepers(const std::vector<FlatRange>& experts, int64_t lo, int64_t hi, int64_t replicas) {
  constexpr int64_t kExpert = -1, kNobody = -2;
  std::vector<int64_t> k(size_t(hi - lo), kNobody);
  for (const auto& r : experts)
    for (int64_t x = std::max(r.begin, lo); x < std::min(r.end, hi); ++x) k[size_t(x - lo)] = kExpert;
  for (int64_t r = 0; r < replicas; ++r) {
    const DenseSplit s(lo, hi, experts, replicas, r);
    int64_t n = 0;
    for (const auto& o : s.owned()) {
      EXPECT_LT(o.begin, o.end);
      n += o.end - o.begin;
      for (int64_t x = o.begin; x < o.end; ++x) {
        int64_t& who = k[size_t(x - lo)];
        if (who == kExpert) continue;
        EXPECT_EQ(who, kNobody) << "element " << x << " kept twice";
        who = r;
      }
    }
    EXPECT_EQ(n, s.owned_elements());
  }
  return k;
}

TEST(DenseSplit, EveryDenseElementOnceEveryExpertElementByAll) {
  const uint32_t sd = seed();
  SCOPED_TRACE(fmt::format("seed {} (replay: WEFT_TEST_SEED={})", sd, sd));
  std::mt19937 rng(sd);
  auto draw = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 200; ++trial) {
    // Alternating dense and expert runs of random lengths, some shard of them.
    std::vector<FlatRange> experts;
    int64_t at = draw(0, 40);
    for (int64_t i = 0, n = draw(0, 6); i < n; ++i) {
      const int64_t len = draw(1, 50);
      experts.push_back({at, at + len});
      at += len + draw(1, 40);
    }
    const int64_t psi = at, replicas = draw(1, 8);
    const int64_t lo = draw(0, psi), hi = draw(lo, psi);
    const auto k = keepers(experts, lo, hi, replicas);
    std::vector<int64_t> kept(size_t(replicas), 0);
    for (int64_t who : k) {
      ASSERT_NE(who, -2) << "a dense element nobody keeps";
      if (who >= 0) ++kept[size_t(who)];
    }
    // The dense elements are split in flat order, the earlier replicas full.
    const DenseSplit any(lo, hi, experts, replicas, 0);
    const int64_t part = (any.dense() + replicas - 1) / replicas;
    for (int64_t r = 0; r < replicas; ++r)
      EXPECT_EQ(kept[size_t(r)], std::clamp<int64_t>(any.dense() - r * part, 0, part));
    // Each dense run (and any piece of one): the replicas' counts in order,
    // this replica's at mine_at, where its owned elements are.
    for (int64_t r = 0; r < replicas; ++r) {
      const DenseSplit s(lo, hi, experts, replicas, r);
      const int64_t from = draw(lo, hi), to = draw(from, hi);
      s.for_each_dense(from, to - from, [&](int64_t offset, int64_t count) {
        const int64_t run = from + offset;
        for (int64_t x = run; x < run + count; ++x) ASSERT_GE(k[size_t(x - lo)], 0) << "an expert element in a dense run";
        std::vector<int64_t> counts;
        int64_t mine_at = 0;
        s.run_counts(run, count, counts, mine_at);
        ASSERT_EQ(int64_t(counts.size()), replicas);
        int64_t x = run;
        for (int64_t q = 0; q < replicas; ++q) {
          if (q == r) {
            EXPECT_EQ(x - run, mine_at);
          }
          for (int64_t i = 0; i < counts[size_t(q)]; ++i, ++x) EXPECT_EQ(k[size_t(x - lo)], q) << "element " << x;
        }
        EXPECT_EQ(x, run + count);
      });
    }
  }
}

// The trainer's flat order (params.cpp) has each MoE block's experts after
// its attention and router; the memory model's optimizer state is the most
// any (shard, replica) keeps.
TEST(DenseSplit, StateIsTheLargestPartOverShardsAndReplicas) {
  struct Case {
    const char* model;
    const char* layout;
    int64_t lora_rank;
    int64_t experts = 0;  // other than the preset's
  };
  for (const Case& c : {Case{"tiny-moe", "tp1-pp1-dp4-ep2-mb1-zero1", 0}, Case{"tiny-moe", "tp1-pp2-dp8-ep4-mb1-zero3", 0},
                        Case{"tiny-moe", "tp2-pp1-dp4-ep2-etp2-mb1-sp-zero2", 0},
                        Case{"tiny-moe", "tp1-pp1-dp4-ep2-mb1-zero1", 8},
                        Case{"qwen3-30b-a3b", "tp1-pp1-dp16-ep16-mb1-zero1", 0},
                        Case{"mixtral-8x7b", "tp2-pp4-dp8-ep8-mb1-sp-epfold-zero1", 0},
                        Case{"llama4-scout", "tp2-pp2-dp16-ep8-mb1-sp-zero1", 0},
                        Case{"llama4-scout", "tp1-cp2-pp4-dp32-ep8-mb1-vpp4-zero1", 0},
                        // Three replicas: dense parts that do not divide evenly.
                        Case{"tiny-moe", "tp1-pp1-dp3-ep3-mb1-zero1", 0, 6},
                        Case{"tiny-moe", "tp1-pp2-dp6-ep3-mb1-zero2", 4, 6}}) {
    SCOPED_TRACE(fmt::format("{} {} lora {}", c.model, c.layout, c.lora_rank));
    ModelSpec m = model_preset(c.model);
    if (c.experts > 0) m.moe.experts = c.experts;
    RunSpec run{256, 64, Precision::bf16};
    if (c.lora_rank > 0) run.lora = LoraSpec::with_rank(c.lora_rank);
    const Layout l = Layout::parse(c.layout);
    ASSERT_TRUE(dense_split(l));
    for (int64_t stage = 0; stage < l.pp; ++stage) {
      const StagePlan plan = stage_plan(m, run, l, stage);
      const int64_t psi = stage_param_elements(m, l, plan);
      std::vector<FlatRange> experts;
      stage_expert_ranges(m, l, plan, experts);
      ASSERT_EQ(int64_t(experts.size()), c.lora_rank > 0 && !run.lora.targets_linear(Linear::gate) &&
                                                 !run.lora.targets_linear(Linear::down)
                                             ? 0
                                             : plan.moe_layers);
      int64_t expert = 0;
      for (const auto& r : experts) {
        EXPECT_LE(r.end, psi);
        expert += r.end - r.begin;
      }
      if (c.lora_rank == 0) {
        EXPECT_EQ(expert, plan.moe_layers * 3 * (m.moe.experts / l.ep) * (m.moe.expert_intermediate / l.etp) * m.hidden);
      }
      const int64_t ways = l.zero_shards(), replicas = l.zero_replicas(), shard = (psi + ways - 1) / ways;
      std::vector<int64_t> counts;
      zero_shard_counts(l, psi, experts, counts);
      ASSERT_EQ(int64_t(counts.size()), ways);
      int64_t most = 0, total = 0, uneven = 0, hi = 0;
      for (int64_t s = 0; s < ways; ++s) {
        const int64_t lo = hi;
        hi += counts[size_t(s)];
        // ZeRO-2 and -3 cut equal shards (their gradients and weights are sharded too).
        if (l.zero >= 2) {
          EXPECT_EQ(counts[size_t(s)], std::max<int64_t>(0, std::min(psi, (s + 1) * shard) - s * shard));
        }
        for (int64_t r = 0; r < replicas; ++r) {
          const DenseSplit split(lo, hi, experts, replicas, r);
          most = std::max(most, split.owned_elements());
          total += split.owned_elements();
          if (r == 0 && split.dense() % replicas != 0) ++uneven;
        }
      }
      EXPECT_EQ(hi, psi);
      EXPECT_EQ(dense_split_state_elements(m, l, plan, psi), most);
      // ZeRO-1 balances the cuts: no rank keeps more than the mean by more
      // than an expert element's weight (rounding aside).
      if (l.zero == 1) {
        const int64_t weight = (psi - expert) + replicas * expert;
        EXPECT_LE(most, (weight + ways - 1) / ways / replicas + 2);
      }
      if (c.experts > 0) {
        EXPECT_GT(uneven, 0) << "a case meant to split unevenly";
      }
      // Over every rank: the dense elements once, the experts once per replica.
      EXPECT_EQ(total, psi - expert + replicas * expert);
      // Below the state without the split, and the optimizer's shapes use it.
      EXPECT_LT(most, shard);
      for (const auto& t : stage_shapes(m, run, l, device_preset("h100"), plan))
        if (std::string(t.name) == "optimizer.adam_m") {
          EXPECT_EQ(t.elements, most);
        }
    }
  }
}

// Without expert parallelism, ZeRO, or replicas there is no split.
TEST(DenseSplit, OnlyUnderExpertParallelismWithZeroAndReplicas) {
  EXPECT_FALSE(dense_split(Layout::parse("tp1-pp1-dp4-mb1-zero1")));
  EXPECT_FALSE(dense_split(Layout::parse("tp1-pp1-dp4-ep2-mb1")));
  EXPECT_TRUE(dense_split(Layout::parse("tp1-pp1-dp4-ep2-mb1-zero1")));
  EXPECT_TRUE(dense_split(Layout::parse("tp1-pp1-dp4-ep4-mb1-zero1")));  // one shard group: the whole stage
  EXPECT_FALSE(dense_split(Layout::parse("tp2-pp1-dp1-ep2-mb1-sp-epfold-zero1")));  // ep = tp: no replicas
}

}  // namespace
}  // namespace weft::memory
