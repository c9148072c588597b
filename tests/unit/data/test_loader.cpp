// The loader: a sample depends only on (source, seq, seed, global index),
// every window appears once per epoch, and a resumed run reads exactly the
// tail of an uninterrupted one.
#include <algorithm>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data_test_util.h"
#include "data/loader.h"
#include "data/permutation.h"

namespace weft::test {
namespace {

using namespace weft::data;

// Token i of the source is i, so a window is recognisable by its first token.
MemoryTokenSource counting_source(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return MemoryTokenSource(std::move(t), n);
}

std::vector<int32_t> read_sample(const Loader& l, int64_t i) {
  std::vector<int32_t> in(static_cast<size_t>(l.seq())), tg(static_cast<size_t>(l.seq()));
  l.sample(i, in.data(), tg.data());
  in.insert(in.end(), tg.begin(), tg.end());
  return in;
}

TEST(Permutation, IsABijectionForEveryDomainSize) {
  for (int64_t n = 1; n <= 300; ++n) {
    const Permutation p(n, 12345 + static_cast<uint64_t>(n));
    std::vector<char> seen(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = p.at(i);
      ASSERT_GE(j, 0);
      ASSERT_LT(j, n);
      ASSERT_FALSE(seen[static_cast<size_t>(j)]) << "n=" << n << " repeats " << j;
      seen[static_cast<size_t>(j)] = 1;
    }
  }
}

TEST(Permutation, ShufflesAndDependsOnTheKey) {
  const int64_t n = 1000;
  const Permutation a(n, 1), b(n, 2);
  int64_t fixed = 0, same = 0;
  for (int64_t i = 0; i < n; ++i) {
    fixed += a.at(i) == i;
    same += a.at(i) == b.at(i);
  }
  // A random permutation has about one fixed point and agrees with another at about one place.
  EXPECT_LT(fixed, 10);
  EXPECT_LT(same, 10);
  // Huge domains cost nothing to set up.
  const Permutation huge(int64_t{1} << 40, 7);
  EXPECT_LT(huge.at((int64_t{1} << 40) - 1), int64_t{1} << 40);
}

TEST(Loader, WindowsAndTargetsAreShiftedByOne) {
  const auto src = counting_source(101);
  const Loader l(src, 10, 0, Loader::Order::sequential);
  EXPECT_EQ(l.windows(), 10);  // (101 - 1) / 10
  const auto s = read_sample(l, 3);
  for (int t = 0; t < 10; ++t) {
    EXPECT_EQ(s[size_t(t)], 30 + t);       // inputs
    EXPECT_EQ(s[size_t(10 + t)], 31 + t);  // targets
  }
  // The last window ends on the last token.
  EXPECT_EQ(read_sample(l, 9).back(), 100);
}

TEST(Loader, SameSeedAndIndexGiveSameTokens) {
  const auto src = counting_source(5000);
  const Loader a(src, 16, 42), b(src, 16, 42), c(src, 16, 43);
  int64_t differ = 0;
  for (int64_t i = 0; i < 1000; i += 7) {
    EXPECT_EQ(read_sample(a, i), read_sample(b, i));
    differ += read_sample(a, i) != read_sample(c, i);
  }
  EXPECT_GT(differ, 100);  // another seed, another order
}

TEST(Loader, IndependentOfTheOrderIndicesAreAsked) {
  const auto src = counting_source(3000);
  const Loader l(src, 8, 9);
  std::vector<int64_t> idx(700);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<std::vector<int32_t>> forward;
  for (const int64_t i : idx) forward.push_back(read_sample(l, i));
  // Another "rank layout": a fresh loader asked in reverse, strided order.
  const Loader other(src, 8, 9);
  std::reverse(idx.begin(), idx.end());
  std::stable_partition(idx.begin(), idx.end(), [](int64_t i) { return i % 3 == 1; });
  for (const int64_t i : idx) EXPECT_EQ(read_sample(other, i), forward[size_t(i)]) << i;
}

TEST(Loader, EveryWindowOncePerEpochAndEpochsReshuffle) {
  for (const int64_t n : {2, 3, 17, 65, 257, 1001, 4097}) {
    const auto src = counting_source(n * 4 + 1);
    const Loader l(src, 4, 2024);
    ASSERT_EQ(l.windows(), n);
    std::vector<int64_t> epoch0, epoch1;
    for (int64_t e = 0; e < 3; ++e) {
      std::set<int64_t> seen;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = e * n + k;
        EXPECT_EQ(l.epoch(i), e);
        const int64_t w = l.window(i);
        EXPECT_EQ(read_sample(l, i)[0], w * 4);
        seen.insert(w);
        if (e == 0) epoch0.push_back(w);
        if (e == 1) epoch1.push_back(w);
      }
      EXPECT_EQ(int64_t(seen.size()), n) << "n=" << n << " epoch " << e;
    }
    if (n >= 17) {
      EXPECT_NE(epoch0, epoch1) << "n=" << n;
    }
  }
}

TEST(Loader, ResumeFromIndexKEqualsTheTailOfAnUninterruptedRun) {
  const auto src = counting_source(2000);
  const int64_t B = 6, steps = 40, k_step = 17;
  std::vector<int32_t> in(size_t(B * 32)), tg(size_t(B * 32));
  std::vector<std::vector<int32_t>> full;
  {
    const Loader l(src, 32, 5);
    for (int64_t s = 0; s < steps; ++s) {
      l.batch(s * B, B, in.data(), tg.data());
      full.push_back(in);
      full.back().insert(full.back().end(), tg.begin(), tg.end());
    }
  }
  // A new process resumes from the saved global sample index.
  const int64_t saved = k_step * B;
  const Loader resumed(src, 32, 5);
  for (int64_t s = k_step; s < steps; ++s) {
    resumed.batch(saved + (s - k_step) * B, B, in.data(), tg.data());
    auto got = in;
    got.insert(got.end(), tg.begin(), tg.end());
    EXPECT_EQ(got, full[size_t(s)]) << "step " << s;
  }
}

TEST(Loader, DataParallelRanksSplitTheSameGlobalBatch) {
  const auto src = counting_source(4000);
  const Loader l(src, 16, 3);
  const int64_t global_batch = 8;
  for (int64_t step = 0; step < 5; ++step) {
    std::vector<int32_t> whole_in(size_t(global_batch * 16)), whole_tg(whole_in.size());
    l.batch(step * global_batch, global_batch, whole_in.data(), whole_tg.data());
    for (const int64_t dp : {1, 2, 4, 8}) {
      const int64_t local = global_batch / dp;
      for (int64_t r = 0; r < dp; ++r) {
        std::vector<int32_t> in(size_t(local * 16)), tg(in.size());
        l.batch(step * global_batch + r * local, local, in.data(), tg.data());
        EXPECT_TRUE(std::equal(in.begin(), in.end(), whole_in.begin() + r * local * 16));
        EXPECT_TRUE(std::equal(tg.begin(), tg.end(), whole_tg.begin() + r * local * 16));
      }
    }
  }
}

TEST(Loader, ValidationSamplesAreFixedAndIndependentOfTheRun) {
  const auto src = counting_source(1001);
  const Loader a = validation_loader(src, 10), b = validation_loader(src, 10);
  std::set<int64_t> first;
  for (int64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(read_sample(a, i), read_sample(b, i));
    first.insert(a.window(i));
  }
  EXPECT_EQ(first.size(), 100u);
}

// Validation reads each distinct window at most once: a request for more is
// capped at what the split holds, and the note says so.
TEST(Loader, ValidationSamplesAreCappedAtTheWindowsTheSplitHolds) {
  const auto src = counting_source(515);  // 2 windows of 257 tokens (256 + 1)
  const auto capped = validation_samples(src, 256, 1000, "--eval-samples");
  EXPECT_EQ(capped.samples, 2);
  EXPECT_EQ(capped.windows, 2);
  EXPECT_EQ(capped.note, "the data holds 2 windows of 257 tokens; --eval-samples 1000 asked for more");
  const auto asked = validation_samples(src, 256, 1, "--samples");
  EXPECT_EQ(asked.samples, 1);
  EXPECT_EQ(asked.note, "");
  EXPECT_EQ(validation_samples(src, 256, int64_t{1} << 62, "--samples").samples, 2);
}

TEST(Loader, SequenceLongerThanTheDataIsAClearError) {
  const MemoryTokenSource src(std::vector<int32_t>(64, 1), 256, "tiny.tok");
  EXPECT_NO_THROW(Loader(src, 63, 0));
  WEFT_EXPECT_THROW_MSG(Loader(src, 64, 0), InputError, "sequence length 64", "65", "tiny.tok",
                        "64 tokens");
  WEFT_EXPECT_THROW_MSG(Loader(src, 0, 0), InputError, "sequence length 0");
}

}  // namespace
}  // namespace weft::test
