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
    case ParamKind::q_norm: return block("self_attn.q_norm");
    case ParamKind::k_norm: return block("self_attn.k_norm");
    default: break;  // the MoE kinds have their family's names (the model's form)
  }
  return {};
}

FfnNaming ffn_naming(const ModelSpec& m) {
  if (!m.moe.enabled()) return FfnNaming::llama;
  if (m.moe.shared_intermediate > 0 || m.moe.gate_on == GateOn::input) return FfnNaming::llama4;
  return m.attention.qk_norm == QkNorm::rms ? FfnNaming::qwen3_moe : FfnNaming::mixtral;
}

std::string hf_param_name(const ModelSpec& m, ParamKind kind, int64_t layer, int64_t expert) {
  const FfnNaming naming = ffn_naming(m);
  const auto block = [&](const std::string& rest) { return fmt::format("model.layers.{}.{}.weight", layer, rest); };
  // The per-expert name of weight j (0 gate, 1 up, 2 down).
  const auto expert_name = [&](int j) {
    switch (naming) {
      case FfnNaming::mixtral: {
        constexpr const char* kMixtral[] = {"w1", "w3", "w2"};  // gate, up, down
        return block(fmt::format("block_sparse_moe.experts.{}.{}", expert, kMixtral[j]));
      }
      case FfnNaming::qwen3_moe:
        return block(fmt::format("mlp.experts.{}.{}", expert, hf_module_name(Linear(int(Linear::gate) + j))));
      default:
        return block(fmt::format("feed_forward.experts.{}.{}", expert, hf_module_name(Linear(int(Linear::gate) + j))));
    }
  };
  switch (kind) {
    case ParamKind::router:
      return block(naming == FfnNaming::mixtral   ? "block_sparse_moe.gate"
                   : naming == FfnNaming::qwen3_moe ? "mlp.gate"
                                                    : "feed_forward.router");
    case ParamKind::expert_gate: return expert_name(0);
    case ParamKind::expert_up: return expert_name(1);
    case ParamKind::expert_down: return expert_name(2);
    case ParamKind::shared_gate: return block("feed_forward.shared_expert.gate_proj");
    case ParamKind::shared_up: return block("feed_forward.shared_expert.up_proj");
    case ParamKind::shared_down: return block("feed_forward.shared_expert.down_proj");
    case ParamKind::gate_proj:
    case ParamKind::up_proj:
    case ParamKind::down_proj:
      // Llama 4's dense layers keep their FFN under feed_forward.
      if (naming == FfnNaming::llama4)
        return block(fmt::format("feed_forward.{}", kind == ParamKind::gate_proj ? "gate_proj"
                                                     : kind == ParamKind::up_proj ? "up_proj"
                                                                                  : "down_proj"));
      return hf_param_name(kind, layer);
    default: return hf_param_name(kind, layer);
  }
}

std::string lora_param_name(Linear g, int64_t layer, bool b) {
  return fmt::format("model.layers.{}.{}.{}.{}.weight", layer, int(g) <= int(Linear::o) ? "self_attn" : "mlp",
                     hf_module_name(g), b ? "lora_B" : "lora_A");
}

std::string ffn_module_path(const ModelSpec& m, int64_t layer) {
  return fmt::format("model.layers.{}.{}", layer, ffn_naming(m) == FfnNaming::llama4 ? "feed_forward" : "mlp");
}

std::string lora_param_name(const ModelSpec& m, Linear g, int64_t layer, bool b) {
  if (int(g) <= int(Linear::o)) return lora_param_name(g, layer, b);
  return fmt::format("{}{}.{}.{}.weight", ffn_module_path(m, layer), m.moe_layer(layer) ? ".shared_expert" : "",
                     hf_module_name(g), b ? "lora_B" : "lora_A");
}

std::string lora_expert_name(const ModelSpec& m, ExpertLora site, int64_t layer, int64_t expert, bool b) {
  return fmt::format("{}.experts.{}.{}.{}.weight", ffn_module_path(m, layer), expert,
                     site == ExpertLora::gate_up ? "gate_up_proj" : "down_proj", b ? "lora_B" : "lora_A");
}

std::vector<int64_t> lora_expert_shape(const ModelSpec& m, ExpertLora site, int64_t rank, bool b) {
  const int64_t C = m.hidden, F = m.moe.expert_intermediate;
  if (site == ExpertLora::gate_up) return b ? std::vector<int64_t>{2 * F, rank} : std::vector<int64_t>{rank, C};
  return b ? std::vector<int64_t>{C, rank} : std::vector<int64_t>{rank, F};
}

std::vector<ParamInfo> lora_param_table(const ModelSpec& m, const LoraSpec& lora) {
  constexpr ParamKind kKind[kLinears] = {ParamKind::q_proj,    ParamKind::k_proj,  ParamKind::v_proj,
                                         ParamKind::o_proj,    ParamKind::gate_proj, ParamKind::up_proj,
                                         ParamKind::down_proj};
  constexpr ParamKind kShared[3] = {ParamKind::shared_gate, ParamKind::shared_up, ParamKind::shared_down};
  std::vector<ParamInfo> table;
  const auto linear = [&](Linear g, int64_t layer, ParamKind kind, const std::vector<int64_t>& base) {
    table.push_back({lora_param_name(m, g, layer, false), kind, layer, {lora.rank, base[1]}});
    table.push_back({lora_param_name(m, g, layer, true), kind, layer, {base[0], lora.rank}});
  };
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    const bool moe = m.moe_layer(layer);
    for (int g = 0; g < kLinears; ++g) {
      if (!lora.targets_linear(Linear(g))) continue;
      if (moe && g >= int(Linear::gate)) continue;  // below
      linear(Linear(g), layer, kKind[g], hf_param_shape(kKind[g], m));
    }
    if (!moe) continue;
    const bool gate_up = lora.targets_linear(Linear::gate), down = lora.targets_linear(Linear::down);
    for (int64_t e = 0; e < m.moe.experts; ++e)
      for (const ExpertLora site : {ExpertLora::gate_up, ExpertLora::down}) {
        if (!(site == ExpertLora::gate_up ? gate_up : down)) continue;
        const ParamKind kind = site == ExpertLora::gate_up ? ParamKind::expert_gate : ParamKind::expert_down;
        for (const bool b : {false, true})
          table.push_back({lora_expert_name(m, site, layer, e, b), kind, layer,
                           lora_expert_shape(m, site, lora_site_rank(lora, site), b), e});
      }
    if (m.moe.shared_intermediate > 0)
      for (int j = 0; j < 3; ++j)
        if (lora.targets_linear(Linear(int(Linear::gate) + j)))
          linear(Linear(int(Linear::gate) + j), layer, kShared[j], hf_param_shape(kShared[j], m));
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
    case ParamKind::q_norm:
    case ParamKind::k_norm: return {D};
    case ParamKind::router: return {m.moe.experts, C};
    case ParamKind::expert_gate:
    case ParamKind::expert_up: return {m.moe.expert_intermediate, C};
    case ParamKind::expert_down: return {C, m.moe.expert_intermediate};
    case ParamKind::shared_gate:
    case ParamKind::shared_up: return {m.moe.shared_intermediate, C};
    case ParamKind::shared_down: return {C, m.moe.shared_intermediate};
  }
  return {};
}

std::vector<ParamInfo> hf_param_table(const ModelSpec& m) {
  std::vector<ParamInfo> table;
  table.reserve(static_cast<size_t>(m.layers) * 9 + 3);
  auto add = [&](ParamKind kind, int64_t layer, int64_t expert = -1) {
    table.push_back({hf_param_name(m, kind, layer, expert), kind, layer, hf_param_shape(kind, m), expert});
  };
  add(ParamKind::embed_tokens, -1);
  for (int64_t l = 0; l < m.layers; ++l) {
    for (ParamKind kind : {ParamKind::q_proj, ParamKind::k_proj, ParamKind::v_proj, ParamKind::o_proj}) add(kind, l);
    if (m.attention.qk_norm == QkNorm::rms)
      for (ParamKind kind : {ParamKind::q_norm, ParamKind::k_norm}) add(kind, l);
    if (m.moe_layer(l)) {
      add(ParamKind::router, l);
      for (int64_t e = 0; e < m.moe.experts; ++e)
        for (ParamKind kind : {ParamKind::expert_gate, ParamKind::expert_up, ParamKind::expert_down}) add(kind, l, e);
      if (m.moe.shared_intermediate > 0)
        for (ParamKind kind : {ParamKind::shared_gate, ParamKind::shared_up, ParamKind::shared_down}) add(kind, l);
    } else {
      for (ParamKind kind : {ParamKind::gate_proj, ParamKind::up_proj, ParamKind::down_proj}) add(kind, l);
    }
    add(ParamKind::input_layernorm, l);
    add(ParamKind::post_attention_layernorm, l);
  }
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
