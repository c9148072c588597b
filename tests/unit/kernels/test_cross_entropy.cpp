// cross_entropy: the three phases run per vocab shard with the tp reductions
// done by hand in between, against an fp64 reference and finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

constexpr int32_t kIgnore = -100;

// Per row: loss = log sum_j exp(x_j) - x_target (through the max, so large
// logits stay finite) and gradient (softmax - onehot) * scale.
template <typename R>
void reference(const CrossEntropyCase& c, const std::vector<R>& logits,
               const std::vector<int32_t>& targets, R scale, std::vector<R>& loss,
               std::vector<R>& grad) {
  loss.assign(c.rows, R(0));
  grad.assign(logits.size(), R(0));
  for (int64_t r = 0; r < c.rows; ++r) {
    if (targets[r] == kIgnore) continue;
    const R* x = &logits[r * c.V];
    const R mx = *std::max_element(x, x + c.V);
    R sum = 0;
    for (int64_t j = 0; j < c.V; ++j) sum += std::exp(x[j] - mx);
    loss[r] = std::log(sum) + mx - x[targets[r]];
    for (int64_t j = 0; j < c.V; ++j)
      grad[r * c.V + j] = (std::exp(x[j] - mx) / sum - (j == targets[r] ? R(1) : R(0))) * scale;
  }
}

std::vector<int32_t> random_targets(Rng& rng, const CrossEntropyCase& c) {
  std::vector<int32_t> t(c.rows);
  for (int64_t r = 0; r < c.rows; ++r)
    t[r] = c.ignore_every > 0 && r % c.ignore_every == 1 ? kIgnore
                                                         : static_cast<int32_t>(rng.index(c.V));
  return t;
}

double mean_scale(const std::vector<int32_t>& targets) {
  const auto kept = std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnore; });
  return kept > 0 ? 1.0 / double(kept) : 0.0;
}

// The vocab-parallel protocol on `shards` simulated tp ranks: each rank owns
// columns [start, start + size) of the logits in its own buffer. Returns the
// loss summed over ranks; `logits` comes back holding the gradient.
template <typename E>
std::vector<Acc<E>> vocab_parallel(const CrossEntropyCase& c, std::vector<E>& logits,
                                   const std::vector<int32_t>& targets, double scale) {
  using A = Acc<E>;
  std::vector<std::vector<E>> local(c.shards);
  for (int64_t rank = 0; rank < c.shards; ++rank) {
    const Shard s = shard_of(c.V, c.shards, rank);
    for (int64_t r = 0; r < c.rows; ++r)
      local[rank].insert(local[rank].end(), logits.begin() + r * c.V + s.start,
                         logits.begin() + r * c.V + s.start + s.size);
  }
  std::vector<A> row_max(c.rows, -INFINITY), sum_exp(c.rows, A(0)), loss(c.rows, A(0));
  std::vector<A> part(c.rows);
  for (int64_t rank = 0; rank < c.shards; ++rank) {  // (a), then all-reduce max
    const Shard s = shard_of(c.V, c.shards, rank);
    run_or_throw(CrossEntropyMaxParams<E>{.rows = c.rows, .V_local = s.size,
                                          .logits = local[rank].data(), .row_max = part.data()});
    for (int64_t r = 0; r < c.rows; ++r) row_max[r] = std::max(row_max[r], part[r]);
  }
  for (int64_t rank = 0; rank < c.shards; ++rank) {  // (b), then all-reduce sum
    const Shard s = shard_of(c.V, c.shards, rank);
    run_or_throw(CrossEntropySumExpParams<E>{.rows = c.rows, .V_local = s.size,
                                             .logits = local[rank].data(),
                                             .row_max = row_max.data(), .sum_exp = part.data()});
    for (int64_t r = 0; r < c.rows; ++r) sum_exp[r] += part[r];
  }
  for (int64_t rank = 0; rank < c.shards; ++rank) {  // (c), loss summed over ranks
    const Shard s = shard_of(c.V, c.shards, rank);
    run_or_throw(CrossEntropyLossGradParams<E>{
        .rows = c.rows, .V = c.V, .vocab_start = s.start, .V_local = s.size,
        .logits = local[rank].data(), .targets = targets.data(), .row_max = row_max.data(),
        .sum_exp = sum_exp.data(), .loss = part.data(), .grad_scale = scale,
        .ignore_index = kIgnore});
    for (int64_t r = 0; r < c.rows; ++r) {
      loss[r] += part[r];
      std::copy(local[rank].begin() + r * s.size, local[rank].begin() + (r + 1) * s.size,
                logits.begin() + r * c.V + s.start);
    }
  }
  return loss;
}

class CrossEntropyTest : public ::testing::TestWithParam<CrossEntropyCase> {};

TEST_P(CrossEntropyTest, VocabParallelPhasesMatchFp64Reference) {
  const CrossEntropyCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  auto logits = rng.uniform<float>(c.rows * c.V, -c.logit_range, c.logit_range);
  const auto targets = random_targets(rng, c);
  const double scale = mean_scale(targets);
  std::vector<double> ref_loss, ref_grad;
  std::vector<float> naive_loss, naive_grad;
  reference(c, cast<double>(logits), targets, scale, ref_loss, ref_grad);
  reference(c, logits, targets, float(scale), naive_loss, naive_grad);
  const auto loss = vocab_parallel(c, logits, targets, scale);
  expect_within_rule("loss", loss, naive_loss, ref_loss);
  expect_within_rule("gradient", logits, naive_grad, ref_grad);
  for (int64_t r = 0; r < c.rows; ++r) {
    if (targets[r] != kIgnore) continue;
    EXPECT_EQ(loss[r], 0.0f) << "ignored row " << r;
    for (int64_t j = 0; j < c.V; ++j) ASSERT_EQ(logits[r * c.V + j], 0.0f) << "ignored row " << r;
  }
}

// L = scale * sum of the row losses, whose gradient phase (c) writes. The
// differences are taken of L minus its unperturbed value row by row: a
// perturbed logit changes only its own row, so the other rows cancel exactly,
// and their rounding (|L| ~ 6 against gradient entries ~ scale / V ~ 1e-5)
// stays out of the quotient.
TEST_P(CrossEntropyTest, GradientMatchesFiniteDifferences) {
  const CrossEntropyCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  auto logits = rng.uniform<double>(c.rows * c.V, -c.logit_range, c.logit_range);
  const auto targets = random_targets(rng, c);
  const double scale = mean_scale(targets);
  auto grad = logits;
  const auto base = vocab_parallel(c, grad, targets, scale);
  auto loss = [&] {
    auto scratch = logits;
    const auto rows = vocab_parallel(c, scratch, targets, scale);
    double total = 0;
    for (int64_t r = 0; r < c.rows; ++r) total += rows[r] - base[r];
    return scale * total;
  };
  EXPECT_LE(fd_error(logits, grad, loss, rng, 96), kFdTolerance);
}

INSTANTIATE_TEST_SUITE_P(Cases, CrossEntropyTest, ::testing::ValuesIn(cross_entropy_cases()),
                         CaseName{});

// A vocabulary padded for tp (ModelSpec::padded_vocab): V real columns of Vp,
// shards of Vp / tp, the padding holding logits larger than any real one.
// The loss and the real columns' gradient are the unpadded fp64 reference's
// within the rule, and the padding's gradient is exactly zero, also on a
// shard that is all padding.
TEST(CrossEntropyPadded, PaddingGetsNoProbability) {
  for (const auto& [V, tp, Vp] : {std::tuple<int64_t, int64_t, int64_t>{37, 2, 48}, {37, 4, 64}, {250, 2, 256}}) {
    const CrossEntropyCase c{"padded", 9, V, 1, 4, 6.0};
    Rng rng;
    SCOPED_TRACE(rng.trace() + " V=" + std::to_string(V) + " tp=" + std::to_string(tp));
    const auto real = rng.uniform<float>(c.rows * V, -c.logit_range, c.logit_range);
    const auto targets = random_targets(rng, c);
    const double scale = mean_scale(targets);
    std::vector<double> ref_loss, ref_grad;
    std::vector<float> naive_loss, naive_grad;
    reference(c, cast<double>(real), targets, scale, ref_loss, ref_grad);
    reference(c, real, targets, float(scale), naive_loss, naive_grad);
    const int64_t Vl = Vp / tp;
    std::vector<std::vector<float>> local(size_t(tp), std::vector<float>(size_t(c.rows * Vl)));
    for (int64_t rank = 0; rank < tp; ++rank)
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t j = 0; j < Vl; ++j) {
          const int64_t id = rank * Vl + j;
          local[size_t(rank)][size_t(r * Vl + j)] = id < V ? real[size_t(r * V + id)] : 3 * float(c.logit_range);
        }
    std::vector<float> row_max(size_t(c.rows), -INFINITY), sum_exp(size_t(c.rows), 0.0f), loss(size_t(c.rows), 0.0f),
        part(size_t(c.rows));
    for (int64_t rank = 0; rank < tp; ++rank) {
      run_or_throw(CrossEntropyMaxParams<float>{.rows = c.rows, .V_local = Vl, .logits = local[size_t(rank)].data(),
                                                .row_max = part.data(),
                                                .valid = valid_columns(V, rank * Vl, Vl)});
      for (int64_t r = 0; r < c.rows; ++r) row_max[size_t(r)] = std::max(row_max[size_t(r)], part[size_t(r)]);
    }
    for (int64_t rank = 0; rank < tp; ++rank) {
      run_or_throw(CrossEntropySumExpParams<float>{.rows = c.rows, .V_local = Vl,
                                                   .logits = local[size_t(rank)].data(), .row_max = row_max.data(),
                                                   .sum_exp = part.data(),
                                                   .valid = valid_columns(V, rank * Vl, Vl)});
      for (int64_t r = 0; r < c.rows; ++r) sum_exp[size_t(r)] += part[size_t(r)];
    }
    std::vector<float> grad(size_t(c.rows * V));
    for (int64_t rank = 0; rank < tp; ++rank) {
      auto& x = local[size_t(rank)];
      run_or_throw(CrossEntropyLossGradParams<float>{
          .rows = c.rows, .V = V, .vocab_start = rank * Vl, .V_local = Vl, .logits = x.data(),
          .targets = targets.data(), .row_max = row_max.data(), .sum_exp = sum_exp.data(), .loss = part.data(),
          .grad_scale = scale, .ignore_index = kIgnore});
      for (int64_t r = 0; r < c.rows; ++r) {
        loss[size_t(r)] += part[size_t(r)];
        for (int64_t j = 0; j < Vl; ++j) {
          const int64_t id = rank * Vl + j;
          if (id < V)
            grad[size_t(r * V + id)] = x[size_t(r * Vl + j)];
          else
            ASSERT_EQ(x[size_t(r * Vl + j)], 0.0f) << "padding id " << id << " row " << r;
        }
      }
    }
    expect_within_rule("loss", loss, naive_loss, ref_loss);
    expect_within_rule("gradient", grad, naive_grad, ref_grad);
  }
}

TEST(CrossEntropyArgs, TargetOutsideVocabularyThrowsNamingIt) {
  const int64_t rows = 3, V = 11;
  std::vector<float> logits(rows * V, 0.5f), row_max(rows, 0.5f), sum_exp(rows, 11.0f);
  for (int32_t bad : {11, -1}) {
    std::vector<int32_t> targets = {kIgnore, 4, bad};
    CrossEntropyLossGradParams<float> p{.rows = rows, .V = V, .vocab_start = 0, .V_local = V,
                                        .logits = logits.data(), .targets = targets.data(),
                                        .row_max = row_max.data(), .sum_exp = sum_exp.data()};
    try {
      (void)run(p);
      ADD_FAILURE() << "target " << bad << " was accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("target id " + std::to_string(bad) + " at position 2"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("V = 11"), std::string::npos) << msg;
    }
    EXPECT_EQ(logits, std::vector<float>(rows * V, 0.5f)) << "the logits are left untouched";
  }
}

TEST(CrossEntropyArgs, RejectsImpossibleParams) {
  std::vector<float> logits(2 * 5), stat(2);
  std::vector<int32_t> targets = {1, 7};
  const CrossEntropyLossGradParams<float> ok{.rows = 2, .V = 11, .vocab_start = 6, .V_local = 5,
                                             .logits = logits.data(), .targets = targets.data(),
                                             .row_max = stat.data(), .sum_exp = stat.data()};
  EXPECT_TRUE(supports(ok)) << "the loss output is optional";
  auto bad = ok;
  bad.vocab_start = 7;  // a shard reaching past V: a padded vocabulary's
  EXPECT_TRUE(supports(bad));
  bad.vocab_start = -1;
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.ignore_index = 3;  // a real token id cannot mean "ignore"
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.grad_scale = NAN;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  CrossEntropyMaxParams<float> mx{.rows = 2, .V_local = 0, .logits = logits.data(),
                                  .row_max = stat.data()};
  EXPECT_EQ(run(mx), Status::invalid_argument) << "an empty shard has no max";
  CrossEntropySumExpParams<float> se{.rows = 2, .V_local = 5, .logits = logits.data(),
                                     .row_max = nullptr, .sum_exp = stat.data()};
  EXPECT_EQ(run(se), Status::invalid_argument);
  se.row_max = stat.data();
  se.valid = 6;  // more vocabulary columns than the shard has
  EXPECT_EQ(run(se), Status::invalid_argument);
  mx.V_local = 5;
  mx.valid = -2;
  EXPECT_EQ(run(mx), Status::invalid_argument);
  EXPECT_EQ(launch(ok, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);
}

}  // namespace
}  // namespace weft::kernels::test
