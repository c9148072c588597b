#include "trainer/checkpoint/export_hf.h"

#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_names.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

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
  if (!m.moe.enabled()) return j;
  // An MoE model goes out as the transformers class that computes it:
  // Mixtral (every layer an MoE of softmax-scored, renormalised top-k
  // experts on the output, no shared expert), whose intermediate_size is
  // the experts' width. The others have no exporter yet.
  const MoeSpec& e = m.moe;
  std::vector<std::string> unlike;
  if (ffn_naming(m) != FfnNaming::mixtral) unlike.push_back("its family is not Mixtral's");
  if (e.score != RouterScore::softmax || e.weights != RouterWeights::renormalized || e.route_scale != 1)
    unlike.push_back(fmt::format("its router is {} with {} weights scaled by {} (Mixtral's: softmax, renormalized, 1)",
                                 router_score_name(e.score), router_weights_name(e.weights), e.route_scale));
  if (m.moe_layers() != m.layers)
    unlike.push_back(fmt::format("{} of its {} layers are dense", m.layers - m.moe_layers(), m.layers));
  if (e.aux_scope != AuxLossScope::global) unlike.push_back("its balancing loss is per layer (Mixtral's is global)");
  if (!unlike.empty())
    throw InputError(fmt::format("weft exports MoE models as Mixtral only, and {} is not one: {}", m.name,
                                 fmt::join(unlike, "; ")));
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j["intermediate_size"] = e.expert_intermediate;
  j["num_local_experts"] = e.experts;
  j["num_experts_per_tok"] = e.top_k;
  j["router_aux_loss_coef"] = e.aux_loss_coef;
  j["router_jitter_noise"] = 0.0;
  j["output_router_logits"] = false;
  j["sliding_window"] = nullptr;
  for (const char* key : {"attention_bias", "mlp_bias"}) j.erase(key);
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
    safetensors_write((fs::path(tmp) / kModelFile).string(), tensors, {{"format", "pt"}});
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
