// The model presets: the Llama family and the Mixtures of Experts, from
// each model's published Hugging Face config.json, and weft's own small
// models for tests and CPU runs; and a name or config.json path resolved to
// a ModelSpec.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/rope_scaling.h"

namespace weft {

namespace {

struct Preset {
  const char* name;
  int64_t V, C, F, L, H, H_kv, D;
  double theta, eps;
  bool tied;
  int64_t max_seq;
  // rope_scaling llama3 (factor, low_freq_factor, high_freq_factor,
  // original_max_position_embeddings); factor 0 for plain RoPE.
  double rope_factor = 0, rope_low = 0, rope_high = 0;
  int64_t rope_original = 0;
};

// Values from each model's published Hugging Face config.json (Llama 3 has
// "rope_scaling": null; Llama 3.1 and 3.2 have rope_type "llama3" with factor
// 8 and 32, low_freq_factor 1, high_freq_factor 4, original 8192). The tiny
// presets are weft's own, sized for tests and the CPU default run.
constexpr Preset kPresets[] = {
    {"llama-7b", 32000, 4096, 11008, 32, 32, 32, 128, 1e4, 1e-6, false, 2048},
    {"llama-13b", 32000, 5120, 13824, 40, 40, 40, 128, 1e4, 1e-6, false, 2048},
    {"llama-30b", 32000, 6656, 17920, 60, 52, 52, 128, 1e4, 1e-6, false, 2048},
    {"llama-65b", 32000, 8192, 22016, 80, 64, 64, 128, 1e4, 1e-5, false, 2048},
    {"llama2-7b", 32000, 4096, 11008, 32, 32, 32, 128, 1e4, 1e-5, false, 4096},
    {"llama2-13b", 32000, 5120, 13824, 40, 40, 40, 128, 1e4, 1e-5, false, 4096},
    {"llama2-70b", 32000, 8192, 28672, 80, 64, 8, 128, 1e4, 1e-5, false, 4096},
    {"llama3-8b", 128256, 4096, 14336, 32, 32, 8, 128, 5e5, 1e-5, false, 8192},
    {"llama3-70b", 128256, 8192, 28672, 80, 64, 8, 128, 5e5, 1e-5, false, 8192},
    {"llama3.1-8b", 128256, 4096, 14336, 32, 32, 8, 128, 5e5, 1e-5, false, 131072, 8, 1, 4, 8192},
    {"llama3.1-70b", 128256, 8192, 28672, 80, 64, 8, 128, 5e5, 1e-5, false, 131072, 8, 1, 4, 8192},
    {"llama3.1-405b", 128256, 16384, 53248, 126, 128, 8, 128, 5e5, 1e-5, false, 131072, 8, 1, 4, 8192},
    {"llama3.2-1b", 128256, 2048, 8192, 16, 32, 8, 64, 5e5, 1e-5, true, 131072, 32, 1, 4, 8192},
    {"llama3.2-3b", 128256, 3072, 8192, 28, 24, 8, 128, 5e5, 1e-5, true, 131072, 32, 1, 4, 8192},
    // Byte-level vocabulary; the default model of `weft train` on a CPU.
    {"tiny", 256, 128, 352, 4, 4, 2, 32, 1e4, 1e-5, false, 1024},
    // Smallest useful shapes for unit and multi-rank tests (GQA 4:2, 8 layers
    // so that pp up to 4 with vpp 2 divides them).
    {"tiny-test", 96, 32, 80, 8, 4, 2, 8, 1e4, 1e-5, false, 256},
    // The same with tied embeddings.
    {"tiny-tied", 96, 32, 80, 4, 4, 4, 8, 1e4, 1e-5, true, 256},
    // The CPU benchmark model: 6 layers, C=512.
    {"small", 256, 512, 1376, 6, 8, 8, 64, 1e4, 1e-5, false, 2048},
};

ModelSpec from_preset(const Preset& p) {
  ModelSpec m;
  m.name = p.name;
  m.vocab = p.V;
  m.hidden = p.C;
  m.intermediate = p.F;
  m.layers = p.L;
  m.heads = p.H;
  m.kv_heads = p.H_kv;
  m.head_dim = p.D;
  m.rope_theta = p.theta;
  m.norm_eps = p.eps;
  m.tied_embeddings = p.tied;
  m.max_seq = p.max_seq;
  if (p.rope_factor > 0)
    m.rope_scaling = rope_scaling_llama3(p.rope_factor, p.rope_low, p.rope_high, p.rope_original);
  return m;
}

// The Mixtures of Experts, from each model's published config.json (for
// Llama 4 its text_config): F is the dense layers' width (Qwen3's
// intermediate_size, Llama 4's intermediate_size_mlp; Mixtral has no dense
// layer and gives the experts' width there too).
// Routed experts as Mixtral and Qwen3 have them: softmax over the E, top k,
// weights renormalised, on the expert's output, every layer, no shared expert.
MoeSpec routed(int64_t experts, int64_t top_k, int64_t width, double aux_loss_coef) {
  MoeSpec e;
  e.experts = experts;
  e.top_k = top_k;
  e.expert_intermediate = width;
  e.aux_loss_coef = aux_loss_coef;
  return e;
}

const std::vector<ModelSpec>& moe_presets() {
  static const std::vector<ModelSpec> presets = [] {
    std::vector<ModelSpec> v;
    const auto add = [&](const Preset& p, const MoeSpec& moe, const AttentionVariant& attention = {}) {
      ModelSpec m = from_preset(p);
      m.moe = moe;
      m.attention = attention;
      v.push_back(std::move(m));
    };
    // Mixtral: softmax over the 8, top 2 renormalised, no shared expert.
    add({"mixtral-8x7b", 32000, 4096, 14336, 32, 32, 8, 128, 1e6, 1e-5, false, 32768}, routed(8, 2, 14336, 0.02));
    add({"mixtral-8x22b", 32000, 6144, 16384, 56, 48, 8, 128, 1e6, 1e-5, false, 65536},
        routed(8, 2, 16384, 0.001));
    // Qwen3: softmax over 128, top 8 renormalised (norm_topk_prob true),
    // RMSNorm on each head's queries and keys.
    AttentionVariant qwen3;
    qwen3.qk_norm = QkNorm::rms;
    add({"qwen3-30b-a3b", 151936, 2048, 6144, 48, 32, 4, 128, 1e6, 1e-6, false, 40960},
        routed(128, 8, 768, 0.001), qwen3);
    add({"qwen3-235b-a22b", 151936, 4096, 12288, 94, 64, 4, 128, 1e6, 1e-6, false, 40960},
        routed(128, 8, 1536, 0.001), qwen3);
    // Llama 4: sigmoid of the chosen logit, top 1, on the expert's input,
    // plus a shared expert; NoPE every 4th layer with temperature tuning,
    // chunked attention (8192) in the others. Scout: every layer MoE, QK L2
    // norm, rope llama3 x8; Maverick: dense and MoE layers alternate, no QK
    // norm, plain RoPE.
    MoeSpec llama4 = routed(16, 1, 8192, 0.001);
    llama4.shared_intermediate = 8192;
    llama4.score = RouterScore::sigmoid;
    llama4.weights = RouterWeights::scores;
    llama4.gate_on = GateOn::input;
    AttentionVariant irope;
    irope.nope_interval = 4;
    irope.attention_chunk = 8192;
    irope.temperature_scale = 0.1;
    irope.temperature_floor = 8192;
    irope.qk_norm = QkNorm::l2;
    add({"llama4-scout", 202048, 5120, 16384, 48, 40, 8, 128, 5e5, 1e-5, false, 10485760, 8, 1, 4, 8192}, llama4,
        irope);
    MoeSpec maverick = llama4;
    maverick.experts = 128;
    maverick.step = 2;
    irope.qk_norm = QkNorm::none;
    add({"llama4-maverick", 202048, 5120, 16384, 48, 40, 8, 128, 5e5, 1e-5, false, 1048576}, maverick, irope);
    // weft's own: tiny's shapes with 8 experts of width 96, top 2, for tests
    // and CPU runs (8 divides by ep 2 and 4).
    add({"tiny-moe", 256, 128, 352, 4, 4, 2, 32, 1e4, 1e-5, false, 1024}, routed(8, 2, 96, 0.01));
    return v;
  }();
  return presets;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  for (const auto& m : moe_presets()) names.push_back(m.name);
  return names;
}

ModelSpec model_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return from_preset(p);
  for (const auto& m : moe_presets())
    if (name == m.name) return m;
  throw InputError(fmt::format("unknown model preset '{}'; valid presets: {} (or a path to a "
                               "Hugging Face config.json)",
                               name, fmt::join(model_preset_names(), ", ")));
}

ModelSpec model_resolve(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  if (name_or_path.ends_with(".json") || fs::exists(name_or_path)) {
    fs::path p(name_or_path);
    if (fs::is_directory(p)) p /= "config.json";
    return model_from_hf_config(p.string());
  }
  return model_preset(name_or_path);
}

}  // namespace weft
