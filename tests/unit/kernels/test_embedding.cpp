// embedding: vocab-parallel gather and scatter-add against an fp64
// reference, finite differences, and out-of-range token ids.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/embedding/embedding.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

template <typename E>
EmbeddingForwardParams<E> forward_params(const EmbeddingCase& c, Shard s,
                                         const std::vector<int32_t>& tokens,
                                         const std::vector<E>& table, std::vector<E>& out) {
  return {.rows = c.rows, .C = c.C, .V = c.V, .vocab_start = s.start, .V_local = s.size,
          .tokens = tokens.data(), .table = table.data() + s.start * c.C, .out = out.data()};
}

template <typename E>
EmbeddingBackwardParams<E> backward_params(const EmbeddingCase& c, Shard s,
                                           const std::vector<int32_t>& tokens,
                                           const std::vector<E>& dout, std::vector<E>& dtable) {
  return {.rows = c.rows, .C = c.C, .V = c.V, .vocab_start = s.start, .V_local = s.size,
          .tokens = tokens.data(), .dout = dout.data(), .dtable = dtable.data() + s.start * c.C};
}

std::vector<int32_t> random_tokens(Rng& rng, int64_t rows, int64_t V) {
  std::vector<int32_t> t(rows);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.index(V));
  return t;
}

class EmbeddingTest : public ::testing::TestWithParam<EmbeddingCase> {};

// Every shard run on its own: outputs summed over shards are the full
// lookup, and each shard's gradient lands in its own rows of the table.
TEST_P(EmbeddingTest, ShardsMatchFp64Reference) {
  const EmbeddingCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto tokens = random_tokens(rng, c.rows, c.V);
  const auto table = rng.uniform<float>(c.V * c.C), dout = rng.uniform<float>(c.rows * c.C);
  auto dtable = rng.uniform<float>(c.V * c.C);
  std::vector<double> ref_out(c.rows * c.C), ref_dtable = cast<double>(dtable);
  std::vector<float> naive_out(c.rows * c.C), naive_dtable = dtable;
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.C; ++j) {
      ref_out[i * c.C + j] = table[tokens[i] * c.C + j];
      naive_out[i * c.C + j] = table[tokens[i] * c.C + j];
      ref_dtable[tokens[i] * c.C + j] += dout[i * c.C + j];
      naive_dtable[tokens[i] * c.C + j] += dout[i * c.C + j];
    }
  std::vector<float> out_sum(c.rows * c.C, 0.0f), out(c.rows * c.C);
  for (int64_t rank = 0; rank < c.shards; ++rank) {
    const Shard s = shard_of(c.V, c.shards, rank);
    ASSERT_EQ(run(forward_params(c, s, tokens, table, out)), Status::ok);
    for (size_t i = 0; i < out.size(); ++i) out_sum[i] += out[i];
    ASSERT_EQ(run(backward_params(c, s, tokens, dout, dtable)), Status::ok);
  }
  expect_within_rule("out summed over shards", out_sum, naive_out, ref_out);
  expect_within_rule("dtable (accumulated)", dtable, naive_dtable, ref_dtable);
}

TEST_P(EmbeddingTest, GradientMatchesFiniteDifferences) {
  const EmbeddingCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const auto tokens = random_tokens(rng, c.rows, c.V);
  auto table = rng.uniform<double>(c.V * c.C);
  const auto r = rng.uniform<double>(c.rows * c.C);
  const Shard s = shard_of(c.V, c.shards, c.shards - 1);
  std::vector<double> out(c.rows * c.C);
  auto loss = [&] {
    run_or_throw(forward_params(c, s, tokens, table, out));
    return dot(r, out);
  };
  std::vector<double> dtable(c.V * c.C, 0.0);
  ASSERT_EQ(run(backward_params(c, s, tokens, r, dtable)), Status::ok);
  // Rows outside the shard have no gradient here and none by differences.
  EXPECT_LE(fd_error(table, dtable, loss, rng, 200), kFdTolerance) << "dtable";
}

INSTANTIATE_TEST_SUITE_P(Cases, EmbeddingTest, ::testing::ValuesIn(embedding_cases()), CaseName{});

TEST(EmbeddingArgs, TokenOutsideVocabularyThrowsNamingIt) {
  const int64_t V = 11, C = 3;
  std::vector<float> table(V * C, 1.0f), out(4 * C, -1.0f);
  for (int32_t bad_id : {11, -1}) {
    std::vector<int32_t> tokens = {3, 0, bad_id, 10};
    EmbeddingForwardParams<float> p{.rows = 4, .C = C, .V = V, .vocab_start = 0, .V_local = V,
                                    .tokens = tokens.data(), .table = table.data(),
                                    .out = out.data()};
    try {
      (void)run(p);
      ADD_FAILURE() << "token id " << bad_id << " was accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("token id " + std::to_string(bad_id)), std::string::npos) << msg;
      EXPECT_NE(msg.find("position 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("V = 11"), std::string::npos) << msg;
    }
    EXPECT_EQ(out, std::vector<float>(4 * C, -1.0f)) << "nothing is written before the check";
    std::vector<float> dtable(V * C, 0.0f);
    EmbeddingBackwardParams<float> b{.rows = 4, .C = C, .V = V, .vocab_start = 0, .V_local = V,
                                     .tokens = tokens.data(), .dout = out.data(),
                                     .dtable = dtable.data()};
    EXPECT_THROW((void)run(b), InputError);
  }
}

TEST(EmbeddingArgs, RejectsImpossibleParams) {
  std::vector<int32_t> tokens = {1, 2};
  std::vector<float> table(11 * 3), out(6);
  const EmbeddingForwardParams<float> ok{.rows = 2, .C = 3, .V = 11, .vocab_start = 6,
                                         .V_local = 5, .tokens = tokens.data(),
                                         .table = table.data(), .out = out.data()};
  EXPECT_TRUE(supports(ok));
  auto bad = ok;
  bad.V_local = 6;  // a shard reaching past V: a padded vocabulary's rows
  EXPECT_TRUE(supports(bad));
  bad = ok;
  bad.vocab_start = -1;
  EXPECT_FALSE(supports(bad));
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.C = 0;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  bad = ok;
  bad.tokens = nullptr;
  EXPECT_EQ(run(bad), Status::invalid_argument);
  EXPECT_EQ(launch(ok, {}, Stream{Backend::cuda, nullptr}), Status::unsupported);
}

}  // namespace
}  // namespace weft::kernels::test
