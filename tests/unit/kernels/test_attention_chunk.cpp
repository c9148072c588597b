// attention within chunks (Llama 4's RoPE layers, AttentionForwardParams::
// chunk): both CPU variants against the fp64 textbook attention with the
// chunk mask, their gradients against finite differences, and blocks of the
// sequence at context parallelism's offsets merged to the whole.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/attention/attention.h"
#include "tests/unit/kernels/attention_reference.h"
#include "tests/unit/kernels/kernel_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

constexpr AttentionKind kKinds[] = {AttentionKind::flash, AttentionKind::materialized};

// A shape and a chunk. The chunks cut the sequence unevenly (5 and 7 do not
// divide 37 or 45), one is a single position (each query sees itself only),
// one is past the sequence (the whole causal attention), and one crosses the
// CPU kernel's 32-row query blocks.
struct ChunkCase {
  AttentionCase shape;
  int64_t chunk;
};

std::vector<ChunkCase> chunk_cases() {
  return {{{"b2_t37_h4_kv2_d8", 2, 37, 4, 2, 8}, 5},   {{"b1_t45_h3_kv1_d5", 1, 45, 3, 1, 5}, 7},
          {{"b2_t13_h2_kv2_d4", 2, 13, 2, 2, 4}, 1},   {{"b1_t11_h2_kv1_d3", 1, 11, 2, 1, 3}, 64},
          {{"b1_t83_h2_kv1_d16", 1, 83, 2, 1, 16}, 40}, {{"b2_t70_h4_kv4_d7", 2, 70, 4, 4, 7}, 33}};
}

void PrintTo(const ChunkCase& c, std::ostream* os) { *os << c.shape.name << " chunk " << c.chunk; }

std::string case_name(const ::testing::TestParamInfo<ChunkCase>& info) {
  return info.param.shape.name + "_chunk" + std::to_string(info.param.chunk);
}

template <typename E>
struct Run {
  std::vector<E> out, lse, probs, dq, dk, dv;
};

template <typename E>
Run<E> run_kernel(const AttentionCase& c, int64_t chunk, AttentionKind kind, const std::vector<E>& q,
                  const std::vector<E>& k, const std::vector<E>& v, const std::vector<E>& dout) {
  Run<E> r;
  r.out.assign(q.size(), E(3));  // not zero, so that a row left unwritten shows
  r.dq.assign(q.size(), E(3));
  r.dk.assign(k.size(), E(3));
  r.dv.assign(v.size(), E(3));
  r.lse.assign(c.B * c.H * c.T, E(3));
  if (kind == AttentionKind::materialized) r.probs.assign(c.B * c.H * c.T * c.T, E(3));
  run_or_throw(AttentionForwardParams<E>{.kind = kind, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D,
                                         .q = q.data(), .k = k.data(), .v = v.data(), .out = r.out.data(),
                                         .lse = r.lse.data(), .probs = r.probs.data(), .chunk = chunk});
  run_or_throw(AttentionBackwardParams<E>{.kind = kind, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv, .D = c.D,
                                          .q = q.data(), .k = k.data(), .v = v.data(), .out = r.out.data(),
                                          .lse = r.lse.data(), .probs = r.probs.data(), .dout = dout.data(),
                                          .dq = r.dq.data(), .dk = r.dk.data(), .dv = r.dv.data(), .chunk = chunk});
  return r;
}

class AttentionChunkTest : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(AttentionChunkTest, ForwardBackwardMatchFp64Reference) {
  const AttentionCase& c = GetParam().shape;
  const int64_t chunk = GetParam().chunk;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  auto q = rng.uniform<float>(nq, -2, 2), k = rng.uniform<float>(nkv, -2, 2);
  auto v = rng.uniform<float>(nkv), dout = rng.uniform<float>(nq);
  const auto id64 = [](double x) { return x; };
  const auto id32 = [](float x) { return x; };
  const auto ref = textbook_attention<double>(c, q, k, v, dout, id64, chunk);
  const auto naive = textbook_attention<float>(c, q, k, v, dout, id32, chunk);
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const auto got = run_kernel(c, chunk, kind, q, k, v, dout);
    expect_within_rule("out", got.out, naive.out, ref.out);
    expect_within_rule("lse", got.lse, naive.lse, ref.lse);
    // Exactly zero before each row's chunk and past its position.
    if (kind == AttentionKind::materialized) expect_within_rule("probs", got.probs, naive.probs, ref.probs);
    expect_within_rule("dq", got.dq, naive.dq, ref.dq);
    expect_within_rule("dk", got.dk, naive.dk, ref.dk);
    expect_within_rule("dv", got.dv, naive.dv, ref.dv);
  }
}

// The masked keys carry no gradient and the visible ones all of theirs.
TEST_P(AttentionChunkTest, GradientsMatchFiniteDifferences) {
  const AttentionCase& c = GetParam().shape;
  const int64_t chunk = GetParam().chunk;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  auto q = rng.uniform<double>(nq, -2, 2), k = rng.uniform<double>(nkv, -2, 2);
  auto v = rng.uniform<double>(nkv);
  const auto r_out = rng.uniform<double>(nq);
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const auto grads = run_kernel(c, chunk, kind, q, k, v, r_out);
    std::vector<double> out(nq), lse(c.B * c.H * c.T), probs(c.B * c.H * c.T * c.T);
    auto loss = [&] {
      run_or_throw(AttentionForwardParams<double>{.kind = kind, .B = c.B, .T = c.T, .H = c.H, .H_kv = c.H_kv,
                                                  .D = c.D, .q = q.data(), .k = k.data(), .v = v.data(),
                                                  .out = out.data(), .lse = lse.data(), .probs = probs.data(),
                                                  .chunk = chunk});
      return dot(r_out, out);
    };
    EXPECT_LE(fd_error(q, grads.dq, loss, rng), kFdTolerance) << "dq";
    EXPECT_LE(fd_error(k, grads.dk, loss, rng), kFdTolerance) << "dk";
    EXPECT_LE(fd_error(v, grads.dv, loss, rng), kFdTolerance) << "dv";
  }
}

// Context parallelism's calls: the queries cut into blocks at offsets that
// fall inside chunks, flash against every key block in turn (the ring: a
// block whose keys all precede a query block's chunks yields no key, lse
// -inf, and merges as nothing), materialized against each query block's key
// prefix (the all-gather), the backward of each pair accumulated. The merged
// whole is the chunked attention, within the rule of the fp64 reference.
TEST_P(AttentionChunkTest, BlocksOfTheSequenceMergeToTheWhole) {
  const AttentionCase& c = GetParam().shape;
  const int64_t chunk = GetParam().chunk;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D, nrow = c.B * c.H * c.T;
  auto q = rng.uniform<float>(nq, -2, 2), k = rng.uniform<float>(nkv, -2, 2);
  auto v = rng.uniform<float>(nkv), dout = rng.uniform<float>(nq);
  const auto ref = textbook_attention<double>(c, q, k, v, dout, [](double x) { return x; }, chunk);
  const auto naive = textbook_attention<float>(c, q, k, v, dout, [](float x) { return x; }, chunk);
  // Four blocks of unequal lengths (fewer when T is short).
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (offset, length)
  for (int64_t at = 0, i = 0; at < c.T; ++i) {
    const int64_t len = std::min(c.T - at, std::max<int64_t>(1, c.T * (i + 2) / 14 + 1));
    blocks.push_back({at, len});
    at += len;
  }
  ASSERT_GE(blocks.size(), 3u);
  const AttentionIndex at{c};
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const bool flash = kind == AttentionKind::flash;
    std::vector<float> out(nq, 0), lse(nrow, -INFINITY), dq(nq, 0), dk(nkv, 0), dv(nkv, 0);
    std::vector<std::vector<float>> probs(blocks.size());
    auto keys_of = [&](size_t qi, size_t kj) {
      return flash ? blocks[kj] : std::pair<int64_t, int64_t>{0, blocks[qi].first + blocks[qi].second};
    };
    for (size_t qi = 0; qi < blocks.size(); ++qi) {
      const auto [qo, tq] = blocks[qi];
      for (size_t kj = 0; kj < (flash ? blocks.size() : 1); ++kj) {
        const auto [ko, tk] = keys_of(qi, kj);
        std::vector<float> b_out(nq, 7), b_lse(nrow, 7);
        if (!flash) probs[qi].assign(c.B * c.H * tq * tk, 0);
        run_or_throw(AttentionForwardParams<float>{
            .kind = kind, .B = c.B, .T = tq, .H = c.H, .H_kv = c.H_kv, .D = c.D, .q = q.data() + at.q(0, qo, 0),
            .k = k.data() + at.kv(0, ko, 0), .v = v.data() + at.kv(0, ko, 0), .out = b_out.data() + at.q(0, qo, 0),
            .lse = b_lse.data() + qo, .probs = flash ? nullptr : probs[qi].data(), .Tk = tk, .q_offset = qo,
            .k_offset = ko, .q_batch_rows = c.T, .kv_batch_rows = c.T, .lse_batch_rows = c.T, .chunk = chunk});
        run_or_throw(AttentionMergeParams<float>{.B = c.B, .T = tq, .H = c.H, .D = c.D,
                                                 .out = out.data() + at.q(0, qo, 0), .lse = lse.data() + qo,
                                                 .part_out = b_out.data() + at.q(0, qo, 0),
                                                 .part_lse = b_lse.data() + qo, .q_batch_rows = c.T,
                                                 .lse_batch_rows = c.T});
      }
    }
    expect_within_rule("out", out, naive.out, ref.out);
    expect_within_rule("lse", lse, naive.lse, ref.lse);
    for (size_t qi = 0; qi < blocks.size(); ++qi) {
      const auto [qo, tq] = blocks[qi];
      for (size_t kj = 0; kj < (flash ? blocks.size() : 1); ++kj) {
        const auto [ko, tk] = keys_of(qi, kj);
        run_or_throw(AttentionBackwardParams<float>{
            .kind = kind, .B = c.B, .T = tq, .H = c.H, .H_kv = c.H_kv, .D = c.D, .q = q.data() + at.q(0, qo, 0),
            .k = k.data() + at.kv(0, ko, 0), .v = v.data() + at.kv(0, ko, 0), .out = out.data() + at.q(0, qo, 0),
            .lse = lse.data() + qo, .probs = flash ? nullptr : probs[qi].data(), .dout = dout.data() + at.q(0, qo, 0),
            .dq = dq.data() + at.q(0, qo, 0), .dk = dk.data() + at.kv(0, ko, 0), .dv = dv.data() + at.kv(0, ko, 0),
            .Tk = tk, .q_offset = qo, .k_offset = ko, .q_batch_rows = c.T, .kv_batch_rows = c.T,
            .lse_batch_rows = c.T, .chunk = chunk, .dq_write = Write::accumulate, .dkv_write = Write::accumulate});
      }
    }
    expect_within_rule("dq", dq, naive.dq, ref.dq);
    expect_within_rule("dk", dk, naive.dk, ref.dk);
    expect_within_rule("dv", dv, naive.dv, ref.dv);
  }
}

// Like the unchunked kernels, the chunked ones give the same bits on any
// thread count.
TEST_P(AttentionChunkTest, ResultsDoNotDependOnThreadCount) {
  const AttentionCase& c = GetParam().shape;
  const int64_t chunk = GetParam().chunk;
  Rng rng;
  SCOPED_TRACE(rng.trace());
  const int64_t nq = c.B * c.T * c.H * c.D, nkv = c.B * c.T * c.H_kv * c.D;
  auto q = rng.uniform<float>(nq, -2, 2), k = rng.uniform<float>(nkv, -2, 2);
  auto v = rng.uniform<float>(nkv), dout = rng.uniform<float>(nq);
  for (AttentionKind kind : kKinds) {
    SCOPED_TRACE(to_string(kind));
    const auto one = with_threads(1, [&] { return run_kernel(c, chunk, kind, q, k, v, dout); });
    const auto three = with_threads(3, [&] { return run_kernel(c, chunk, kind, q, k, v, dout); });
    EXPECT_EQ(one.out, three.out);
    EXPECT_EQ(one.dq, three.dq);
    EXPECT_EQ(one.dk, three.dk);
    EXPECT_EQ(one.dv, three.dv);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionChunkTest, ::testing::ValuesIn(chunk_cases()), case_name);

// Which calls the chunk changes: those with a query whose chunk starts after
// the call's first key (at or before that query). The CUDA kinds refuse
// exactly these.
TEST(AttentionChunk, MasksOnlyWhereAChunkStartsAfterTheFirstKey) {
  AttentionForwardParams<float> p{.B = 1, .T = 8, .H = 1, .H_kv = 1, .D = 4};
  EXPECT_FALSE(attention_chunk_masks(p));  // no chunk
  p.chunk = 8;
  EXPECT_FALSE(attention_chunk_masks(p));  // positions 0..7, one chunk
  p.chunk = 7;
  EXPECT_TRUE(attention_chunk_masks(p));  // position 7 starts a chunk
  p.q_offset = 16, p.k_offset = 14, p.Tk = 4, p.chunk = 8;
  EXPECT_TRUE(attention_chunk_masks(p));  // queries 16..23 in chunk 16.., keys from 14
  p.k_offset = 16;
  EXPECT_FALSE(attention_chunk_masks(p));  // keys from the chunk's start
  p.k_offset = 30;
  EXPECT_FALSE(attention_chunk_masks(p));  // keys after every query: the causal rule hides them
  p.chunk = -1;
  EXPECT_EQ(launch(p, Workspace{}), Status::invalid_argument);
}

}  // namespace
}  // namespace weft::kernels::test
