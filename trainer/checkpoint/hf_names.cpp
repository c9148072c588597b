#include "trainer/checkpoint/hf_names.h"

#include <fmt/format.h>

namespace weft::checkpoint {

bool is_block_param(ParamKind kind) {
  return kind != ParamKind::embed_tokens && kind != ParamKind::final_norm &&
         kind != ParamKind::lm_head;
}

std::string hf_param_name(ParamKind kind, int64_t layer) {
  const auto block = [&](const char* rest) {
    return fmt::format("model.layers.{}.{}.weight", layer, rest);
  };
  switch (kind) {
    case ParamKind::embed_tokens: return "model.embed_tokens.weight";
    case ParamKind::q_proj: return block("self_attn.q_proj");
    case ParamKind::k_proj: return block("self_attn.k_proj");
    case ParamKind::v_proj: return block("self_attn.v_proj");
    case ParamKind::o_proj: return block("self_attn.o_proj");
    case ParamKind::gate_proj: return block("mlp.gate_proj");
    case ParamKind::up_proj: return block("mlp.up_proj");
    case ParamKind::down_proj: return block("mlp.down_proj");
    case ParamKind::input_layernorm: return block("input_layernorm");
    case ParamKind::post_attention_layernorm: return block("post_attention_layernorm");
    case ParamKind::final_norm: return "model.norm.weight";
    case ParamKind::lm_head: return "lm_head.weight";
  }
  return {};
}

std::string lora_param_name(Linear g, int64_t layer, bool b) {
  return fmt::format("model.layers.{}.{}.{}.{}.weight", layer, int(g) <= int(Linear::o) ? "self_attn" : "mlp",
                     hf_module_name(g), b ? "lora_B" : "lora_A");
}

std::vector<ParamInfo> lora_param_table(const ModelSpec& m, const LoraSpec& lora) {
  constexpr ParamKind kKind[kLinears] = {ParamKind::q_proj,    ParamKind::k_proj,  ParamKind::v_proj,
                                         ParamKind::o_proj,    ParamKind::gate_proj, ParamKind::up_proj,
                                         ParamKind::down_proj};
  std::vector<ParamInfo> table;
  for (int64_t layer = 0; layer < m.layers; ++layer)
    for (int g = 0; g < kLinears; ++g) {
      if (!lora.targets_linear(Linear(g))) continue;
      const auto base = hf_param_shape(kKind[g], m);  // (out, in)
      table.push_back({lora_param_name(Linear(g), layer, false), kKind[g], layer, {lora.rank, base[1]}});
      table.push_back({lora_param_name(Linear(g), layer, true), kKind[g], layer, {base[0], lora.rank}});
    }
  return table;
}

std::vector<int64_t> hf_param_shape(ParamKind kind, const ModelSpec& m) {
  const int64_t V = m.vocab, C = m.hidden, F = m.intermediate, D = m.head_dim;
  switch (kind) {
    case ParamKind::embed_tokens:
    case ParamKind::lm_head: return {V, C};
    case ParamKind::q_proj: return {m.heads * D, C};
    case ParamKind::k_proj:
    case ParamKind::v_proj: return {m.kv_heads * D, C};
    case ParamKind::o_proj: return {C, m.heads * D};
    case ParamKind::gate_proj:
    case ParamKind::up_proj: return {F, C};
    case ParamKind::down_proj: return {C, F};
    case ParamKind::input_layernorm:
    case ParamKind::post_attention_layernorm:
    case ParamKind::final_norm: return {C};
  }
  return {};
}

std::vector<ParamInfo> hf_param_table(const ModelSpec& m) {
  constexpr ParamKind kBlock[] = {
      ParamKind::q_proj,    ParamKind::k_proj,          ParamKind::v_proj,
      ParamKind::o_proj,    ParamKind::gate_proj,       ParamKind::up_proj,
      ParamKind::down_proj, ParamKind::input_layernorm, ParamKind::post_attention_layernorm};
  std::vector<ParamInfo> table;
  table.reserve(static_cast<size_t>(m.layers) * 9 + 3);
  auto add = [&](ParamKind kind, int64_t layer) {
    table.push_back({hf_param_name(kind, layer), kind, layer, hf_param_shape(kind, m)});
  };
  add(ParamKind::embed_tokens, -1);
  for (int64_t l = 0; l < m.layers; ++l)
    for (ParamKind kind : kBlock) add(kind, l);
  add(ParamKind::final_norm, -1);
  if (!m.tied_embeddings) add(ParamKind::lm_head, -1);
  return table;
}

namespace {

constexpr struct {
  OptimState state;
  const char* prefix;
} kStatePrefixes[] = {
    {OptimState::exp_avg, "exp_avg."},
    {OptimState::exp_avg_sq, "exp_avg_sq."},
    {OptimState::master, "master."},
};

}  // namespace

std::string optim_state_name(OptimState state, const std::string& param_name) {
  for (const auto& p : kStatePrefixes)
    if (p.state == state) return p.prefix + param_name;
  return param_name;
}

bool optim_state_parse(const std::string& tensor_name, OptimState& state, std::string& param_name) {
  for (const auto& p : kStatePrefixes) {
    const std::string_view prefix = p.prefix;
    if (tensor_name.starts_with(prefix)) {
      state = p.state;
      param_name = tensor_name.substr(prefix.size());
      return true;
    }
  }
  return false;
}

}  // namespace weft::checkpoint
