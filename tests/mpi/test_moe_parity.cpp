// An MoE model (Mixtral's form: 8 layers of 4 experts, top-2) trained 5
// steps from one seed under pipeline, interleaved and data-parallel layouts,
// ZeRO 0-3 and the checkpointing modes, with real mpirun ranks: the same
// losses as one rank within a relative 1e-5 (fp32), and every rank's arena
// the memory model's per category. The balancing loss is over each
// micro-batch (as in transformers and Megatron), so every layout keeps the
// reference's micro-batch of 1; the global loss trains over dp, the
// per-layer one also over pp (trainer::require_moe_layout). Prints the table.
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

std::string table_of(Fixture& f, const std::vector<double>& ref, const std::vector<std::string>& layouts,
                     const std::string& extra) {
  std::string table = fmt::format("{:<62} {:>5} {:>12} {:>14}\n", "layout", "ranks", "max rel dev", "worst mem dev");
  for (const auto& layout : layouts) table += parity_row(f, ref, layout, 1e-5, 1e-5, extra);
  return table;
}

TEST(MoeParity, GlobalBalancingLossOverDataParallelRanks) {
  Fixture f(false, kMixtral);
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp1-dp2-mb1", "tp1-pp1-dp2-mb1-zero1", "tp1-pp1-dp2-mb1-zero2-ckpt:full",
                              "tp1-pp1-dp4-mb1-zero3-ckpt:ffn", "tp1-pp1-dp2-mb1-zero3-ckpt:selective"},
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

}  // namespace
}  // namespace weft::test
