// An MoE model (Mixtral's form: 8 layers of 4 experts, top-2; Llama 4's
// FFN: sigmoid top-1 on the expert's input, a shared expert, MoE layers
// interleaved with dense ones; Qwen3-MoE with its q and k norms; Llama 4's
// text model with its NoPE layers, temperature and QK L2 norm) trained 5
// steps from one seed under tensor (with and without sp), context,
// pipeline, interleaved and data-parallel layouts, ZeRO 0-3 and the
// checkpointing modes, with real mpirun ranks: the same losses and
// balancing losses as one rank within a relative 1e-5 (fp32), and every
// rank's arena the memory model's per category. The balancing loss is over
// each micro-batch (as in transformers and Megatron), so every layout keeps
// the reference's micro-batch of 1. Under pp the global loss's statistics
// travel with the micro-batch's activations and gradients
// (LlamaStage::moe_stats_travel). A capacity's drops match wherever the
// ranks route the reference's rows. Prints the tables.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "mpi_env.h"
#include "parity_fixture.h"

namespace weft::test {
namespace {

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

constexpr const char* kMixtral = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 8,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": false, "num_local_experts": 4, "num_experts_per_tok": 2,
  "router_aux_loss_coef": 0.05})";

// Llama 4's text model without its attention variants (no NoPE layers, no
// chunked attention, no QK norm, no temperature): its FFN alone.
constexpr const char* kLlama4Ffn = R"({"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 96,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false, "num_local_experts": 4,
  "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "router_aux_loss_coef": 0.05,
  "no_rope_layers": [1, 1, 1, 1, 1, 1, 1, 1], "attention_chunk_size": null, "use_qk_norm": false,
  "attn_temperature_tuning": false, "rope_scaling": null})";

// parity_row for each layout, and the balancing losses against the
// reference's (`ref_aux`, the same rule), in a column of their own.
// Qwen3-MoE: RMS norms of each head's queries and keys (whole on every tp
// rank, their gradients summed over tp), renormalised top-2, a dense layer.
constexpr const char* kQwen3 = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false, "num_experts": 4,
  "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [3],
  "router_aux_loss_coef": 0.05})";

// Llama 4's text model whole: every layer MoE, NoPE every 4th layer with
// the attention temperature (floor 4, so it changes inside the sequence of
// 16), the QK L2 norm in the RoPE layers, and a chunk of 16, the sequence
// (attention within chunks past it is refused).
constexpr const char* kLlama4 = R"({"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 96,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false, "num_local_experts": 4,
  "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "router_aux_loss_coef": 0.05,
  "attention_chunk_size": 16, "use_qk_norm": true, "attn_temperature_tuning": true, "floor_scale": 4,
  "attn_scale": 0.1, "rope_scaling": null})";

std::string table_of(Fixture& f, const std::vector<double>& ref, const std::vector<std::string>& layouts,
                     const std::string& extra) {
  const std::vector<double> ref_aux = f.aux_losses;
  EXPECT_EQ(ref_aux.size(), ref.size());
  std::string table = fmt::format("{:<62} {:>5} {:>12} {:>14} {:>12}\n", "layout", "ranks", "max rel dev",
                                  "worst mem dev", "aux rel dev");
  for (const auto& layout : layouts) {
    std::string row = parity_row(f, ref, layout, 1e-5, 1e-5, extra);
    const double aux = max_rel(f.aux_losses, ref_aux);
    EXPECT_LE(aux, 1e-5) << layout << ": the balancing loss";
    row.pop_back();
    table += fmt::format("{} {:>12.2e}\n", row, aux);
  }
  return table;
}

TEST(MoeParity, GlobalBalancingLossOverDataAndPipelineRanks) {
  Fixture f(false, kMixtral);
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp1-dp2-mb1", "tp1-pp1-dp2-mb1-zero1", "tp1-pp1-dp2-mb1-zero2-ckpt:full",
                              "tp1-pp1-dp4-mb1-zero3-ckpt:ffn", "tp1-pp1-dp2-mb1-zero3-ckpt:selective",
                              "tp1-pp2-dp1-mb1", "tp1-pp2-dp1-mb1-vpp2", "tp1-pp4-dp1-mb1-vpp2-ckpt:full@2",
                              "tp1-pp2-dp2-mb1-zero1", "tp2-pp2-dp1-mb1-sp-ckpt:selective"},
                             "")
                        .c_str());
}

TEST(MoeParity, PerLayerBalancingLossOverPipelineStages) {
  Fixture f(false, kMixtral);
  const std::string scope = "--moe-aux-scope per_layer";
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"), scope);
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp2-dp1-mb1", "tp1-pp2-dp1-mb1-vpp2", "tp1-pp4-dp1-mb1-vpp2-ckpt:full@2",
                              "tp1-pp2-dp2-mb1-zero1", "tp1-pp2-dp2-mb1-zero3-ckpt:ffn"},
                             scope)
                        .c_str());
  // The scope changes the objective: the same run under the global loss differs.
  const auto global = f.train("tp1-pp1-dp1-mb1", f.dir.path("global"));
  ASSERT_EQ(global.size(), 5u);
  EXPECT_NE(global[4], ref[4]);
}

// A capacity caps each expert's choices per micro-batch of the rows a rank
// routes: layouts that keep the reference's rows on every rank (dp, ZeRO,
// pp, vpp, tp without sp) drop the same choices and match it; sp and cp
// split the rows, so they drop others (as in Megatron) and are not compared.
TEST(MoeParity, CapacityOverDataPipelineAndTensorRanks) {
  Fixture f(false, kMixtral);
  const std::string capacity = "--moe-capacity-factor 0.5";
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"), capacity);
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp1-dp2-mb1-zero1", "tp1-pp2-dp1-mb1-vpp2", "tp1-pp2-dp2-mb1-zero3-ckpt:ffn",
                              "tp2-pp1-dp1-mb1"},
                             capacity)
                        .c_str());
  // The capacity binds: the dropless run's losses differ.
  const auto dropless = f.train("tp1-pp1-dp1-mb1", f.dir.path("dropless"));
  ASSERT_EQ(dropless.size(), 5u);
  EXPECT_NE(dropless[4], ref[4]);
}

// Under tp the experts are whole on every rank: with sp each routes its own
// rows (their gradients summed over tp), without it all rows alike; under cp
// each routes its chunks. The router's statistics are summed over the ranks
// that split the micro-batch, so the balancing loss is the single rank's.
TEST(MoeParity, TensorAndContextParallelism) {
  for (const char* config : {kMixtral, kLlama4Ffn, kQwen3, kLlama4}) {
    Fixture f(false, config);
    const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"));
    ASSERT_EQ(ref.size(), 5u);
    std::printf("%s", table_of(f, ref,
                               {"tp2-pp1-dp1-mb1", "tp2-pp1-dp1-mb1-sp", "tp1-cp2-pp1-dp1-mb1-cp:ring",
                                "tp1-cp2-pp1-dp1-mb1-ckpt:full-cp:a2a", "tp2-cp2-pp1-dp1-mb1-sp-cp:allgather",
                                "tp2-pp1-dp2-mb1-sp-zero1-ckpt:ffn", "tp1-cp2-pp1-dp2-mb1-zero3-cp:ring"},
                               "")
                          .c_str());
  }
}

// Expert parallelism: the experts split over ep ranks of dp x cp, each rank
// routing its own rows and sending each choice to the rank holding its
// expert. The experts' gradients sum over the ranks holding the same ones,
// the rest over every dp x cp rank, under each ZeRO stage, with tp (with
// and without sp), cp, pp and vpp beside it.
TEST(MoeParity, ExpertParallelism) {
  for (const char* config : {kMixtral, kLlama4Ffn}) {
    Fixture f(false, config);
    const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"));
    ASSERT_EQ(ref.size(), 5u);
    std::printf("%s", table_of(f, ref,
                               {"tp1-pp1-dp2-ep2-mb1", "tp1-pp1-dp4-ep4-mb1-zero1", "tp1-pp1-dp4-ep2-mb1-zero1",
                                "tp1-pp1-dp4-ep2-mb1-zero2-ckpt:full", "tp1-pp1-dp4-ep2-mb1-zero3-ckpt:ffn",
                                "tp2-pp1-dp2-ep2-mb1-sp", "tp2-pp1-dp2-ep2-mb1-nosp-zero3",
                                "tp1-cp2-pp1-dp1-ep2-mb1-cp:ring", "tp1-pp2-dp2-ep2-mb1-vpp2-ckpt:selective"},
                               "")
                          .c_str());
  }
}

}  // namespace
}  // namespace weft::test
