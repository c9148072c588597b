// Blends and `--data` lists: parsing, shares that follow the weights in every
// prefix of the sample order, a loader that stays deterministic and resumable
// from any global index, and a baseline that is the mixture's.
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "data_test_util.h"
#include "data/blend.h"
#include "data/data_spec.h"
#include "data/loader.h"
#include "data/token_data.h"

namespace weft::test {
namespace {

using namespace weft::data;

TEST(DataSpec, PathsWeightsAndTheirErrors) {
  EXPECT_TRUE(data_spec_parse({}).paths.empty());
  auto s = data_spec_parse({"a", "b"});
  EXPECT_EQ(s.paths, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(s.blend());
  s = data_spec_parse({"0.7", "a", "3e-1", "b", "0", "c"});
  EXPECT_EQ(s.paths, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s.weights, (std::vector<double>{0.7, 0.3, 0.0}));
  EXPECT_EQ(s.describe(), "0.7 a 0.3 b 0 c");

  WEFT_EXPECT_THROW_MSG(data_spec_parse({"0.7", "a", "x", "b"}), InputError, "weight 'x'",
                        "item 3", "not a number", "0.7 A 0.3 B");
  WEFT_EXPECT_THROW_MSG(data_spec_parse({"0.7", "a", "0.3%", "b"}), InputError, "'0.3%'");
  WEFT_EXPECT_THROW_MSG(data_spec_parse({"0.7", "a", "-0.3", "b"}), InputError, "weight -0.3",
                        "for 'b'", ">= 0");
  WEFT_EXPECT_THROW_MSG(data_spec_parse({"inf", "a"}), InputError, "weight inf", "finite");
  WEFT_EXPECT_THROW_MSG(data_spec_parse({"nan", "a"}), InputError, "weight nan");
  WEFT_EXPECT_THROW_MSG(data_spec_parse({"0", "a", "0.0", "b"}), InputError, "summing to 0");
  WEFT_EXPECT_THROW_MSG(data_spec_parse({"0.7", "a", "0.3"}), InputError, "ends with the weight",
                        "'0.3'", "no path");
  WEFT_EXPECT_THROW_MSG(data_spec_parse({"a", "0.3", "b"}), InputError, "item 2", "'0.3'",
                        "a blend alternates");
}

// The count of each part among the first n samples, by walking the schedule.
std::vector<std::vector<int64_t>> prefix_counts(const BlendSchedule& s, int64_t n) {
  std::vector<std::vector<int64_t>> counts;
  std::vector<int64_t> c(static_cast<size_t>(s.parts()), 0);
  counts.push_back(c);
  for (int64_t i = 0; i < n; ++i) {
    const auto p = s.pick(i);
    // The index within the part is the number of its samples so far.
    EXPECT_EQ(p.index, c[static_cast<size_t>(p.part)]) << "sample " << i;
    ++c[static_cast<size_t>(p.part)];
    counts.push_back(c);
  }
  return counts;
}

TEST(BlendSchedule, EveryPrefixFollowsTheWeights) {
  struct Case {
    std::vector<double> weights;
    double bound;  // half the tree's depth
  };
  for (const Case& c : std::vector<Case>{{{0.7, 0.3}, 0.5},
                                         {{1, 1, 1}, 1.0},
                                         {{5, 1, 0.25, 3, 2}, 1.5},
                                         {{0.01, 0.99}, 0.5},
                                         {{1, 2, 3, 4, 5, 6, 7, 8}, 1.5}}) {
    const BlendSchedule s(c.weights);
    const double total = std::accumulate(c.weights.begin(), c.weights.end(), 0.0);
    const int64_t n = 5000;
    const auto counts = prefix_counts(s, n);
    for (int64_t k = 0; k <= n; ++k)
      for (size_t p = 0; p < c.weights.size(); ++p) {
        const double want = c.weights[p] / total * static_cast<double>(k);
        ASSERT_LE(std::abs(static_cast<double>(counts[static_cast<size_t>(k)][p]) - want),
                  c.bound + 1e-9)
            << "part " << p << " after " << k << " samples of weights " << c.weights.size();
      }
  }
}

TEST(BlendSchedule, ZeroWeightsAreNeverDrawnAndOnePartIsTheIdentity) {
  const BlendSchedule s({0, 2, 0, 1});
  const auto counts = prefix_counts(s, 3000);
  EXPECT_EQ(counts.back(), (std::vector<int64_t>{0, 2000, 0, 1000}));
  const BlendSchedule one({0.4});
  for (int64_t i : {int64_t{0}, int64_t{7}, int64_t{1} << 50}) {
    EXPECT_EQ(one.pick(i).part, 0);
    EXPECT_EQ(one.pick(i).index, i);
  }
}

TEST(BlendSchedule, HugeIndicesNeedNoHistory) {
  // A resumed run asks for index 2^50 directly; the shares there hold too.
  const BlendSchedule s({0.7, 0.3});
  const int64_t i = int64_t{1} << 50;
  const auto p = s.pick(i);
  const double want = (p.part == 0 ? 0.7 : 0.3) * static_cast<double>(i);
  EXPECT_LE(std::abs(static_cast<double>(p.index) - want), 1.0);
}

// Part p's tokens are p * 1000 + i, so a sample names its part and window.
std::unique_ptr<TokenSource> counting(int64_t part, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(part * 1000 + i);
  return std::make_unique<MemoryTokenSource>(std::move(t), 4000, fmt::format("part{}", part));
}

BlendTokenSource blend_of(const std::vector<int64_t>& sizes, const std::vector<double>& weights) {
  std::vector<std::unique_ptr<TokenSource>> parts;
  for (size_t p = 0; p < sizes.size(); ++p) parts.push_back(counting(static_cast<int64_t>(p), sizes[p]));
  return BlendTokenSource(std::move(parts), weights);
}

std::vector<int32_t> read_sample(const Loader& l, int64_t i) {
  std::vector<int32_t> in(static_cast<size_t>(l.seq())), tg(static_cast<size_t>(l.seq()));
  l.sample(i, in.data(), tg.data());
  in.insert(in.end(), tg.begin(), tg.end());
  return in;
}

TEST(BlendLoader, SamplesComeFromTheirPartAndCoverItsWindowsEachEpoch) {
  const auto b = blend_of({81, 401, 161}, {0.5, 0.2, 0.3});  // 10, 50, 20 windows of 8
  const Loader l(b, 8, 99);
  EXPECT_EQ(l.parts(), 3);
  EXPECT_EQ(l.windows(), 80);
  std::map<int64_t, std::vector<std::set<int64_t>>> seen;  // part -> per-epoch windows
  for (int64_t i = 0; i < 2000; ++i) {
    const auto pick = l.pick(i);
    const auto s = read_sample(l, i);
    const int64_t w = l.window(i);
    ASSERT_EQ(s[0], pick.part * 1000 + w * 8) << "sample " << i;
    ASSERT_EQ(s[8], s[0] + 1);  // targets shifted by one
    auto& epochs = seen[pick.part];
    const auto e = static_cast<size_t>(l.epoch(i));
    if (epochs.size() <= e) epochs.resize(e + 1);
    ASSERT_TRUE(epochs[e].insert(w).second) << "window " << w << " twice in an epoch";
  }
  // Full epochs hold every window of their part: part 0 saw ~1000 samples, 100 epochs.
  const std::vector<int64_t> windows = {10, 50, 20};
  for (const auto& [part, epochs] : seen)
    for (size_t e = 0; e + 1 < epochs.size(); ++e)
      EXPECT_EQ(static_cast<int64_t>(epochs[e].size()), windows[static_cast<size_t>(part)]);
}

TEST(BlendLoader, DeterministicAndResumableFromAnyIndex) {
  const auto b = blend_of({300, 300}, {1, 1});
  const Loader a(b, 16, 7), again(b, 16, 7), other(b, 16, 8);
  int64_t differ = 0;
  // Any index, in any order, from a fresh loader, reads what a run from 0 reads.
  for (int64_t i = 199; i >= 0; --i) {
    EXPECT_EQ(read_sample(a, i), read_sample(again, i));
    differ += read_sample(a, i) != read_sample(other, i);
  }
  EXPECT_GT(differ, 100);
  // Two parts of the same size shuffle differently.
  std::vector<int64_t> order0, order1;
  for (int64_t i = 0; i < 40; ++i) (a.pick(i).part == 0 ? order0 : order1).push_back(a.window(i));
  EXPECT_NE(order0, order1);
}

TEST(BlendLoader, ASinglePartReadsLikeThePlainSource) {
  std::vector<std::unique_ptr<TokenSource>> parts;
  parts.push_back(counting(0, 500));
  const BlendTokenSource b(std::move(parts), {0.3});
  const auto plain = counting(0, 500);
  const Loader lb(b, 16, 3), lp(*plain, 16, 3);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(read_sample(lb, i), read_sample(lp, i));
}

TEST(BlendLoader, AZeroWeightPartMayBeShortAndIsNeverRead) {
  const auto b = blend_of({100, 5}, {1, 0});
  const Loader l(b, 16, 0);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(l.pick(i).part, 0);
  const auto drawn = blend_of({100, 5}, {1, 1});
  WEFT_EXPECT_THROW_MSG(Loader(drawn, 16, 0), InputError, "sequence length 16", "part1");
}

TEST(BlendData, OpenValidateAndBaseline) {
  TempDir dir;
  // a: all 1s, with a val split; b: all 2s, three times as long, without one.
  token_file_write(dir.path("a/train.tok"), std::vector<int32_t>(100, 1), 256);
  token_file_write(dir.path("a/val.tok"), std::vector<int32_t>(50, 3), 256);
  dir.file("a/meta.json", R"({"train": {"file": "train.tok"}, "val": {"file": "val.tok"}})");
  token_file_write(dir.path("b.tok"), std::vector<int32_t>(300, 2), 256);

  const auto blend = token_data_open(data_spec_parse({"0.5", dir.path("a"), "0.5", dir.path("b.tok")}));
  EXPECT_EQ(blend.train->size(), 400);
  EXPECT_EQ(blend.train->blend_parts().size(), 2u);
  EXPECT_NE(blend.train->describe().find("blend of 0.5 x"), std::string::npos);
  ASSERT_NE(blend.val, nullptr);  // a's val alone
  EXPECT_EQ(blend.val->size(), 50);
  // The mixture's entropy, not the concatenation's: half 1s, half 2s.
  EXPECT_NEAR(token_data_baseline(blend), std::log(2.0), 1e-12);
  EXPECT_NO_THROW(token_data_validate(blend, 256, 40));
  // Each part needs its own seq + 1 tokens.
  WEFT_EXPECT_THROW_MSG(token_data_validate(blend, 256, 100), InputError, "sequence length 100",
                        "train.tok");
  WEFT_EXPECT_THROW_MSG(token_data_validate(blend, 3, 8), InputError, "token id 3");

  // A plain list reads back to back.
  const auto list = token_data_open(data_spec_parse({dir.path("a"), dir.path("b.tok")}));
  EXPECT_EQ(list.train->size(), 400);
  EXPECT_EQ(list.train->blend_parts().size(), 1u);
  EXPECT_EQ(list.train->token(100), 2);
  EXPECT_NEAR(token_data_baseline(list), -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-12);
  // No part with a val split: none.
  const auto noval = token_data_open(data_spec_parse({"1", dir.path("b.tok"), "2", dir.path("b.tok")}));
  EXPECT_EQ(noval.val, nullptr);
}

}  // namespace
}  // namespace weft::test
