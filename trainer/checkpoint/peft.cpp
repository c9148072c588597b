#include "trainer/checkpoint/peft.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/checkpoint/file_io.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/llama4_form.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// The full shape of adapter A or B of linear g: A (r, in), B (out, r).
std::vector<int64_t> adapter_shape(const ModelSpec& m, const LoraSpec& l, Linear g, bool b) {
  const int64_t C = m.hidden, D = m.head_dim;
  int64_t in = C, out = C;
  switch (g) {
    case Linear::q: out = m.heads * D; break;
    case Linear::k:
    case Linear::v: out = m.kv_heads * D; break;
    case Linear::o: in = m.heads * D; break;
    case Linear::gate:
    case Linear::up: out = m.intermediate; break;
    case Linear::down: in = m.intermediate; break;
  }
  return b ? std::vector<int64_t>{out, l.rank} : std::vector<int64_t>{l.rank, in};
}

}  // namespace

const TensorRef& PeftAdapter::tensor(const std::string& name) const {
  if (const auto it = reordered.find(name); it != reordered.end()) return it->second;
  if (const TensorRef* t = file.find(kPeftPrefix + name)) return *t;
  throw FileFormatError(fmt::format("PEFT adapter '{}': {} has no tensor '{}{}'", dir, kPeftWeightsFile,
                                    kPeftPrefix, name));
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
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (cfg.contains(key) && !cfg[key].is_null() && !cfg[key].empty())
      throw refuse(fmt::format("{} sets ranks or alphas per layer", key));
  for (const char* key : {"modules_to_save", "layers_to_transform"})
    if (cfg.contains(key) && !cfg[key].is_null() && !cfg[key].empty()) throw refuse(fmt::format("{} is set", key));
  if (!cfg.contains("r") || !cfg["r"].is_number_integer() || cfg["r"].get<int64_t>() <= 0)
    throw FileFormatError(fmt::format("{}/{}: 'r' must be a positive integer", dir, kPeftConfigFile));
  PeftAdapter a{.dir = dir, .lora = {}, .config = cfg, .file = SafetensorsFile((p / kPeftWeightsFile).string())};
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
    for (const auto& t : targets) list += (list.empty() ? "" : ",") + t.get<std::string>();
  }
  if (list.empty()) throw FileFormatError(fmt::format("{}/{}: no target_modules", dir, kPeftConfigFile));
  a.lora.targets = LoraSpec::parse_targets(list);
  // Every tensor is an adapter of a targeted layer of the model, with its shape.
  std::set<std::string> expected;
  for (int64_t layer = 0; layer < m.layers; ++layer)
    for (int g = 0; g < kLinears; ++g)
      if (a.lora.targets_linear(Linear(g)))
        for (const bool b : {false, true}) {
          const std::string name = lora_param_name(Linear(g), layer, b);
          const TensorRef& t = a.tensor(name);
          const auto want = adapter_shape(m, a.lora, Linear(g), b);
          if (t.shape != want)
            throw FileFormatError(fmt::format("PEFT adapter '{}': {}{} has shape {}, the model's is {}", dir,
                                              kPeftPrefix, name, shape_text(t.shape), shape_text(want)));
          expected.insert(kPeftPrefix + name);
          if (b && (g == int(Linear::q) || g == int(Linear::k)) && ffn_naming(m) == FfnNaming::llama4) {
            a.converted.push_back(llama4_rows_from_meta(t, m.head_dim));
            a.reordered.emplace(name, TensorRef{name, t.dtype, t.shape, a.converted.back().data()});
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

void peft_write(const std::string& dir, const LoraSpec& lora, const std::string& base_model,
                const std::vector<TensorRef>& tensors, const std::vector<std::string>& inputs) {
  const fs::path out = dir_path_clean(dir);
  // Only an earlier export is replaced, so a mistyped path deletes nothing.
  export_target_check(out.string(), "peft", {kPeftConfigFile, kPeftWeightsFile}, inputs);
  std::vector<TensorRef> named = tensors;
  for (auto& t : named) t.name = kPeftPrefix + t.name;
  nlohmann::json targets = nlohmann::json::array();
  for (int g = 0; g < kLinears; ++g)
    if (lora.targets_linear(Linear(g))) targets.push_back(hf_module_name(Linear(g)));
  const nlohmann::json cfg = {{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"base_model_name_or_path", base_model},
                              {"r", lora.rank},
                              {"lora_alpha", lora.alpha},
                              {"lora_dropout", lora.dropout},
                              {"target_modules", targets},
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
