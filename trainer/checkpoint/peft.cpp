#include "trainer/checkpoint/peft.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/checkpoint/dtype.h"
#include "trainer/checkpoint/file_io.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/llama4_form.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Whether PEFT's packed expert adapters are weft's transposed: Llama 4
// stores its experts (E, in, out), the others (E, out, in).
bool experts_transposed(const ModelSpec& m) { return ffn_naming(m) == FfnNaming::llama4; }

// The model has FFN linear modules a target_modules entry names: dense
// layers, or a shared expert.
bool has_ffn_modules(const ModelSpec& m) {
  return !m.moe.enabled() || m.moe_layers() < m.layers || m.moe.shared_intermediate > 0;
}

}  // namespace

const TensorRef& PeftAdapter::tensor(const std::string& name) const {
  if (const auto it = reordered.find(name); it != reordered.end()) return it->second;
  if (const TensorRef* t = file.find(kPeftPrefix + name)) return *t;
  throw FileFormatError(fmt::format("PEFT adapter '{}': {} has no tensor '{}{}'", dir, kPeftWeightsFile,
                                    kPeftPrefix, name));
}

std::string peft_expert_name(const ModelSpec& m, const LoraSpec& lora, ExpertLora site, int64_t layer, bool b) {
  const bool nested = site == ExpertLora::gate_up && lora.targets_linear(Linear::down);
  return fmt::format("{}.experts{}.{}.weight", ffn_module_path(m, layer), nested ? ".base_layer" : "",
                     b ? "lora_B" : "lora_A");
}

std::vector<int64_t> peft_expert_shape(const ModelSpec& m, ExpertLora site, int64_t rank, bool b) {
  // The weft tensor each expert's part comes from, and its other side.
  const bool weft_b = experts_transposed(m) ? !b : b;
  const std::vector<int64_t> w = lora_expert_shape(m, site, rank, weft_b);
  const int64_t n = weft_b ? w[0] : w[1], E = m.moe.experts;
  return b ? std::vector<int64_t>{n, rank * E} : std::vector<int64_t>{rank * E, n};
}

namespace {

// Element (i, j) of expert e's part in PEFT's orientation, lora_A's (r, n)
// or lora_B's (n, r), at weft's tensor X (shape w): X itself where the
// orientations agree, else X transposed.
int64_t weft_index(bool same, const std::vector<int64_t>& w, int64_t i, int64_t j) {
  return same ? i * w[1] + j : j * w[1] + i;
}

}  // namespace

std::vector<float> peft_expert_pack(const ModelSpec& m, ExpertLora site, int64_t rank, bool b,
                                    const std::vector<const float*>& experts) {
  const bool weft_b = experts_transposed(m) ? !b : b, same = weft_b == b;
  const std::vector<int64_t> w = lora_expert_shape(m, site, rank, weft_b);
  const std::vector<int64_t> shape = peft_expert_shape(m, site, rank, b);
  const int64_t E = m.moe.experts, r = rank, n = b ? shape[0] : shape[1];
  WEFT_ASSERT(int64_t(experts.size()) == E);
  std::vector<float> out(size_t(shape[0] * shape[1]));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < (b ? n : r); ++i)
      for (int64_t j = 0; j < (b ? r : n); ++j) {
        const float v = experts[size_t(e)][weft_index(same, w, i, j)];
        if (b)
          out[size_t(i * r * E + j * E + e)] = v;  // (n, r E): rank j, expert e
        else
          out[size_t((e * r + i) * n + j)] = v;  // (r E, n): expert e's row i
      }
  return out;
}

void peft_expert_unpack(const ModelSpec& m, ExpertLora site, int64_t rank, bool b, const float* packed,
                        int64_t expert, float* out) {
  const bool weft_b = experts_transposed(m) ? !b : b, same = weft_b == b;
  const std::vector<int64_t> w = lora_expert_shape(m, site, rank, weft_b);
  const std::vector<int64_t> shape = peft_expert_shape(m, site, rank, b);
  const int64_t E = m.moe.experts, r = rank, n = b ? shape[0] : shape[1], e = expert;
  for (int64_t i = 0; i < (b ? n : r); ++i)
    for (int64_t j = 0; j < (b ? r : n); ++j)
      out[weft_index(same, w, i, j)] = b ? packed[i * r * E + j * E + e] : packed[(e * r + i) * n + j];
}

namespace {

// The adapter a parsed config (an object) describes, checked against the
// model; nlohmann type errors are the caller's to turn into FileFormatError.
PeftAdapter peft_read(const std::string& dir, const fs::path& p, const nlohmann::json& cfg, const ModelSpec& m) {
  const auto refuse = [&](const std::string& what) {
    return InputError(fmt::format("PEFT adapter '{}': {}; weft's LoRA reads plain LoRA adapters", dir, what));
  };
  if (cfg.value("peft_type", std::string()) != "LORA")
    throw refuse(fmt::format("peft_type is {}, not \"LORA\"", cfg.contains("peft_type") ? cfg["peft_type"].dump() : "absent"));
  // A switch is true, false or absent (null); anything else is no answer.
  const auto flag = [&](const char* key) {
    if (!cfg.contains(key) || cfg[key].is_null()) return false;
    if (!cfg[key].is_boolean())
      throw FileFormatError(fmt::format("{}/{}: '{}' must be true or false, got {}", dir, kPeftConfigFile, key,
                                        cfg[key].dump()));
    return cfg[key].get<bool>();
  };
  for (const char* key : {"use_dora", "use_rslora", "fan_in_fan_out", "lora_bias"})
    if (flag(key)) throw refuse(fmt::format("{} is true", key));
  if (cfg.value("bias", std::string("none")) != "none") throw refuse(fmt::format("bias is {}", cfg["bias"].dump()));
  // Ranks and alphas per layer: only the routed experts' gate_up_proj at
  // a rank of its own, alpha scaled alike (what PEFT makes of a Qwen3-MoE's
  // or Mixtral's gate_proj and up_proj targets: their experts'
  // transformers-v4 names, fused at twice the rank), is weft's.
  const auto pattern = [&](const char* key) -> std::optional<std::pair<std::string, nlohmann::json>> {
    if (!cfg.contains(key) || cfg[key].is_null() || cfg[key].empty()) return std::nullopt;
    if (!cfg[key].is_object() || cfg[key].size() != 1 || !cfg[key].begin().key().ends_with("gate_up_proj") ||
        !cfg[key].begin().value().is_number())
      throw refuse(fmt::format("{} {} sets ranks or alphas per layer (weft's one is the routed experts' "
                               "gate_up_proj's: a pattern of it alone, as PEFT writes for fused experts)",
                               key, cfg[key].dump()));
    return std::pair{cfg[key].begin().key(), cfg[key].begin().value()};
  };
  const auto rank_pattern = pattern("rank_pattern"), alpha_pattern = pattern("alpha_pattern");
  for (const char* key : {"modules_to_save", "layers_to_transform"})
    if (cfg.contains(key) && !cfg[key].is_null() && !cfg[key].empty()) throw refuse(fmt::format("{} is set", key));
  if (!cfg.contains("r") || !cfg["r"].is_number_integer() || cfg["r"].get<int64_t>() <= 0)
    throw FileFormatError(fmt::format("{}/{}: 'r' must be a positive integer", dir, kPeftConfigFile));
  PeftAdapter a{.dir = dir,
                .lora = {},
                .config = cfg,
                .file = SafetensorsFile((p / kPeftWeightsFile).string()),
                .converted = {},
                .reordered = {}};
  a.lora.rank = cfg["r"].get<int64_t>();
  const auto number = [&](const char* key, double fallback) {
    if (!cfg.contains(key) || cfg[key].is_null()) return fallback;
    if (!cfg[key].is_number())
      throw FileFormatError(fmt::format("{}/{}: '{}' must be a number, got {}", dir, kPeftConfigFile, key,
                                        cfg[key].dump()));
    return cfg[key].get<double>();
  };
  a.lora.alpha = number("lora_alpha", 8.0);
  a.lora.dropout = number("lora_dropout", 0.0);
  if (rank_pattern || alpha_pattern) {
    // The experts' gate_up at rank r' and alpha r' / r x alpha: the same
    // scale as every other adapter's, as weft computes it.
    const int64_t r2 = rank_pattern && rank_pattern->second.is_number_integer() ? rank_pattern->second.get<int64_t>()
                                                                                : 0;
    const double a2 = alpha_pattern ? alpha_pattern->second.get<double>() : a.lora.alpha;
    if (r2 <= 0 || std::abs(a2 / double(r2) - a.lora.alpha / double(a.lora.rank)) >
                       1e-12 * (a.lora.alpha / double(a.lora.rank)))
      throw refuse(fmt::format("rank_pattern {} and alpha_pattern {} set the routed experts' gate_up_proj to rank {} "
                               "and alpha {:g}, a scale of {:g} beside the others' {:g} (lora_alpha {:g} / r {}); "
                               "weft gives it a rank of its own at the same scale",
                               rank_pattern ? cfg["rank_pattern"].dump() : "(none)",
                               alpha_pattern ? cfg["alpha_pattern"].dump() : "(none)", r2, a2,
                               r2 > 0 ? a2 / double(r2) : 0.0, a.lora.alpha / double(a.lora.rank), a.lora.alpha,
                               a.lora.rank));
    a.lora.gate_up_rank = r2 == a.lora.rank ? 0 : r2;
  }
  if (!(a.lora.alpha > 0) || !std::isfinite(a.lora.alpha))
    throw FileFormatError(fmt::format("{}/{}: 'lora_alpha' must be a positive number, got {}", dir, kPeftConfigFile,
                                      cfg["lora_alpha"].dump()));
  if (!(a.lora.dropout >= 0 && a.lora.dropout < 1))
    throw FileFormatError(fmt::format("{}/{}: 'lora_dropout' must lie in [0, 1), got {}", dir, kPeftConfigFile,
                                      cfg["lora_dropout"].dump()));
  const nlohmann::json& targets = cfg.value("target_modules", nlohmann::json());
  std::string list;
  if (targets.is_string()) {
    list = targets.get<std::string>() == "all-linear" ? "all" : targets.get<std::string>();
  } else if (targets.is_array()) {
    for (const auto& t : targets) {
      if (!list.empty()) list += ',';
      list += t.get<std::string>();
    }
  }
  // An MoE model's routed experts: PEFT's target_parameters, each
  // "...experts.gate_up_proj" or "...experts.down_proj".
  bool experts_gate_up = false, experts_down = false;
  const nlohmann::json& params = cfg.value("target_parameters", nlohmann::json());
  if (!params.is_null() && !params.is_array())
    throw FileFormatError(fmt::format("{}/{}: 'target_parameters' must be a list of parameter names, got {}", dir,
                                      kPeftConfigFile, params.dump()));
  for (const auto& t : params.is_array() ? params : nlohmann::json::array()) {
    const std::string name = t.get<std::string>();
    const bool gate_up = name == "gate_up_proj" || name.ends_with("experts.gate_up_proj");
    const bool down = name == "down_proj" || name.ends_with("experts.down_proj");
    if (!m.moe.enabled() || !(gate_up || down))
      throw refuse(fmt::format("target_parameters names '{}'; weft adapts only an MoE model's routed experts' "
                               "experts.gate_up_proj and experts.down_proj that way{}",
                               name, m.moe.enabled() ? "" : fmt::format(", and {} has none", m.name)));
    experts_gate_up = experts_gate_up || gate_up;
    experts_down = experts_down || down;
  }
  if (list.empty() && !experts_gate_up && !experts_down)
    throw FileFormatError(fmt::format("{}/{}: no target_modules", dir, kPeftConfigFile));
  a.lora.targets = list.empty() ? 0u : LoraSpec::parse_targets(list);
  if (m.moe.enabled()) {
    // weft adapts every FFN of a model alike: its gate, up and down in the
    // dense layers and the shared expert as in the routed experts.
    const bool ffn_modules = has_ffn_modules(m);
    // (Without dense layers or a shared expert gate_proj, up_proj and
    // down_proj name no module of the model: PEFT adapts nothing by them.)
    if (!ffn_modules)
      a.lora.targets &= ~((1u << int(Linear::gate)) | (1u << int(Linear::up)) | (1u << int(Linear::down)));
    for (const auto& [g, experts] : {std::pair{Linear::gate, experts_gate_up}, std::pair{Linear::up, experts_gate_up},
                                     std::pair{Linear::down, experts_down}}) {
      const bool module = a.lora.targets_linear(g);
      if (ffn_modules && module != experts)
        throw refuse(fmt::format("it adapts {} {} but {} the routed experts' {}; weft adapts the dense layers' and "
                                 "shared expert's {} exactly when the experts' (target_parameters "
                                 "experts.gate_up_proj with gate_proj and up_proj, experts.down_proj with down_proj)",
                                 module ? "the" : "not the", hf_module_name(g), experts ? "does adapt" : "not",
                                 g == Linear::down ? "down_proj" : "gate_up_proj", hf_module_name(g)));
      if (experts) a.lora.targets |= 1u << int(g);
    }
  }
  // Every tensor is an adapter of a targeted layer of the model, with its shape.
  std::set<std::string> expected;
  for (const ParamInfo& info : lora_param_table(m, a.lora)) {
    if (info.expert >= 0) continue;  // packed, below
    const bool b = info.name.find(".lora_B.") != std::string::npos;
    const TensorRef& t = a.tensor(info.name);
    if (t.shape != info.shape)
      throw FileFormatError(fmt::format("PEFT adapter '{}': {}{} has shape {}, the model's is {}", dir, kPeftPrefix,
                                        info.name, shape_text(t.shape), shape_text(info.shape)));
    expected.insert(kPeftPrefix + info.name);
    const bool qk = info.kind == ParamKind::q_proj || info.kind == ParamKind::k_proj;
    if (b && qk && ffn_naming(m) == FfnNaming::llama4) {
      a.converted.push_back(llama4_rows_from_meta(t, m.head_dim));
      a.reordered.emplace(info.name, TensorRef{info.name, t.dtype, t.shape, a.converted.back().data()});
    }
  }
  // The routed experts' packed pairs, each expert's part to weft's own name.
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    if (!m.moe_layer(layer)) continue;
    for (const ExpertLora site : {ExpertLora::gate_up, ExpertLora::down}) {
      if (!(site == ExpertLora::gate_up ? a.lora.targets_linear(Linear::gate) : a.lora.targets_linear(Linear::down)))
        continue;
      for (const bool b : {false, true}) {
        const std::string name = peft_expert_name(m, a.lora, site, layer, b);
        const TensorRef* t = a.file.find(kPeftPrefix + name);
        if (!t)
          throw FileFormatError(fmt::format("PEFT adapter '{}': {} has no tensor '{}{}' (the routed experts' {} "
                                            "adapter of layer {})",
                                            dir, kPeftWeightsFile, kPeftPrefix, name,
                                            site == ExpertLora::gate_up ? "gate_up_proj" : "down_proj", layer));
        const int64_t rank = lora_site_rank(a.lora, site);
        const auto want = peft_expert_shape(m, site, rank, b);
        if (t->shape != want)
          throw FileFormatError(fmt::format("PEFT adapter '{}': {}{} has shape {}, the model's is {}", dir,
                                            kPeftPrefix, name, shape_text(t->shape), shape_text(want)));
        expected.insert(kPeftPrefix + name);
        std::vector<float> packed(size_t(t->elements()));
        to_f32(t->dtype, t->data, packed.data(), t->elements());
        const bool weft_b = experts_transposed(m) ? !b : b;
        const std::vector<int64_t> shape = lora_expert_shape(m, site, rank, weft_b);
        for (int64_t e = 0; e < m.moe.experts; ++e) {
          std::vector<std::byte>& bytes = a.converted.emplace_back(size_t(shape[0] * shape[1]) * sizeof(float));
          peft_expert_unpack(m, site, rank, b, packed.data(), e, reinterpret_cast<float*>(bytes.data()));
          const std::string mine = lora_expert_name(m, site, layer, e, weft_b);
          a.reordered.emplace(mine, TensorRef{mine, DType::F32, shape, bytes.data()});
        }
      }
    }
  }
  for (const auto& t : a.file.tensors())
    if (!expected.count(t.name))
      throw FileFormatError(fmt::format("PEFT adapter '{}': tensor '{}' is no LoRA adapter of the model's targeted "
                                        "layers ({} layers, targets {})",
                                        dir, t.name, m.layers, a.lora.targets_text()));
  return a;
}

}  // namespace

PeftAdapter peft_open(const std::string& dir, const ModelSpec& m) {
  const fs::path p(dir);
  if (!fs::is_directory(p))
    throw InputError(fmt::format("PEFT adapter folder '{}' does not exist or is not a folder", dir));
  if (!fs::is_regular_file(p / kPeftConfigFile) || !fs::is_regular_file(p / kPeftWeightsFile))
    throw InputError(fmt::format("'{}' is not a PEFT adapter folder: it needs {} and {} (peft's save_pretrained "
                                 "writes both; weft export --lora too)",
                                 dir, kPeftConfigFile, kPeftWeightsFile));
  nlohmann::json cfg;
  try {
    std::ifstream in(p / kPeftConfigFile);
    cfg = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(fmt::format("{}/{}: not valid JSON: {}", dir, kPeftConfigFile, e.what()));
  }
  if (!cfg.is_object())
    throw FileFormatError(fmt::format("{}/{}: must be a JSON object of settings, got {}", dir, kPeftConfigFile,
                                      cfg.type_name()));
  // A setting of the wrong type (a number where text belongs, ...) is a
  // malformed file, said with the field.
  try {
    return peft_read(dir, p, cfg, m);
  } catch (const nlohmann::json::exception& e) {
    throw FileFormatError(fmt::format("{}/{}: {}", dir, kPeftConfigFile, json_error_text(e)));
  }
}

void peft_write(const std::string& dir, const ModelSpec& m, const LoraSpec& lora, const std::string& base_model,
                const std::vector<TensorRef>& tensors, const std::vector<std::string>& inputs) {
  // PEFT (0.21, transformers 5) reads a Qwen3-MoE model's gate_proj,
  // up_proj and down_proj targets as its experts' transformers-v4 names and
  // fuses them into the experts' tensors, so it cannot adapt the dense
  // layers such a model may have (mlp_only_layers).
  const bool ffn = lora.targets_linear(Linear::gate) || lora.targets_linear(Linear::down);
  if (ffn && ffn_naming(m) == FfnNaming::qwen3_moe && m.moe_layers() < m.layers)
    throw InputError(fmt::format("export --lora: {} has {} dense layers beside its MoE ones, and PEFT cannot hold "
                                 "adapters on their FFN (it reads a Qwen3-MoE's gate_proj, up_proj and down_proj "
                                 "targets as its experts'); export --merge writes the adapted model, or train "
                                 "--lora-targets q,k,v,o",
                                 m.name, m.layers - m.moe_layers()));
  const fs::path out = dir_path_clean(dir);
  // Only an earlier export is replaced, so a mistyped path deletes nothing.
  export_target_check(out.string(), "peft", {kPeftConfigFile, kPeftWeightsFile}, inputs);
  // The routed experts' adapters by (layer, site, B), each expert's, packed.
  std::map<std::string, const ParamInfo*> info_of;
  const std::vector<ParamInfo> table = lora_param_table(m, lora);
  for (const auto& info : table) info_of.emplace(info.name, &info);
  std::map<std::tuple<int64_t, int, bool>, std::vector<const float*>> experts;
  std::vector<TensorRef> named;
  for (const auto& t : tensors) {
    const auto it = info_of.find(t.name);
    if (it == info_of.end() || it->second->expert < 0) {
      named.push_back(t);
      named.back().name = kPeftPrefix + t.name;
      continue;
    }
    WEFT_ASSERT(t.dtype == DType::F32);
    const ParamInfo& info = *it->second;
    const int site = int(info.kind == ParamKind::expert_gate ? ExpertLora::gate_up : ExpertLora::down);
    auto& list = experts[{info.layer, site, t.name.find(".lora_B.") != std::string::npos}];
    list.resize(size_t(m.moe.experts), nullptr);
    list[size_t(info.expert)] = static_cast<const float*>(t.data);
  }
  std::vector<std::vector<float>> packed;
  packed.reserve(experts.size());
  for (const auto& [key, list] : experts) {
    const auto [layer, site, weft_b] = key;
    for (const float* e : list) WEFT_ASSERT(e != nullptr);
    // PEFT's lora_A packs weft's A, or B where the experts are stored transposed.
    const bool b = experts_transposed(m) ? !weft_b : weft_b;
    const int64_t rank = lora_site_rank(lora, ExpertLora(site));
    packed.push_back(peft_expert_pack(m, ExpertLora(site), rank, b, list));
    named.push_back({kPeftPrefix + peft_expert_name(m, lora, ExpertLora(site), layer, b), DType::F32,
                     peft_expert_shape(m, ExpertLora(site), rank, b), packed.back().data()});
  }
  nlohmann::json targets = nlohmann::json::array(), parameters = nlohmann::json::array();
  for (int g = 0; g < kLinears; ++g)
    if (lora.targets_linear(Linear(g)) && (g < int(Linear::gate) || has_ffn_modules(m)))
      targets.push_back(hf_module_name(Linear(g)));
  if (m.moe.enabled()) {
    if (lora.targets_linear(Linear::gate)) parameters.push_back("experts.gate_up_proj");
    if (lora.targets_linear(Linear::down)) parameters.push_back("experts.down_proj");
  }
  nlohmann::json cfg = {{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"base_model_name_or_path", base_model},
                              {"r", lora.rank},
                              {"lora_alpha", lora.alpha},
                              {"lora_dropout", lora.dropout},
                              {"target_modules", targets},
                              {"target_parameters", parameters.empty() ? nlohmann::json() : parameters},
                              {"bias", "none"},
                              {"fan_in_fan_out", false},
                              {"use_rslora", false},
                              {"use_dora", false},
                              {"init_lora_weights", true},
                              {"inference_mode", true},
                              {"modules_to_save", nullptr},
                              {"layers_to_transform", nullptr},
                              {"rank_pattern", nlohmann::json::object()},
                              {"alpha_pattern", nlohmann::json::object()}};
  // The experts' gate_up at a rank of its own, as PEFT writes it.
  if (lora.gate_up_rank > 0) {
    cfg["rank_pattern"] = {{R"(.*\.gate_up_proj)", lora.gate_up_rank}};
    cfg["alpha_pattern"] = {{R"(.*\.gate_up_proj)", lora.experts_gate_up_alpha()}};
  }
  const std::string tmp = temp_dir_name(out.string());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  dir_create(tmp);
  try {
    file_write_atomic((fs::path(tmp) / kPeftConfigFile).string(), cfg.dump(2) + "\n");
    safetensors_write((fs::path(tmp) / kPeftWeightsFile).string(), named, {{"format", "pt"}});
    export_marker_write(tmp, "peft", inputs.empty() ? std::string() : inputs.front());
    fsync_dir(tmp);
    commit_dir(tmp, out.string(), {});
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace weft::checkpoint
