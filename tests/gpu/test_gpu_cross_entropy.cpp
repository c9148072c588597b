// cross_entropy on CUDA (bf16 logits) against the CPU backend: the three
// phases per vocabulary shard with the tp all-reduces done here on the host,
// ignored rows, logits far past exp's overflow, rows that start anywhere
// (odd V_local) and rows long enough for the 16-byte path; and an invalid
// target refused before the logits are overwritten.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/op_cases.h"

namespace weft::kernels::test {
namespace {

std::vector<CrossEntropyCase> gpu_cross_entropy_cases() {
  std::vector<CrossEntropyCase> cases = cross_entropy_cases();
  cases.push_back({"rows17_v4000_tp2_vector", 17, 4000, 2, 5, 4.0});
  cases.push_back({"rows9_v32001_tp3_ignore_odd_rows", 9, 32001, 3, 4, 6.0});
  return cases;
}

class GpuCrossEntropy : public ::testing::TestWithParam<CrossEntropyCase> {};

// The statistics and the loss of one backend, summed over the shards as the
// tp all-reduces would.
template <typename T>
struct Totals {
  std::vector<T> row_max, sum_exp, loss;
};

TEST_P(GpuCrossEntropy, PhasesPerShard) {
  const CrossEntropyCase& c = GetParam();
  constexpr int32_t kIgnore = -100;
  const double scale = 1.0 / double(c.rows);
  Rng rng;
  SCOPED_TRACE(rng.trace());
  std::vector<int32_t> targets(c.rows);
  for (int64_t r = 0; r < c.rows; ++r)
    targets[r] = c.ignore_every > 0 && r % c.ignore_every == 1 ? kIgnore : int32_t(rng.index(c.V));
  DeviceArray<int32_t> d_targets(targets);

  std::vector<Bf16Values> logits;
  for (int64_t rank = 0; rank < c.shards; ++rank)
    logits.push_back(random_bf16(rng, c.rows * shard_of(c.V, c.shards, rank).size, -c.logit_range,
                                 c.logit_range));

  Totals<double> ref{std::vector<double>(c.rows, -INFINITY), std::vector<double>(c.rows, 0.0),
                     std::vector<double>(c.rows, 0.0)};
  Totals<float> cpu{std::vector<float>(c.rows, -INFINITY), std::vector<float>(c.rows, 0.0f),
                    std::vector<float>(c.rows, 0.0f)};
  Totals<float> gpu = cpu;
  std::vector<std::vector<double>> grad_ref(c.shards);
  std::vector<std::vector<float>> grad_cpu(c.shards);
  std::vector<std::unique_ptr<DeviceArray<bf16>>> d_logits;
  for (int64_t rank = 0; rank < c.shards; ++rank) {
    grad_ref[rank] = logits[rank].d;
    grad_cpu[rank] = logits[rank].f;
    d_logits.push_back(std::make_unique<DeviceArray<bf16>>(logits[rank].bits));
  }

  // Phase (a) on every shard, then the max over shards.
  for (int64_t rank = 0; rank < c.shards; ++rank) {
    const int64_t V_local = shard_of(c.V, c.shards, rank).size;
    std::vector<double> m_ref(c.rows);
    std::vector<float> m_cpu(c.rows);
    ASSERT_EQ(run(CrossEntropyMaxParams<double>{c.rows, V_local, grad_ref[rank].data(), m_ref.data()}),
              Status::ok);
    ASSERT_EQ(run(CrossEntropyMaxParams<float>{c.rows, V_local, grad_cpu[rank].data(), m_cpu.data()}),
              Status::ok);
    DeviceArray<float> m_gpu(c.rows);
    ASSERT_EQ(run_cuda(CrossEntropyMaxParams<bf16>{c.rows, V_local, d_logits[rank]->data(), m_gpu.data()}),
              Status::ok);
    const std::vector<float> m = m_gpu.download();
    // The max of bf16 values is one of them: exact on every backend.
    EXPECT_EQ(m, m_cpu) << "row max, shard " << rank;
    for (int64_t r = 0; r < c.rows; ++r) {
      ref.row_max[r] = std::max(ref.row_max[r], m_ref[r]);
      cpu.row_max[r] = std::max(cpu.row_max[r], m_cpu[r]);
      gpu.row_max[r] = std::max(gpu.row_max[r], m[r]);
    }
  }

  // Phase (b), then the sum over shards.
  DeviceArray<float> d_row_max(gpu.row_max);
  for (int64_t rank = 0; rank < c.shards; ++rank) {
    const int64_t V_local = shard_of(c.V, c.shards, rank).size;
    std::vector<double> s_ref(c.rows);
    std::vector<float> s_cpu(c.rows);
    ASSERT_EQ(run(CrossEntropySumExpParams<double>{c.rows, V_local, grad_ref[rank].data(),
                                                   ref.row_max.data(), s_ref.data()}),
              Status::ok);
    ASSERT_EQ(run(CrossEntropySumExpParams<float>{c.rows, V_local, grad_cpu[rank].data(),
                                                  cpu.row_max.data(), s_cpu.data()}),
              Status::ok);
    DeviceArray<float> s_gpu(c.rows);
    ASSERT_EQ(run_cuda(CrossEntropySumExpParams<bf16>{c.rows, V_local, d_logits[rank]->data(),
                                                      d_row_max.data(), s_gpu.data()}),
              Status::ok);
    expect_fp32_rule("sum_exp of shard " + std::to_string(rank), s_gpu.download(), s_cpu, s_ref);
    const std::vector<float> s = s_gpu.download();
    for (int64_t r = 0; r < c.rows; ++r) {
      ref.sum_exp[r] += s_ref[r];
      cpu.sum_exp[r] += s_cpu[r];
      gpu.sum_exp[r] += s[r];
    }
  }

  // Phase (c): loss and gradient per shard; the loss sums over shards.
  DeviceArray<float> d_sum_exp(gpu.sum_exp);
  for (int64_t rank = 0; rank < c.shards; ++rank) {
    const Shard sh = shard_of(c.V, c.shards, rank);
    std::vector<double> l_ref(c.rows);
    std::vector<float> l_cpu(c.rows);
    ASSERT_EQ(run(CrossEntropyLossGradParams<double>{c.rows, c.V, sh.start, sh.size, grad_ref[rank].data(),
                                                     targets.data(), ref.row_max.data(),
                                                     ref.sum_exp.data(), l_ref.data(), scale, kIgnore}),
              Status::ok);
    ASSERT_EQ(run(CrossEntropyLossGradParams<float>{c.rows, c.V, sh.start, sh.size, grad_cpu[rank].data(),
                                                    targets.data(), cpu.row_max.data(),
                                                    cpu.sum_exp.data(), l_cpu.data(), scale, kIgnore}),
              Status::ok);
    DeviceArray<float> l_gpu(c.rows);
    ASSERT_EQ(run_cuda(CrossEntropyLossGradParams<bf16>{c.rows, c.V, sh.start, sh.size,
                                                        d_logits[rank]->data(), d_targets.data(),
                                                        d_row_max.data(), d_sum_exp.data(),
                                                        l_gpu.data(), scale, kIgnore}),
              Status::ok);
    const std::vector<float> l = l_gpu.download();
    for (int64_t r = 0; r < c.rows; ++r) {
      ref.loss[r] += l_ref[r];
      cpu.loss[r] += l_cpu[r];
      gpu.loss[r] += l[r];
    }
    const std::vector<bf16> grad = d_logits[rank]->download();
    expect_bf16_rule("gradient of shard " + std::to_string(rank), grad, grad_cpu[rank], grad_ref[rank]);
    for (int64_t r = 0; r < c.rows; ++r) {
      if (targets[r] != kIgnore) continue;
      for (int64_t j = 0; j < sh.size; ++j)
        ASSERT_EQ(grad[r * sh.size + j].bits, 0) << "ignored row " << r << " column " << j;
    }
  }
  expect_fp32_rule("loss", gpu.loss, cpu.loss, ref.loss);
}

TEST_P(GpuCrossEntropy, InvalidTargetThrowsBeforeWriting) {
  const CrossEntropyCase& c = GetParam();
  Rng rng;
  SCOPED_TRACE(rng.trace());
  std::vector<int32_t> targets(c.rows, 0);
  targets[rng.index(c.rows)] = int32_t(c.V) + 3;
  const Bf16Values logits = random_bf16(rng, c.rows * c.V);
  DeviceArray<int32_t> d_targets(targets);
  DeviceArray<bf16> d_logits(logits.bits);
  DeviceArray<float> row_max(std::vector<float>(c.rows, 1.0f)), sum_exp(std::vector<float>(c.rows, 2.0f));
  EXPECT_THROW((void)run_cuda(CrossEntropyLossGradParams<bf16>{c.rows, c.V, 0, c.V, d_logits.data(),
                                                               d_targets.data(), row_max.data(),
                                                               sum_exp.data(), nullptr, 1.0, -100}),
               InputError);
  expect_same_bits("logits after the refusal", d_logits.download(), logits.bits);
}

// A vocabulary padded for tp (32001 ids as 32256 rows, tp 2): the padding's
// logits are larger than any real one, and get no probability: the CUDA
// loss and gradient follow the CPU backend's (itself checked against fp64 on
// the CPU) by the rules, and the padding's gradient is exactly zero.
TEST(GpuCrossEntropyPadded, PaddingGetsNoProbability) {
  constexpr int32_t kIgnore = -100;
  const int64_t rows = 9, V = 32001, tp = 2, Vl = 32256 / tp;
  const double scale = 1.0 / double(rows);
  Rng rng;
  SCOPED_TRACE(rng.trace());
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) targets[size_t(r)] = r % 4 == 1 ? kIgnore : int32_t(rng.index(V));
  DeviceArray<int32_t> d_targets(targets);
  std::vector<Bf16Values> logits;
  for (int64_t rank = 0; rank < tp; ++rank) {
    std::vector<double> x = rng.uniform<double>(rows * Vl, -6.0, 6.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = valid_columns(V, rank * Vl, Vl); j < Vl; ++j) x[size_t(r * Vl + j)] = 18.0;
    logits.push_back(bf16_values(x));
  }
  std::vector<double> m_ref(size_t(rows), -INFINITY), s_ref(size_t(rows), 0.0), l_ref(size_t(rows), 0.0);
  std::vector<float> m_cpu(size_t(rows), -INFINITY), s_cpu(size_t(rows), 0.0f), l_cpu(size_t(rows), 0.0f);
  std::vector<float> m_gpu(size_t(rows), -INFINITY), s_gpu(size_t(rows), 0.0f), l_gpu(size_t(rows), 0.0f);
  std::vector<std::unique_ptr<DeviceArray<bf16>>> d_logits;
  for (const auto& x : logits) d_logits.push_back(std::make_unique<DeviceArray<bf16>>(x.bits));
  std::vector<double> pd(static_cast<size_t>(rows));
  std::vector<float> pf(static_cast<size_t>(rows));
  DeviceArray<float> dstat(std::vector<float>(size_t(rows), 0.0f));
  for (int64_t rank = 0; rank < tp; ++rank) {  // (a), then the max over shards
    const int64_t valid = valid_columns(V, rank * Vl, Vl);
    ASSERT_EQ(run(CrossEntropyMaxParams<double>{rows, Vl, logits[size_t(rank)].d.data(), pd.data(), valid}), Status::ok);
    for (int64_t r = 0; r < rows; ++r) m_ref[size_t(r)] = std::max(m_ref[size_t(r)], pd[size_t(r)]);
    ASSERT_EQ(run(CrossEntropyMaxParams<float>{rows, Vl, logits[size_t(rank)].f.data(), pf.data(), valid}), Status::ok);
    for (int64_t r = 0; r < rows; ++r) m_cpu[size_t(r)] = std::max(m_cpu[size_t(r)], pf[size_t(r)]);
    ASSERT_EQ(run_cuda(CrossEntropyMaxParams<bf16>{rows, Vl, d_logits[size_t(rank)]->data(), dstat.data(), valid}),
              Status::ok);
    const std::vector<float> g = dstat.download();
    for (int64_t r = 0; r < rows; ++r) m_gpu[size_t(r)] = std::max(m_gpu[size_t(r)], g[size_t(r)]);
  }
  EXPECT_EQ(m_gpu, m_cpu) << "a max of bf16 values is exact";
  DeviceArray<float> d_max(m_gpu);
  for (int64_t rank = 0; rank < tp; ++rank) {  // (b), then the sum over shards
    const int64_t valid = valid_columns(V, rank * Vl, Vl);
    ASSERT_EQ(run(CrossEntropySumExpParams<double>{rows, Vl, logits[size_t(rank)].d.data(), m_ref.data(), pd.data(),
                                                   valid}),
              Status::ok);
    ASSERT_EQ(run(CrossEntropySumExpParams<float>{rows, Vl, logits[size_t(rank)].f.data(), m_cpu.data(), pf.data(),
                                                  valid}),
              Status::ok);
    ASSERT_EQ(run_cuda(CrossEntropySumExpParams<bf16>{rows, Vl, d_logits[size_t(rank)]->data(), d_max.data(),
                                                      dstat.data(), valid}),
              Status::ok);
    const std::vector<float> g = dstat.download();
    for (int64_t r = 0; r < rows; ++r) {
      s_ref[size_t(r)] += pd[size_t(r)];
      s_cpu[size_t(r)] += pf[size_t(r)];
      s_gpu[size_t(r)] += g[size_t(r)];
    }
  }
  expect_fp32_rule("sum of exponentials", s_gpu, s_cpu, s_ref);
  DeviceArray<float> d_sum(s_gpu), d_loss(std::vector<float>(size_t(rows), 0.0f));
  for (int64_t rank = 0; rank < tp; ++rank) {  // (c)
    auto grad_ref = logits[size_t(rank)].d;
    auto grad_cpu = logits[size_t(rank)].f;
    ASSERT_EQ(run(CrossEntropyLossGradParams<double>{rows, V, rank * Vl, Vl, grad_ref.data(), targets.data(),
                                                     m_ref.data(), s_ref.data(), pd.data(), scale, kIgnore}),
              Status::ok);
    ASSERT_EQ(run(CrossEntropyLossGradParams<float>{rows, V, rank * Vl, Vl, grad_cpu.data(), targets.data(),
                                                    m_cpu.data(), s_cpu.data(), pf.data(), scale, kIgnore}),
              Status::ok);
    ASSERT_EQ(run_cuda(CrossEntropyLossGradParams<bf16>{rows, V, rank * Vl, Vl, d_logits[size_t(rank)]->data(),
                                                        d_targets.data(), d_max.data(), d_sum.data(), d_loss.data(),
                                                        scale, kIgnore}),
              Status::ok);
    const std::vector<float> l = d_loss.download();
    for (int64_t r = 0; r < rows; ++r) {
      l_ref[size_t(r)] += pd[size_t(r)];
      l_cpu[size_t(r)] += pf[size_t(r)];
      l_gpu[size_t(r)] += l[size_t(r)];
    }
    const std::vector<bf16> grad = d_logits[size_t(rank)]->download();
    expect_bf16_rule("gradient of shard " + std::to_string(rank), grad, grad_cpu, grad_ref);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = valid_columns(V, rank * Vl, Vl); j < Vl; ++j)
        ASSERT_EQ(grad[size_t(r * Vl + j)].bits, 0) << "padding row " << r << " column " << j;
  }
  expect_fp32_rule("loss", l_gpu, l_cpu, l_ref);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuCrossEntropy, ::testing::ValuesIn(gpu_cross_entropy_cases()),
                         CaseName());

}  // namespace
}  // namespace weft::kernels::test
