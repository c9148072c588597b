#include "tests/unit/kernels/op_cases.h"

#include <algorithm>

namespace weft::kernels::test {

const std::vector<GemmCase>& gemm_cases() {
  static const std::vector<GemmCase> cases = {
      {"nn_5x3x7", Trans::no, Trans::no, 5, 3, 7, 1, 1.0, 0.0},
      {"nt_13x37x11", Trans::no, Trans::yes, 13, 37, 11, 1, 1.0, 0.0},
      {"tn_37x13x5_beta1", Trans::yes, Trans::no, 37, 13, 5, 1, 1.0, 1.0},
      {"tt_6x11x113_alpha", Trans::yes, Trans::yes, 6, 11, 113, 1, -0.5, 0.25},
      {"batched3_nt_13x8x6", Trans::no, Trans::yes, 13, 8, 6, 3, 1.0, 0.0},
      {"batched2_tn_5x7x13_beta1", Trans::yes, Trans::no, 5, 7, 13, 2, 1.0, 1.0},
  };
  return cases;
}

const std::vector<AttentionCase>& attention_cases() {
  static const std::vector<AttentionCase> cases = {
      {"b2_t5_h4_kv2_d8", 2, 5, 4, 2, 8},
      {"b2_t13_h4_kv1_d6", 2, 13, 4, 1, 6},
      {"b2_t13_h4_kv4_d8", 2, 13, 4, 4, 8},
      {"b1_t1_h4_kv2_d6", 1, 1, 4, 2, 6},
      {"b1_t113_h4_kv2_d8_query_blocks", 1, 113, 4, 2, 8},
      {"b2_t130_h2_kv1_d5_last_block_of_2", 2, 130, 2, 1, 5},
  };
  return cases;
}

const std::vector<NormCase>& norm_cases() {
  static const std::vector<NormCase> cases = {
      {"rows10_c37", 10, 37, 1e-6},
      {"rows7_c3", 7, 3, 1e-5},
      {"rows26_c130_three_column_blocks", 26, 130, 1e-6},
      {"rows257_c130_parallel", 257, 130, 1e-6},
  };
  return cases;
}

const std::vector<RopeCase>& rope_cases() {
  static const std::vector<RopeCase> cases = {
      {"b2_t5_h4_kv2_d8", 2, 5, 4, 2, 8, 0, 10000.0},
      {"b2_t13_h4_kv1_d6_offset7", 2, 13, 4, 1, 6, 7, 10000.0},
      {"b1_t113_h4_kv2_d8_offset1000_theta5e5", 1, 113, 4, 2, 8, 1000, 500000.0},
      {"b4_t257_h4_kv2_d8_parallel", 4, 257, 4, 2, 8, 3, 10000.0},
      // Llama 3 scaling with every region hit. D = 16, theta 1e4: wavelengths
      // 6.3, 20, 63 (kept: < 1024/8), 199, 628 (interpolated), 1987, 6283,
      // 19869 (divided by 8: > 1024/1).
      {"b2_t37_h4_kv2_d16_offset5_llama3", 2, 37, 4, 2, 16, 5, 10000.0,
       rope_scaling_llama3(8.0, 1.0, 8.0, 1024)},
      // D = 6: wavelengths 6.3 (kept: < 2048/16), 135 (interpolated), 2916
      // (divided by 4: > 2048/2).
      {"b1_t29_h2_kv1_d6_offset300_llama3", 1, 29, 2, 1, 6, 300, 10000.0,
       rope_scaling_llama3(4.0, 2.0, 16.0, 2048)},
  };
  return cases;
}

const std::vector<SwigluCase>& swiglu_cases() {
  static const std::vector<SwigluCase> cases = {
      {"rows10_f37", 10, 37},
      {"rows3_f113", 3, 113},
      {"rows1_f5", 1, 5},
      {"rows300_f113_parallel", 300, 113},
  };
  return cases;
}

const std::vector<EmbeddingCase>& embedding_cases() {
  static const std::vector<EmbeddingCase> cases = {
      {"rows26_c37_v11", 26, 37, 11, 1},
      {"rows26_c37_v11_tp2", 26, 37, 11, 2},
      {"rows13_c130_v11_tp3_three_column_blocks", 13, 130, 11, 3},
      {"rows300_c130_v11_tp2_parallel", 300, 130, 11, 2},
  };
  return cases;
}

const std::vector<CrossEntropyCase>& cross_entropy_cases() {
  static const std::vector<CrossEntropyCase> cases = {
      {"rows10_v11", 10, 11, 1, 0, 3.0},
      {"rows26_v11_tp2_ignore", 26, 11, 2, 4, 3.0},
      {"rows13_v113_tp3_ignore", 13, 113, 3, 5, 3.0},
      {"rows5_v37_tp2_logits_past_exp_overflow", 5, 37, 2, 0, 100.0},
      {"rows300_v331_tp2_ignore_parallel", 300, 331, 2, 7, 3.0},
  };
  return cases;
}

const std::vector<AdamwCase>& adamw_cases() {
  static const std::vector<AdamwCase> cases = {
      {"three_tensors_step1", {37, 5, 113}, 1, 0.1, 1.0},
      {"two_tensors_step7_clipped", {13, 3}, 7, 0.01, 0.37},
      {"no_decay_step1000", {11}, 1000, 0.0, 1.0},
      {"large_tensor_parallel", {40000, 7}, 3, 0.1, 1.0},
  };
  return cases;
}

const std::vector<ElementwiseCase>& elementwise_cases() {
  static const std::vector<ElementwiseCase> cases = {
      {"n1", 1},
      {"n37", 37},
      {"n113", 113},
      {"n40000_three_sum_chunks", 40000},
  };
  return cases;
}

Shard shard_of(int64_t n, int64_t shards, int64_t rank) {
  const int64_t base = n / shards, extra = n % shards;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

}  // namespace weft::kernels::test
