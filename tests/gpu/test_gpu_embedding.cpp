// embedding on CUDA (bf16) against the CPU backend: the forward gather bit
// for bit, the backward scatter-add (with many repeated tokens) into the fp32
// table gradient by the rule and bit for bit (both backends add each entry's
// rows in row order, starting from the entry), and into a bf16 one
// (grad:bf16) as the rounding of the CPU's fp32 sum from the same bf16
// start, per vocabulary shard; and an invalid token id refused before
// anything is written.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "kernels/embedding/embedding.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

std::vector<EmbeddingCase> gpu_embedding_cases() {
  std::vector<EmbeddingCase> cases = embedding_cases();
  cases.push_back({"rows300_c256_v50_tp2_vector", 300, 256, 50, 2});
  cases.push_back({"rows2000_c1032_v7_long_runs_vector", 2000, 1032, 7, 1});
  return cases;
}

class GpuEmbedding : public ::testing::TestWithParam<EmbeddingCase> {};

TEST_P(GpuEmbedding, ForwardBackwardPerShard) {
  const EmbeddingCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  std::vector<int32_t> tokens(c.rows);
  for (int32_t& t : tokens) t = int32_t(rng.index(c.V));
  const Bf16Values dout = random_bf16(rng, c.rows * c.C);
  DeviceArray<int32_t> d_tokens(tokens);
  DeviceArray<bf16> d_dout(dout.bits);
  for (int64_t rank = 0; rank < c.shards; ++rank) {
    SCOPED_TRACE("shard " + std::to_string(rank));
    const Shard s = shard_of(c.V, c.shards, rank);
    const Bf16Values table = random_bf16(rng, s.size * c.C);
    const std::vector<float> dtable = rng.uniform<float>(s.size * c.C);

    std::vector<float> out_cpu(c.rows * c.C);
    ASSERT_EQ(run(EmbeddingForwardParams<float>{c.rows, c.C, c.V, s.start, s.size, tokens.data(),
                                                table.f.data(), out_cpu.data()}),
              Status::ok);
    DeviceArray<bf16> d_table(table.bits), out(c.rows * c.C);
    ASSERT_EQ(run_cuda(EmbeddingForwardParams<bf16>{c.rows, c.C, c.V, s.start, s.size,
                                                    d_tokens.data(), d_table.data(), out.data()}),
              Status::ok);
    std::vector<bf16> want;
    for (float v : out_cpu) want.push_back(float_to_bf16(v));
    expect_same_bits("out", out.download(), want);

    std::vector<double> dtable_ref = cast<double>(dtable);
    std::vector<float> dtable_cpu = dtable;
    ASSERT_EQ(run(EmbeddingBackwardParams<double>{c.rows, c.C, c.V, s.start, s.size, tokens.data(),
                                                  dout.d.data(), dtable_ref.data()}),
              Status::ok);
    ASSERT_EQ(run(EmbeddingBackwardParams<float>{c.rows, c.C, c.V, s.start, s.size, tokens.data(),
                                                 dout.f.data(), dtable_cpu.data()}),
              Status::ok);
    DeviceArray<float> d_dtable(dtable);
    ASSERT_EQ(run_cuda(EmbeddingBackwardParams<bf16>{c.rows, c.C, c.V, s.start, s.size,
                                                     d_tokens.data(), d_dout.data(), d_dtable.data()}),
              Status::ok);
    const std::vector<float> got = d_dtable.download();
    expect_fp32_rule("dtable", got, dtable_cpu, dtable_ref);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], dtable_cpu[i]) << "dtable: element " << i << " differs from the CPU's";

    // bf16 table gradient: the fp32 sum from the bf16 start, rounded once.
    const Bf16Values dtable16 = random_bf16(rng, s.size * c.C);
    std::vector<double> ref16 = dtable16.d;
    std::vector<float> cpu16 = dtable16.f;
    ASSERT_EQ(run(EmbeddingBackwardParams<double>{c.rows, c.C, c.V, s.start, s.size, tokens.data(),
                                                  dout.d.data(), ref16.data()}),
              Status::ok);
    ASSERT_EQ(run(EmbeddingBackwardParams<float>{c.rows, c.C, c.V, s.start, s.size, tokens.data(),
                                                 dout.f.data(), cpu16.data()}),
              Status::ok);
    DeviceArray<bf16> d_dtable16(dtable16.bits);
    ASSERT_EQ(run_cuda(EmbeddingBackwardParams<bf16, bf16>{c.rows, c.C, c.V, s.start, s.size,
                                                           d_tokens.data(), d_dout.data(),
                                                           d_dtable16.data()}),
              Status::ok);
    const std::vector<bf16> got16 = d_dtable16.download();
    expect_bf16_rule("dtable (bf16)", got16, cpu16, ref16);
    std::vector<bf16> want16;
    for (float v : cpu16) want16.push_back(float_to_bf16(v));
    expect_same_bits("dtable (bf16)", got16, want16);
  }
}

TEST_P(GpuEmbedding, InvalidTokenThrowsBeforeWriting) {
  const EmbeddingCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  std::vector<int32_t> tokens(c.rows, 0);
  const int64_t bad = rng.index(c.rows);
  tokens[bad] = int32_t(c.V);
  if (bad + 1 < c.rows) tokens[c.rows - 1] = -1;  // a later offender is not the one reported
  DeviceArray<int32_t> d_tokens(tokens);
  DeviceArray<bf16> table(c.V * c.C), out(c.rows * c.C), dout(c.rows * c.C);
  DeviceArray<float> dtable(c.V * c.C);
  try {
    (void)run_cuda(EmbeddingForwardParams<bf16>{c.rows, c.C, c.V, 0, c.V, d_tokens.data(),
                                                table.data(), out.data()});
    ADD_FAILURE() << "forward accepted token id " << c.V;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("position " + std::to_string(bad)), std::string::npos)
        << e.what();
  }
  dtable.upload(std::vector<float>(c.V * c.C, 1.0f));
  EXPECT_THROW((void)run_cuda(EmbeddingBackwardParams<bf16>{c.rows, c.C, c.V, 0, c.V, d_tokens.data(),
                                                            dout.data(), dtable.data()}),
               InputError);
  for (bf16 v : out.download()) ASSERT_EQ(v.bits, 0xffff) << "the forward wrote before refusing";
  for (float v : dtable.download()) ASSERT_EQ(v, 1.0f) << "the backward wrote before refusing";
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuEmbedding, ::testing::ValuesIn(gpu_embedding_cases()), CaseName());

}  // namespace
}  // namespace weft::kernels::test
