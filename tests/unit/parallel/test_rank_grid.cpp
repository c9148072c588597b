// RankGrid: the pure map from (world, tp, cp, pp, dp, order) to groups,
// checked for worlds up to 4096 ranks over every factorization, with no MPI.
#include <algorithm>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/layout.h"
#include "test_util.h"
#include "trainer/parallel/rank_grid.h"

namespace weft::parallel {
namespace {

using Groups = std::vector<std::vector<int64_t>>;
constexpr Axis kAxes[] = {Axis::tp, Axis::cp, Axis::pp, Axis::dp};

std::vector<std::tuple<int64_t, int64_t, int64_t>> factorizations(int64_t world) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (int64_t tp = 1; tp <= world; ++tp) {
    if (world % tp) continue;
    for (int64_t pp = 1; pp <= world / tp; ++pp) {
      if ((world / tp) % pp) continue;
      out.emplace_back(tp, pp, world / tp / pp);
    }
  }
  return out;
}

// Every property of one grid; O(world) per axis so that 4096-rank worlds over
// all their factorizations stay fast.
void check_grid(const RankGrid& g) {
  const int64_t world = g.world();
  SCOPED_TRACE(::testing::Message()
               << "world " << world << " tp" << g.size(Axis::tp) << "-cp" << g.size(Axis::cp) << "-pp"
               << g.size(Axis::pp) << "-dp" << g.size(Axis::dp) << " order " << g.order().to_string());
  for (Axis a : kAxes) {
    const Groups groups = g.all_groups(a);
    ASSERT_EQ(int64_t(groups.size()), world / g.size(a)) << to_string(a);
    // The groups partition the world: each rank exactly once.
    std::vector<int> seen(size_t(world), 0);
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      ASSERT_EQ(int64_t(groups[gi].size()), g.size(a)) << to_string(a) << " group " << gi;
      for (size_t i = 0; i < groups[gi].size(); ++i) {
        const int64_t r = groups[gi][i];
        ASSERT_TRUE(r >= 0 && r < world);
        ++seen[size_t(r)];
        // Group rank = coordinate on the axis; the group is the rank's own.
        ASSERT_EQ(g.coords(r)[a], int64_t(i));
        ASSERT_EQ(g.group_index(a, r), int64_t(gi));
        if (i > 0) {
          ASSERT_GT(r, groups[gi][i - 1]) << "members ascend";
        }
      }
    }
    for (int64_t r = 0; r < world; ++r)
      ASSERT_EQ(seen[size_t(r)], 1) << to_string(a) << " rank " << r;
  }
  for (int64_t r = 0; r < world; ++r) {
    const RankCoords c = g.coords(r);
    ASSERT_EQ(g.rank_of(c), r);
    // Members of one group agree on the other two coordinates.
    for (Axis a : kAxes) {
      const int64_t next = g.shift(a, r, 1);
      const int64_t prev = g.shift(a, r, -1);
      const RankCoords cn = g.coords(next), cp = g.coords(prev);
      ASSERT_EQ(cn[a], (c[a] + 1) % g.size(a));
      ASSERT_EQ(cp[a], (c[a] + g.size(a) - 1) % g.size(a));
      for (Axis b : kAxes) {
        if (b == a) continue;
        ASSERT_EQ(cn[b], c[b]);
        ASSERT_EQ(cp[b], c[b]);
      }
      ASSERT_EQ(g.group_index(a, next), g.group_index(a, r));
    }
    // The gradient group: every (cp, dp) pair of the rank's (tp, pp), cp fastest.
    const auto dpcp = g.dpcp_group(r);
    ASSERT_EQ(int64_t(dpcp.size()), g.size(Axis::cp) * g.size(Axis::dp));
    for (size_t i = 0; i < dpcp.size(); ++i) {
      const RankCoords m = g.coords(dpcp[i]);
      ASSERT_EQ(m.tp, c.tp);
      ASSERT_EQ(m.pp, c.pp);
      ASSERT_EQ(m.cp + g.size(Axis::cp) * m.dp, int64_t(i));
      ASSERT_EQ(g.dpcp_group_index(dpcp[i]), g.dpcp_group_index(r));
    }
    ASSERT_LT(g.dpcp_group_index(r), g.size(Axis::tp) * g.size(Axis::pp));
  }
}

TEST(RankGrid, MegatronExampleSixteenRanks) {
  // Megatron's documented example: 16 ranks, tp 2, pp 4, so dp 2.
  const RankGrid g(16, 2, 4, 2);
  EXPECT_EQ(g.all_groups(Axis::tp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.all_groups(Axis::dp),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.all_groups(Axis::pp),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(g.coords(13), (RankCoords{.tp = 1, .pp = 3, .dp = 0}));
  EXPECT_EQ(g.order().to_string(), "tp-cp-dp-pp");
}

// Context parallelism: cp sits between tp and dp in the numbering, and the
// grids of every (tp, cp, pp, dp) of some worlds partition them.
TEST(RankGrid, ContextParallelGridsPartitionToo) {
  int64_t grids = 0;
  for (int64_t world : {4, 8, 12, 16, 48, 96}) {
    for (auto [tp, pp, rest] : factorizations(world))
      for (int64_t cp = 1; cp <= rest; ++cp) {
        if (rest % cp) continue;
        check_grid(RankGrid(world, tp, pp, rest / cp, {}, cp));
        if (HasFatalFailure()) return;
        ++grids;
      }
  }
  EXPECT_GT(grids, 100);
  // tp2-cp2-pp2-dp2: rank = t + 2 (c + 2 (d + 2 p)).
  const RankGrid g(16, 2, 2, 2, {}, 2);
  EXPECT_EQ(g.group(Axis::cp, 0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(g.group(Axis::dp, 0), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(g.group(Axis::pp, 0), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(g.dpcp_group(1), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(g.dpcp_group(9), (std::vector<int64_t>{9, 11, 13, 15}));
  Layout l;
  l.tp = 2;
  l.cp = 2;
  l.pp = 2;
  l.dp = 2;
  EXPECT_EQ(RankGrid::of_layout(l, 16).size(Axis::cp), 2);
  const RankGroups mine = rank_groups(16, 2, 2, 2, 6, {}, 2);
  EXPECT_EQ(mine.cp, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(mine.dpcp, (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(mine.coords, (RankCoords{.tp = 0, .pp = 0, .dp = 1, .cp = 1}));
}

TEST(RankGrid, TensorGroupsAreConsecutiveRanks) {
  for (int64_t world : {8, 24, 96, 4096}) {
    for (auto [tp, pp, dp] : factorizations(world)) {
      const RankGrid g(world, tp, pp, dp);
      const Groups groups = g.all_groups(Axis::tp);
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        for (int64_t i = 0; i < tp; ++i) ASSERT_EQ(groups[gi][size_t(i)], int64_t(gi) * tp + i);
      }
    }
  }
}

TEST(RankGrid, CoordinatesFollowTheFormula) {
  const RankGrid g(60, 3, 5, 4);
  for (int64_t r = 0; r < 60; ++r) {
    const RankCoords c = g.coords(r);
    EXPECT_EQ(r, c.tp + 3 * (c.dp + 4 * c.pp));
  }
}

TEST(RankGrid, PartitionsEveryFactorizationUpTo4096) {
  int64_t grids = 0;
  for (int64_t world : {1, 2, 3, 4, 6, 7, 8, 12, 16, 30, 64, 96, 128, 360, 1024, 4096}) {
    for (auto [tp, pp, dp] : factorizations(world)) {
      check_grid(RankGrid(world, tp, pp, dp));
      if (HasFatalFailure()) return;
      ++grids;
    }
  }
  EXPECT_GT(grids, 300);
}

TEST(RankGrid, OtherOrdersPartitionToo) {
  for (const char* text : {"tp-pp-dp", "dp-tp-pp", "pp-dp-tp", "cp-tp-dp-pp"}) {
    const RankOrder order = RankOrder::parse(text);
    // Three axes: cp right after tp.
    std::string with_cp = text;
    if (with_cp.find("cp") == std::string::npos) with_cp.replace(with_cp.find("tp"), 2, "tp-cp");
    EXPECT_EQ(order.to_string(), with_cp);
    for (auto [tp, pp, dp] : factorizations(48)) {
      check_grid(RankGrid(48, tp, pp, dp, order));
      if (HasFatalFailure()) return;
    }
  }
  // tp-pp-dp: pp second fastest, so the stages of a pipeline are tp ranks apart.
  const RankGrid g(8, 2, 2, 2, RankOrder::parse("tp-pp-dp"));
  EXPECT_EQ(g.group(Axis::pp, 0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(g.group(Axis::dp, 0), (std::vector<int64_t>{0, 4}));
}

TEST(RankGrid, PipelineNeighbours) {
  // tp2-pp4-dp3 over 24 ranks: stage s+1 of rank r is r + tp * dp.
  const RankGrid g(24, 2, 4, 3);
  for (int64_t r = 0; r < 24; ++r) {
    const RankCoords c = g.coords(r);
    const int64_t next = g.shift(Axis::pp, r, 1);
    const int64_t prev = g.shift(Axis::pp, r, -1);
    EXPECT_EQ(next, c.pp == 3 ? r - 18 : r + 6) << r;
    EXPECT_EQ(prev, c.pp == 0 ? r + 18 : r - 6) << r;
    EXPECT_EQ(g.coords(next), (RankCoords{.tp = c.tp, .pp = (c.pp + 1) % 4, .dp = c.dp}));
    EXPECT_EQ(g.shift(Axis::pp, r, 4), r);
    EXPECT_EQ(g.shift(Axis::pp, r, -9), g.shift(Axis::pp, r, -1));
  }
}

// Every rank makes its ring channels in order, each creation blocking until
// the channel's other rank makes it too: played out for groups of 1 to 64,
// every rank must finish (no rank waits on a peer that waits elsewhere) and
// hold exactly one channel to and one from each ring neighbour.
TEST(RankGrid, RingChannelsAreMadeWithoutDeadlock) {
  for (int64_t n = 1; n <= 64; ++n) {
    std::vector<std::vector<RingChannel>> todo(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      todo[size_t(r)] = ring_channels(n, r);
      std::vector<RingChannel> want;
      if (n > 1) {
        for (int64_t peer : {(r + 1) % n, (r + n - 1) % n}) {
          for (RingChannel c : {RingChannel{r, peer}, RingChannel{peer, r}})
            if (std::find(want.begin(), want.end(), c) == want.end()) want.push_back(c);
        }
      }
      std::vector<RingChannel> got = todo[size_t(r)];
      auto less = [](const RingChannel& a, const RingChannel& b) {
        return std::tie(a.from, a.to) < std::tie(b.from, b.to);
      };
      std::sort(got.begin(), got.end(), less);
      std::sort(want.begin(), want.end(), less);
      EXPECT_EQ(got, want) << "group of " << n << ", rank " << r;
    }
    std::vector<size_t> next(static_cast<size_t>(n), 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (int64_t r = 0; r < n; ++r) {
        if (next[size_t(r)] == todo[size_t(r)].size()) continue;
        const RingChannel c = todo[size_t(r)][next[size_t(r)]];
        const int64_t peer = c.from == r ? c.to : c.from;
        const auto& theirs = todo[size_t(peer)];
        if (next[size_t(peer)] < theirs.size() && theirs[next[size_t(peer)]] == c) {
          ++next[size_t(r)];
          ++next[size_t(peer)];
          progress = true;
        }
      }
    }
    for (int64_t r = 0; r < n; ++r)
      EXPECT_EQ(next[size_t(r)], todo[size_t(r)].size()) << "group of " << n << ": rank " << r << " waits forever";
  }
}

TEST(RankGrid, GroupsOfOneRankMatchTheWholeGrid) {
  const RankGrid g(96, 4, 3, 8);
  for (int64_t r = 0; r < 96; r += 7) {
    const RankGroups mine = rank_groups(96, 4, 3, 8, r);
    EXPECT_EQ(mine.rank, r);
    EXPECT_EQ(mine.coords, g.coords(r));
    for (Axis a : kAxes) {
      EXPECT_EQ(mine.members(a), g.all_groups(a)[size_t(mine.group_index(a))]);
      EXPECT_EQ(mine.members(a)[size_t(mine.coords[a])], r);
    }
  }
}

TEST(RankGrid, OfLayout) {
  Layout l;
  l.tp = 2;
  l.pp = 3;
  l.dp = 4;
  const RankGrid g = RankGrid::of_layout(l, 24);
  EXPECT_EQ(g.size(Axis::tp), 2);
  EXPECT_EQ(g.size(Axis::pp), 3);
  EXPECT_EQ(g.size(Axis::dp), 4);
}

TEST(RankGrid, BadInputNamesTheValues) {
  WEFT_EXPECT_THROW_MSG(RankGrid(6, 2, 2, 2), InputError, "tp2-pp2-dp2", "8", "world has 6");
  WEFT_EXPECT_THROW_MSG(RankGrid(4, 0, 2, 2), InputError, "tp0-pp2-dp2", "at least 1");
  WEFT_EXPECT_THROW_MSG(RankGrid(0, 1, 1, 1), InputError, "world of 0");
  WEFT_EXPECT_THROW_MSG(RankGrid(4, int64_t(1) << 40, int64_t(1) << 40, 1), InputError,
                        "world has 4");
  WEFT_EXPECT_THROW_MSG(RankOrder::parse("tp-dp"), InputError, "'tp-dp'", "tp-cp-dp-pp");
  WEFT_EXPECT_THROW_MSG(RankGrid(8, 2, 1, 2, {}, 3), InputError, "tp2-cp3-pp1-dp2", "tp * cp * pp * dp = 12");
  WEFT_EXPECT_THROW_MSG(RankOrder::parse("tp-tp-dp"), InputError, "'tp-tp-dp'");
  WEFT_EXPECT_THROW_MSG(RankOrder::parse("tp-dp-pp-tp"), InputError, "permutation");
  WEFT_EXPECT_THROW_MSG(RankOrder::parse("tp-dp-xx"), InputError, "'tp-dp-xx'");
  const RankGrid g(4, 2, 2, 1);
  EXPECT_THROW(g.coords(4), InternalError);
  EXPECT_THROW(g.coords(-1), InternalError);
  EXPECT_THROW(g.rank_of(RankCoords{.tp = 2}), InternalError);
}

}  // namespace
}  // namespace weft::parallel
