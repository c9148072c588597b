#include "trainer/checkpoint/export_hf.h"

#include <filesystem>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/llama4_form.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

// What each family's config can say of the attention, its router and its
// layers; a model it cannot say is refused with every difference named.
// The balancing loss's coefficient is written (router_aux_loss_coef), its
// scope is the run's setting, which no config records (transformers
// computes the global one), like the capacity and imbalance factors.
void attention_unlike(const ModelSpec& m, QkNorm family_norm, std::vector<std::string>& unlike) {
  const AttentionVariant& a = m.attention;
  if (a.qk_norm != family_norm)
    unlike.push_back(fmt::format("its query-key norm is {} (the family's: {})", qk_norm_name(a.qk_norm),
                                 qk_norm_name(family_norm)));
  if (a.nope_interval > 0) unlike.push_back(fmt::format("its layers i with (i + 1) % {} == 0 are NoPE", a.nope_interval));
  if (a.attention_chunk > 0) unlike.push_back(fmt::format("it attends in chunks of {}", a.attention_chunk));
  if (a.temperature_scale > 0) unlike.push_back("it scales NoPE layers' queries by a temperature");
}

void router_unlike(const MoeSpec& e, RouterScore score, std::optional<RouterWeights> weights, GateOn gate,
                   std::vector<std::string>& unlike) {
  if (e.score != score || (weights && e.weights != *weights) || e.route_scale != 1 || e.gate_on != gate)
    unlike.push_back(fmt::format("its router is {} with {} weights scaled by {} on the experts' {} (the family's: "
                                 "{}{}, scaled by 1, on the {})",
                                 router_score_name(e.score), router_weights_name(e.weights), e.route_scale,
                                 gate_on_name(e.gate_on), router_score_name(score),
                                 weights ? fmt::format(" with {} weights", router_weights_name(*weights)) : "",
                                 gate_on_name(gate)));
}

// Mixtral: every layer an MoE of softmax-scored, renormalised top-k experts
// on the output, no shared expert; intermediate_size is the experts' width.
void mixtral_config(const ModelSpec& m, nlohmann::json& j, std::vector<std::string>& unlike) {
  const MoeSpec& e = m.moe;
  router_unlike(e, RouterScore::softmax, RouterWeights::renormalized, GateOn::output, unlike);
  attention_unlike(m, QkNorm::none, unlike);
  if (m.moe_layers() != m.layers)
    unlike.push_back(fmt::format("{} of its {} layers are dense", m.layers - m.moe_layers(), m.layers));
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j["intermediate_size"] = e.expert_intermediate;
  j["num_local_experts"] = e.experts;
  j["sliding_window"] = nullptr;
  for (const char* key : {"attention_bias", "mlp_bias"}) j.erase(key);
}

// Qwen3-MoE: softmax top-k, renormalised or not (norm_topk_prob), on the
// output; RMS norms of each head's queries and keys; the MoE layers every
// decoder_sparse_step-th but mlp_only_layers, the others dense of
// intermediate_size.
void qwen3_moe_config(const ModelSpec& m, nlohmann::json& j, std::vector<std::string>& unlike) {
  const MoeSpec& e = m.moe;
  router_unlike(e, RouterScore::softmax, std::nullopt, GateOn::output, unlike);
  attention_unlike(m, QkNorm::rms, unlike);
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j["moe_intermediate_size"] = e.expert_intermediate;
  // transformers 5 names it num_local_experts, Qwen3's own configs num_experts.
  j["num_local_experts"] = e.experts;
  j["num_experts"] = e.experts;
  j["norm_topk_prob"] = e.weights == RouterWeights::renormalized;
  j["decoder_sparse_step"] = e.step;
  j["mlp_only_layers"] = e.dense_layers;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["max_window_layers"] = m.layers;
  j.erase("mlp_bias");
}

// Llama 4's text model: sigmoid top-k on the experts' input beside a shared
// expert of the experts' width (intermediate_size; the dense layers'
// intermediate_size_mlp); the MoE layers listed; its attention: NoPE layers
// (no_rope_layers), chunks in the RoPE layers, the QK L2 norm there, and
// the NoPE layers' temperature.
void llama4_config(const ModelSpec& m, nlohmann::json& j, std::vector<std::string>& unlike) {
  const MoeSpec& e = m.moe;
  const AttentionVariant& a = m.attention;
  router_unlike(e, RouterScore::sigmoid, RouterWeights::scores, GateOn::input, unlike);
  if (e.shared_intermediate != e.expert_intermediate)
    unlike.push_back(fmt::format("its shared expert's width is {}, not the routed experts' {}",
                                 e.shared_intermediate, e.expert_intermediate));
  if (a.qk_norm == QkNorm::rms) unlike.push_back("its query-key norm is rms (the family's: l2 or none)");
  j["architectures"] = {"Llama4ForCausalLM"};
  j["model_type"] = "llama4_text";
  j["intermediate_size"] = e.expert_intermediate;
  j["intermediate_size_mlp"] = m.intermediate;
  j["num_local_experts"] = e.experts;
  j["interleave_moe_layer_step"] = e.step;
  std::vector<int64_t> moe_layers;
  nlohmann::json rope = nlohmann::json::array(), types = nlohmann::json::array();
  for (int64_t i = 0; i < m.layers; ++i) {
    if (m.moe_layer(i)) moe_layers.push_back(i);
    const bool nope = a.nope_interval > 0 && (i + 1) % a.nope_interval == 0;
    rope.push_back(nope ? 0 : 1);
    types.push_back(!nope && a.attention_chunk > 0 ? "chunked_attention" : "full_attention");
  }
  j["moe_layers"] = moe_layers;
  j["no_rope_layers"] = rope;
  j["no_rope_layer_interval"] = a.nope_interval > 0 ? a.nope_interval : m.layers + 1;
  j["layer_types"] = types;
  j["attention_chunk_size"] = a.attention_chunk > 0 ? nlohmann::json(a.attention_chunk) : nlohmann::json(nullptr);
  j["use_qk_norm"] = a.qk_norm == QkNorm::l2;
  j["attn_temperature_tuning"] = a.temperature_scale > 0;
  j["attn_scale"] = a.temperature_scale > 0 ? a.temperature_scale : 0.1;
  j["floor_scale"] = a.temperature_floor > 0 ? a.temperature_floor : 8192;
  j.erase("mlp_bias");
}

}  // namespace

nlohmann::json hf_config_json(const ModelSpec& m, int64_t bos_token_id, int64_t eos_token_id) {
  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", m.vocab},
      {"hidden_size", m.hidden},
      {"intermediate_size", m.intermediate},
      {"num_hidden_layers", m.layers},
      {"num_attention_heads", m.heads},
      {"num_key_value_heads", m.kv_heads},
      {"head_dim", m.head_dim},
      {"rms_norm_eps", m.norm_eps},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", rope_scaling_to_json(m.rope_scaling)},
      {"max_position_embeddings", m.max_seq},
      {"tie_word_embeddings", m.tied_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"torch_dtype", "float32"},
  };
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  std::vector<std::string> unlike;
  const FfnNaming family = ffn_naming(m);
  const char* family_name = "LlamaForCausalLM";
  if (!m.moe.enabled()) {
    attention_unlike(m, QkNorm::none, unlike);
  } else {
    // An MoE model goes out as the transformers class whose names its FFN
    // takes (ffn_naming), if that class computes it.
    const MoeSpec& e = m.moe;
    j["num_experts_per_tok"] = e.top_k;
    j["router_aux_loss_coef"] = e.aux_loss_coef;
    j["router_jitter_noise"] = 0.0;
    j["output_router_logits"] = false;
    switch (family) {
      case FfnNaming::mixtral:
        family_name = "MixtralForCausalLM";
        mixtral_config(m, j, unlike);
        break;
      case FfnNaming::qwen3_moe:
        family_name = "Qwen3MoeForCausalLM";
        qwen3_moe_config(m, j, unlike);
        break;
      case FfnNaming::llama4:
        family_name = "Llama4ForCausalLM";
        llama4_config(m, j, unlike);
        break;
      case FfnNaming::llama: break;
    }
  }
  if (!unlike.empty())
    throw InputError(fmt::format("weft exports {} as a {}, the Hugging Face class its weights are named for, "
                                 "and that class computes something else: {}",
                                 m.name, family_name, fmt::join(unlike, "; ")));
  return j;
}

namespace {

constexpr const char* kConfigFile = "config.json";

}  // namespace

void export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
               const ExportOptions& options) {
  const Checkpoint ckpt = load_checkpoint(checkpoint_dir);
  if (checkpoint_lora(ckpt.manifest).enabled())
    throw InputError(fmt::format("checkpoint {} holds LoRA adapters, not a whole model: export them with --lora "
                                 "(a PEFT adapter folder) or merged into the base with --merge",
                                 checkpoint_dir));

  // fp32 parameters: the master copy when there is one, else the stored
  // tensor, widened when it is not fp32 already.
  const auto table = hf_param_table(ckpt.manifest.model);
  std::vector<TensorRef> tensors;
  std::vector<std::vector<float>> widened;
  widened.reserve(table.size());
  for (const auto& p : table) {
    const TensorRef* t = ckpt.optimizer.find(optim_state_name(OptimState::master, p.name));
    if (t == nullptr || t->dtype != DType::F32) t = &ckpt.model.at(p.name);
    TensorRef ref = *t;
    ref.name = p.name;
    if (ref.dtype != DType::F32) {
      auto& buf = widened.emplace_back(static_cast<size_t>(ref.elements()));
      to_f32(ref.dtype, ref.data, buf.data(), ref.elements());
      ref.dtype = DType::F32;
      ref.data = buf.data();
    }
    tensors.push_back(std::move(ref));
  }
  const auto& man = ckpt.manifest;
  hf_folder_write(out_dir, {checkpoint_dir}, man.model, man.bos_token_id, man.eos_token_id, tensors, options);
}

void hf_folder_write(const std::string& out_dir, const std::vector<std::string>& inputs, const ModelSpec& model,
                     int64_t bos_token_id, int64_t eos_token_id, const std::vector<TensorRef>& tensors,
                     const ExportOptions& options) {
  const fs::path out = dir_path_clean(out_dir);
  export_target_check(out.string(), "hf", {kConfigFile, kModelFile}, inputs);
  const auto stage = [&](std::string_view name) {
    if (options.on_stage) options.on_stage(name);
  };
  const std::string tmp = temp_dir_name(out.string());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  dir_create(tmp);
  try {
    file_write_atomic((fs::path(tmp) / kConfigFile).string(),
                      hf_config_json(model, bos_token_id, eos_token_id).dump(2) + "\n");
    stage("config");
    // Llama 4 stores its experts fused and its q and k rows in Meta's
    // rotary pairs (llama4_form.h).
    std::vector<std::vector<std::byte>> buffers;
    const std::vector<TensorRef> stored =
        ffn_naming(model) == FfnNaming::llama4 ? llama4_to_stored(model, tensors, buffers) : tensors;
    safetensors_write((fs::path(tmp) / kModelFile).string(), stored, {{"format", "pt"}});
    stage("model");
    export_marker_write(tmp, "hf", inputs.empty() ? std::string() : inputs.front());
    fsync_dir(tmp);
    stage("synced");
    commit_dir(tmp, out.string(), options.on_stage);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace weft::checkpoint
