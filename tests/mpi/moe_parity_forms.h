// The MoE parity tests' model forms (config.json texts of tiny Mixtral,
// Qwen3-MoE and Llama 4 models) and their tables against one rank, shared by
// test_moe_parity.cpp and test_moe_parity_fp8.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "parity_fixture.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/safetensors.h"

namespace weft::test {

// The gradient of every tensor, router included: after one step Adam's
// first moment is (1 - beta1) times the (clipped) gradient, so the
// checkpoints' exp_avg tensors compare the gradients tensor by tensor.
// Returns the worst ||a - b|| / ||b|| over the tensors, and fails the test
// where one passes `tol`.
// (zeros_ok: LoRA's A, whose gradient is zero while B is at its zero start,
// must then be zero on both sides. `only`: the tensors whose names hold it.)
inline double worst_gradient(const std::string& ckpt, const std::string& ref_ckpt, const std::string& layout, double tol,
                      bool zeros_ok = false, const std::string& only = "") {
  const auto a = checkpoint::load_checkpoint(ckpt), b = checkpoint::load_checkpoint(ref_ckpt);
  double worst = 0;
  int64_t tensors = 0;
  for (const auto& p : checkpoint::checkpoint_param_table(b.manifest)) {  // under LoRA the adapters
    if (!only.empty() && p.name.find(only) == std::string::npos) continue;
    const std::string name = checkpoint::optim_state_name(checkpoint::OptimState::exp_avg, p.name);
    const auto& x = a.optimizer.at(name);
    const auto& y = b.optimizer.at(name);
    const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
    std::vector<float> u(size_t(rows * cols)), v(u.size());
    checkpoint::tensor_read_f32_block(x, 0, rows, 0, cols, u.data());
    checkpoint::tensor_read_f32_block(y, 0, rows, 0, cols, v.data());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      diff += (double(u[i]) - v[i]) * (double(u[i]) - v[i]);
      norm += double(v[i]) * v[i];
    }
    if (zeros_ok && norm == 0) {
      EXPECT_EQ(diff, 0) << layout << " " << p.name;
      EXPECT_NE(p.name.find(".lora_A."), std::string::npos) << layout << " " << p.name;
      continue;
    }
    EXPECT_GT(norm, 0) << layout << " " << p.name << ": a gradient of zeros compares nothing";
    const double rel = std::sqrt(diff / norm);
    EXPECT_LE(rel, tol) << layout << " " << p.name;
    worst = std::max(worst, rel);
    ++tensors;
  }
  EXPECT_GT(tensors, 0);
  return worst;
}


inline constexpr const char* kMixtral = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 8,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": false, "num_local_experts": 4, "num_experts_per_tok": 2,
  "router_aux_loss_coef": 0.05})";

// Llama 4's text model without its attention variants (no NoPE layers, no
// chunked attention, no QK norm, no temperature): its FFN alone.
inline constexpr const char* kLlama4Ffn = R"({"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text",
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
inline constexpr const char* kQwen3 = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false, "num_experts": 4,
  "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [3],
  "router_aux_loss_coef": 0.05})";

// Llama 4's text model whole: every layer MoE, NoPE every 4th layer with
// the attention temperature (floor 4, so it changes inside the sequence of
// 16), the QK L2 norm in the RoPE layers, and a chunk of 16, the sequence.
inline constexpr const char* kLlama4 = R"({"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text",
  "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 96,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false, "num_local_experts": 4,
  "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "router_aux_loss_coef": 0.05,
  "attention_chunk_size": 16, "use_qk_norm": true, "attn_temperature_tuning": true, "floor_scale": 4,
  "attn_scale": 0.1, "rope_scaling": null})";

// The same attending within chunks of 6 positions: its RoPE layers see
// positions 0-5, 6-11 and 12-15 of the sequence of 16, and under cp2 each
// rank's two blocks of 4 (0-3 and 12-15 on rank 0, 4-7 and 8-11 on rank 1)
// straddle those chunks.
inline const std::string kLlama4Chunk = [] {
  std::string c = kLlama4;
  const std::string from = R"("attention_chunk_size": 16)";
  c.replace(c.find(from), from.size(), R"("attention_chunk_size": 6)");
  return c;
}();

// (The gradient norms too, each rank counting what it holds once, whole or
// split: the first step's, of equal weights, within 1e-6; the later ones
// within 1e-4, since a norm of gradients moves more than the loss once
// summation order has moved the weights' last bits: at etp2, 1.2e-5 by
// step 5 where the losses stay within 1e-7.)
inline std::string table_of(Fixture& f, const std::vector<double>& ref, const std::vector<std::string>& layouts,
                     const std::string& extra) {
  const std::vector<double> ref_aux = f.aux_losses, ref_norms = f.grad_norms;
  EXPECT_EQ(ref_aux.size(), ref.size());
  EXPECT_EQ(ref_norms.size(), ref.size());
  std::string table = fmt::format("{:<62} {:>5} {:>12} {:>14} {:>12}\n", "layout", "ranks", "max rel dev",
                                  "worst mem dev", "aux rel dev");
  for (const auto& layout : layouts) {
    std::string row = parity_row(f, ref, layout, 1e-5, 1e-5, extra);
    const double aux = max_rel(f.aux_losses, ref_aux);
    EXPECT_LE(aux, 1e-5) << layout << ": the balancing loss";
    EXPECT_LE(max_rel(f.grad_norms, ref_norms), 1e-4) << layout << ": the gradient norms";
    if (!f.grad_norms.empty() && !ref_norms.empty()) {
      EXPECT_LE(std::fabs(f.grad_norms[0] - ref_norms[0]) / ref_norms[0], 1e-6) << layout << ": the first gradient norm";
    }
    row.pop_back();
    table += fmt::format("{} {:>12.2e}\n", row, aux);
  }
  return table;
}

// Each of `configs` trained on one rank, then under `layouts` against it
// (`extra`: more training arguments); prints each form's table.
inline void forms_against_one_rank(std::initializer_list<const char*> configs, const std::vector<std::string>& layouts,
                            const std::string& extra = "") {
  for (const char* config : configs) {
    Fixture f(false, config);
    const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"), extra);
    ASSERT_EQ(ref.size(), 5u);
    std::printf("%s", table_of(f, ref, layouts, extra).c_str());
  }
}

}  // namespace weft::test
