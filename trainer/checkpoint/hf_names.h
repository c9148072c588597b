// The one naming table of model and optimizer tensors in checkpoints and
// exports: Hugging Face LlamaForCausalLM names and shapes, e.g.
// "model.layers.3.self_attn.q_proj.weight" of shape (H*D, C). Linear weights
// are stored (out_features, in_features), as torch.nn.Linear keeps them.
// An MoE layer's FFN takes its family's names (ffn_naming): Mixtral's
// "block_sparse_moe.gate" router and "block_sparse_moe.experts.{e}.w1"
// (gate), "w3" (up), "w2" (down); Qwen3-MoE's "mlp.gate" and
// "mlp.experts.{e}.gate_proj", ...; Llama 4's "feed_forward.router" and
// "feed_forward.shared_expert.*", with its routed experts one tensor per
// expert, "feed_forward.experts.{e}.gate_proj", ..., where its published
// checkpoints fuse them ("experts.gate_up_proj" (E, C, 2F) and
// "experts.down_proj" (E, F, C)): llama4_form.h converts both ways.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft::checkpoint {

enum class ParamKind {
  embed_tokens,              // (V, C)
  q_proj,                    // (H*D, C)
  k_proj,                    // (H_kv*D, C)
  v_proj,                    // (H_kv*D, C)
  o_proj,                    // (C, H*D)
  gate_proj,                 // (F, C)
  up_proj,                   // (F, C)
  down_proj,                 // (C, F)
  input_layernorm,           // (C)
  post_attention_layernorm,  // (C)
  final_norm,                // (C)  "model.norm.weight"
  lm_head,                   // (V, C), absent when tied to embed_tokens
  // Qwen3's RMSNorm of each head's queries and keys (QkNorm::rms):
  q_norm,                    // (D)
  k_norm,                    // (D)
  // An MoE layer's FFN, in place of gate, up and down:
  router,                    // (E, C)
  expert_gate,               // (F_e, C), one per routed expert
  expert_up,                 // (F_e, C)
  expert_down,               // (C, F_e)
  shared_gate,               // (F_s, C), Llama 4's shared expert
  shared_up,                 // (F_s, C)
  shared_down,               // (C, F_s)
};

// Whose names an FFN takes: a dense Llama's, or an MoE family's, told from
// the model's structure (a shared expert or the gate on the input: Llama 4;
// RMS norms on queries and keys: Qwen3-MoE; otherwise Mixtral).
enum class FfnNaming { llama, mixtral, qwen3_moe, llama4 };
FfnNaming ffn_naming(const ModelSpec& m);

// True for the kinds that exist once per transformer block.
bool is_block_param(ParamKind kind);

// The Hugging Face name. `layer` is the block index for block kinds and is
// ignored otherwise. The first form is a dense Llama's (and every model's
// outside the FFN); the second a model's own, `expert` the routed expert of
// the expert kinds.
std::string hf_param_name(ParamKind kind, int64_t layer = 0);
std::string hf_param_name(const ModelSpec& m, ParamKind kind, int64_t layer, int64_t expert = -1);

// A LoRA adapter of block `layer`'s linear layer g: A ("lora_A", (r, in))
// or B ("lora_B", (out, r)), named as PEFT names them inside the model, e.g.
// "model.layers.3.self_attn.q_proj.lora_A.weight" (a PEFT adapter file
// prefixes "base_model.model.").
std::string lora_param_name(Linear g, int64_t layer, bool b);
inline constexpr const char* kPeftPrefix = "base_model.model.";
// The same in `m`'s own modules: its FFN's module name (Llama 4's
// "feed_forward"), and in an MoE layer the shared expert's gate, up and
// down ("feed_forward.shared_expert.gate_proj...").
std::string lora_param_name(const ModelSpec& m, Linear g, int64_t layer, bool b);

// LoRA on an MoE layer's routed experts, as PEFT adapts transformers' 3-D
// expert tensors (target_parameters): the fused gate and up of each expert
// take one A (r, C), which both read, and one B (2 F_e, r), the gate's rows
// then the up's; the down one A (r, F_e) and one B (C, r). weft keeps them
// per expert, "model.layers.{i}.mlp.experts.{e}.gate_up_proj.lora_A.weight"
// (Llama 4: feed_forward); a PEFT file packs every expert's into one pair
// per layer (peft.h).
enum class ExpertLora { gate_up, down };
std::string lora_expert_name(const ModelSpec& m, ExpertLora site, int64_t layer, int64_t expert, bool b);
// The adapters' shapes: A (r, in), B (out, r), r the site's rank
// (lora_site_rank: gate_up's may be its own).
std::vector<int64_t> lora_expert_shape(const ModelSpec& m, ExpertLora site, int64_t rank, bool b);
inline int64_t lora_site_rank(const LoraSpec& l, ExpertLora site) {
  return site == ExpertLora::gate_up ? l.experts_gate_up_rank() : l.rank;
}
// The module path of layer `layer`'s FFN: "model.layers.3.mlp" (Llama 4:
// "...feed_forward").
std::string ffn_module_path(const ModelSpec& m, int64_t layer);

// The shape of a full (unsharded) parameter for a model.
std::vector<int64_t> hf_param_shape(ParamKind kind, const ModelSpec& m);

struct ParamInfo {
  std::string name;
  ParamKind kind;  // for an adapter, its base layer's
  int64_t layer;  // -1 outside the blocks
  std::vector<int64_t> shape;
  int64_t expert = -1;  // the routed expert of the expert kinds
};

// Every stored parameter of a model, in the order checkpoints store them:
// the embedding, each block (q, k, v, o, Qwen3's q and k norms, its FFN, the
// two norms), the final
// norm, then the LM head unless tied. A dense block's FFN is gate, up and
// down; an MoE block's the router, each expert's gate, up and down, then
// the shared expert's.
std::vector<ParamInfo> hf_param_table(const ModelSpec& m);

// Every LoRA adapter of a model, in the order checkpoints store them: per
// block, per targeted layer (q, ..., down), A (r, in) then B (out, r); in an
// MoE block the FFN's are each routed expert's (gate_up, then down: kind
// expert_gate or expert_down, `expert` set), then the shared expert's
// (kinds shared_gate, ...).
std::vector<ParamInfo> lora_param_table(const ModelSpec& m, const LoraSpec& lora);

// Optimizer state kept per parameter.
enum class OptimState {
  exp_avg,     // Adam first moment m
  exp_avg_sq,  // Adam second moment v
  master,      // fp32 master copy of a parameter stored in lower precision
};

// e.g. "exp_avg.model.norm.weight".
std::string optim_state_name(OptimState state, const std::string& param_name);
// Splits an optimizer tensor name into its state and parameter name; false
// when it has none of the prefixes.
bool optim_state_parse(const std::string& tensor_name, OptimState& state, std::string& param_name);

}  // namespace weft::checkpoint
