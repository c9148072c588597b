// Reading Hugging Face config.json files into a ModelSpec, and rope_scaling's
// JSON form (core/model_spec.h).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "core/model_spec.h"

namespace weft {

namespace {

int64_t require_int(const nlohmann::json& j, const char* key, const std::string& origin,
                    int64_t max = INT64_MAX, const char* architecture = "LlamaForCausalLM") {
  if (!j.contains(key))
    throw InputError(fmt::format("{}: missing field '{}' ({} config)", origin, key, architecture));
  const auto& v = j.at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw InputError(fmt::format("{}: field '{}' must be an integer, got {}", origin, key, v.dump()));
  const int64_t x = v.get<int64_t>();
  if (x <= 0)
    throw InputError(fmt::format("{}: field '{}'={} must be positive", origin, key, x));
  if (x > max)
    throw InputError(fmt::format("{}: field '{}'={} must be from 1 to {}", origin, key, x, max));
  return x;
}

// The families a config may name, by model_type and architecture. Another
// architecture computes something else with the same weights (Mistral, say,
// attends through a sliding window), so it is refused.
enum class HfFamily { llama, mixtral, qwen3_moe, llama4_text };

struct HfFamilyName {
  HfFamily family;
  const char* model_type;
  const char* architecture;
};

constexpr HfFamilyName kHfFamilies[] = {
    {HfFamily::llama, "llama", "LlamaForCausalLM"},
    {HfFamily::mixtral, "mixtral", "MixtralForCausalLM"},
    {HfFamily::qwen3_moe, "qwen3_moe", "Qwen3MoeForCausalLM"},
    {HfFamily::llama4_text, "llama4_text", "Llama4ForCausalLM"},
};

const char* hf_architecture(HfFamily family) {
  for (const auto& f : kHfFamilies)
    if (f.family == family) return f.architecture;
  return "LlamaForCausalLM";
}

std::string hf_family_list(bool architectures) {
  std::vector<std::string> names;
  for (const auto& f : kHfFamilies) names.push_back(fmt::format("\"{}\"", architectures ? f.architecture : f.model_type));
  return fmt::format("{}", fmt::join(names, ", "));
}

// bos_token_id or eos_token_id (one id, a list of them, or null): each must
// be an id of the vocabulary.
void check_token_ids(const nlohmann::json& j, const char* key, int64_t vocab, const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return;
  const auto& v = j[key];
  std::vector<nlohmann::json> ids;
  if (v.is_array()) ids.assign(v.begin(), v.end());
  else ids.push_back(v);
  for (const auto& id : ids)
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab ||
        (id.is_number_unsigned() && id.get<uint64_t>() >= uint64_t(vocab)))
      throw InputError(fmt::format("{}: field '{}' is {}; a token id must be a whole number from 0 to "
                                   "vocab_size - 1 = {}",
                                   origin, key, v.dump(), vocab - 1));
}

// Parses a rope_scaling object into `s`, appending to `problems` each reason
// it cannot be used (naming `field` and the key); `s` is plain RoPE then.
RopeScaling rope_scaling_parse(const nlohmann::json& r, const std::string& field,
                               std::vector<std::string>& problems) {
  if (r.is_null()) return {};
  if (!r.is_object()) {
    problems.push_back(fmt::format("{} is {}, not an object or null", field, r.dump()));
    return {};
  }
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (!r.contains(key)) continue;
    if (!r[key].is_string()) {
      problems.push_back(fmt::format("{}.{} is {}, not a name", field, key, r[key].dump()));
      return {};
    }
    type = r[key].get<std::string>();
    break;
  }
  if (type == "default") return {};
  if (type != "llama3") {
    problems.push_back(fmt::format("{} has rope_type '{}' (weft computes rope_type 'default' and "
                                   "'llama3' only)",
                                   field, type));
    return {};
  }
  const size_t before = problems.size();
  const auto number = [&](const char* key) {
    if (!r.contains(key) || !r[key].is_number()) {
      problems.push_back(fmt::format("{}.{} is {} (rope_type 'llama3' needs the numbers factor, "
                                     "low_freq_factor, high_freq_factor and "
                                     "original_max_position_embeddings)",
                                     field, key, r.contains(key) ? r[key].dump() : "missing"));
      return 0.0;
    }
    return r[key].get<double>();
  };
  const double factor = number("factor");
  const double low = number("low_freq_factor");
  const double high = number("high_freq_factor");
  const double original = number("original_max_position_embeddings");
  if (problems.size() == before && original != std::floor(original))
    problems.push_back(fmt::format("{}.original_max_position_embeddings={} must be a whole number",
                                   field, original));
  if (problems.size() != before) return {};
  const RopeScaling s = rope_scaling_llama3(factor, low, high, static_cast<int64_t>(original));
  for (auto& p : rope_scaling_problems(s, field)) problems.push_back(std::move(p));
  return problems.size() == before ? s : RopeScaling{};
}

// The scaling a Hugging Face config asks for: transformers 4 writes
// rope_scaling, transformers 5 rope_parameters (with rope_theta inside).
RopeScaling hf_rope_scaling(const nlohmann::json& j, std::vector<std::string>& problems) {
  RopeScaling found;
  std::string found_in;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!j.contains(key)) continue;
    const RopeScaling s = rope_scaling_parse(j[key], key, problems);
    if (!s.enabled()) continue;
    if (found.enabled() && !(found == s))
      problems.push_back(fmt::format("{} and {} name different scalings", found_in, key));
    found = s;
    found_in = key;
  }
  return found;
}

}  // namespace

nlohmann::json rope_scaling_to_json(const RopeScaling& s) {
  if (!s.enabled()) return nullptr;
  return {{"rope_type", rope_scaling_type_name(s.type)},
          {"factor", s.factor},
          {"low_freq_factor", s.low_freq_factor},
          {"high_freq_factor", s.high_freq_factor},
          {"original_max_position_embeddings", s.original_max_position}};
}

RopeScaling rope_scaling_from_json(const nlohmann::json& j, const std::string& origin,
                                   const std::string& field) {
  std::vector<std::string> problems;
  const RopeScaling s = rope_scaling_parse(j, field, problems);
  if (!problems.empty())
    throw InputError(fmt::format("{}: {}", origin, fmt::join(problems, "; ")));
  return s;
}

namespace {

ModelSpec model_from_hf_config_checked(const nlohmann::json& j, const std::string& origin);

}  // namespace

ModelSpec model_from_hf_config_json(const nlohmann::json& j, const std::string& origin) {
  // A value of the wrong type that the reader below does not check by name:
  // still the file and the field.
  try {
    return model_from_hf_config_checked(j, origin);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: {}", origin, json_error_text(e)));
  }
}

namespace {

// The family a config names by model_type and architectures (either may be
// absent; Llama then); InputError when it is none weft reads or the two
// disagree.
HfFamily hf_family(const nlohmann::json& j, const std::string& origin) {
  const HfFamilyName* by_type = nullptr;
  if (j.contains("model_type") && !j["model_type"].is_null()) {
    for (const auto& f : kHfFamilies)
      if (j["model_type"] == f.model_type) by_type = &f;
    if (!by_type)
      throw InputError(fmt::format("{}: model_type {} is not supported; weft reads {}", origin,
                                   j["model_type"].dump(), hf_family_list(false)));
  }
  const HfFamilyName* by_architecture = nullptr;
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const auto& a = j["architectures"];
    bool ok = a.is_array() && !a.empty();
    for (const auto& name : a.is_array() ? a : nlohmann::json::array()) {
      const HfFamilyName* found = nullptr;
      for (const auto& f : kHfFamilies)
        if (name == f.architecture) found = &f;
      ok = ok && found && (!by_architecture || by_architecture == found);
      by_architecture = found;
    }
    if (!ok)
      throw InputError(fmt::format("{}: field 'architectures' is {}; weft computes one of {} (another "
                                   "architecture computes something else with these weights)",
                                   origin, a.dump(), hf_family_list(true)));
  }
  if (by_type && by_architecture && by_type != by_architecture)
    throw InputError(fmt::format("{}: model_type \"{}\" and architectures {} name different models", origin,
                                 by_type->model_type, j["architectures"].dump()));
  const HfFamilyName* f = by_architecture ? by_architecture : by_type;
  return f ? f->family : HfFamily::llama;
}

// Llama 4's multimodal config (model_type "llama4",
// Llama4ForConditionalGeneration) keeps the text model in text_config.
bool llama4_multimodal(const nlohmann::json& j) {
  if (j.contains("model_type") && j["model_type"] == "llama4") return true;
  if (!j.contains("architectures") || !j["architectures"].is_array()) return false;
  for (const auto& a : j["architectures"])
    if (a == "Llama4ForConditionalGeneration") return true;
  return false;
}

void read_moe_family(const nlohmann::json& j, HfFamily family, const std::string& origin, ModelSpec& m,
                     std::vector<std::string>& refused);

ModelSpec model_from_hf_config_checked(const nlohmann::json& top, const std::string& file) {
  if (!top.is_object()) throw InputError(fmt::format("{}: expected a JSON object", file));
  const nlohmann::json* text = &top;
  std::string origin = file;
  if (llama4_multimodal(top)) {
    if (!top.contains("text_config") || !top["text_config"].is_object())
      throw InputError(fmt::format("{}: a Llama 4 config (model_type \"llama4\") keeps its text model in the "
                                   "object 'text_config', which is {}",
                                   file, top.contains("text_config") ? top["text_config"].dump() : "missing"));
    text = &top["text_config"];
    origin = file + " text_config";
  }
  const nlohmann::json& j = *text;
  if (text != &top && j.contains("model_type") && !j["model_type"].is_null() && j["model_type"] != "llama4_text")
    throw InputError(fmt::format("{}: model_type {} is not Llama 4's text model \"llama4_text\"", origin,
                                 j["model_type"].dump()));
  const HfFamily family = text != &top ? HfFamily::llama4_text : hf_family(j, origin);
  const char* architecture = hf_architecture(family);
  const auto require_int = [&](const nlohmann::json& in, const char* key, const std::string& where,
                               int64_t max = INT64_MAX) {
    return weft::require_int(in, key, where, max, architecture);
  };
  ModelSpec m;
  m.name = std::filesystem::path(file).parent_path().filename().string();
  if (m.name.empty()) m.name = "hf-config";
  m.vocab = require_int(j, "vocab_size", origin, kMaxVocab);
  m.hidden = require_int(j, "hidden_size", origin, kMaxHidden);
  m.intermediate = require_int(j, "intermediate_size", origin, kMaxIntermediate);
  m.layers = require_int(j, "num_hidden_layers", origin, kMaxLayers);
  m.heads = require_int(j, "num_attention_heads", origin, kMaxHeads);
  m.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? require_int(j, "num_key_value_heads", origin, kMaxHeads)
                   : m.heads;
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    m.head_dim = require_int(j, "head_dim", origin, kMaxHeadDim);
  } else {
    if (m.hidden % m.heads != 0)
      throw InputError(fmt::format("{}: hidden_size={} is not divisible by num_attention_heads={} "
                                   "and no head_dim is given",
                                   origin, m.hidden, m.heads));
    m.head_dim = m.hidden / m.heads;
  }
  auto number = [&](const char* key, double fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number())
      throw InputError(fmt::format("{}: field '{}' must be a number, got {}", origin, key,
                                   j[key].dump()));
    return j[key].get<double>();
  };
  m.rope_theta = number("rope_theta", 10000.0);
  // transformers 5 writes the RoPE settings as one object, rope_parameters,
  // with rope_theta inside it and none at the top level.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("rope_theta")) {
    const auto& t = j["rope_parameters"]["rope_theta"];
    if (!t.is_number())
      throw InputError(fmt::format("{}: field 'rope_parameters.rope_theta' must be a number, got {}",
                                   origin, t.dump()));
    m.rope_theta = t.get<double>();
  }
  m.norm_eps = number("rms_norm_eps", 1e-6);
  for (auto [key, v, lo, hi] : {std::tuple{"rope_theta", m.rope_theta, kMinRopeTheta, kMaxRopeTheta},
                                {"rms_norm_eps", m.norm_eps, kMinNormEps, kMaxNormEps}})
    if (!(v >= lo && v <= hi))
      throw InputError(fmt::format("{}: field '{}'={} must be from {:g} to {:g}", origin, key, v, lo, hi));
  check_token_ids(j, "bos_token_id", m.vocab, origin);
  check_token_ids(j, "eos_token_id", m.vocab, origin);
  m.max_seq = j.contains("max_position_embeddings") ? require_int(j, "max_position_embeddings", origin)
                                                    : 2048;
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      throw InputError(fmt::format("{}: field 'tie_word_embeddings' must be true or false", origin));
    m.tied_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  // Every field that asks for a computation weft's Llama lacks is refused,
  // all of them in one message, so that weights are never loaded into a
  // network that computes something else than what they were trained in.
  std::vector<std::string> refused;
  m.rope_scaling = hf_rope_scaling(j, refused);
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && !j[key].is_null() && j[key] != false)
      refused.push_back(fmt::format("{} is {} (weft's projections have no bias)", key, j[key].dump()));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    refused.push_back(fmt::format("hidden_act is {} (weft's MLP is SwiGLU with \"silu\")",
                                  j["hidden_act"].dump()));
  if (j.contains("attention_dropout") && !j["attention_dropout"].is_null() &&
      !(j["attention_dropout"].is_number() && j["attention_dropout"].get<double>() == 0))
    refused.push_back(fmt::format("attention_dropout is {} (weft trains without dropout: 0.0)",
                                  j["attention_dropout"].dump()));
  // transformers rotates only the first partial_rotary_factor * D dims of a
  // head when a config sets it (transformers 5 keeps it in rope_parameters).
  for (const nlohmann::json* where : {&j, j.contains("rope_parameters") && j["rope_parameters"].is_object()
                                                ? &j["rope_parameters"]
                                                : nullptr}) {
    if (!where || !where->contains("partial_rotary_factor")) continue;
    const auto& f = (*where)["partial_rotary_factor"];
    if (!f.is_null() && !(f.is_number() && f.get<double>() == 1.0))
      refused.push_back(fmt::format("{}partial_rotary_factor is {} (weft rotates every dim of a head: 1.0)",
                                    where == &j ? "" : "rope_parameters.", f.dump()));
  }
  // Qwen2-style configs switch a sliding window on with use_sliding_window;
  // Mistral's have no switch: a window given is a window used, unless it
  // spans every position the model takes.
  if (j.contains("sliding_window") && !j["sliding_window"].is_null() &&
      !(j.contains("use_sliding_window") && j["use_sliding_window"] == false)) {
    const auto& w = j["sliding_window"];
    if (!w.is_number() || w.get<double>() < double(m.max_seq))
      refused.push_back(fmt::format("sliding_window is {}{} (weft attends over the whole sequence; "
                                    "use_sliding_window false or a window of max_position_embeddings={} "
                                    "or more matches it)",
                                    w.dump(), j.contains("use_sliding_window") ? " with use_sliding_window true" : "",
                                    m.max_seq));
  }
  for (const nlohmann::json* where : {&top, &j})
    if (where->contains("quantization_config") && !(*where)["quantization_config"].is_null())
      refused.push_back("quantization_config is present (weft reads unquantized fp32, bf16 or fp16 weights)");
  if (family != HfFamily::llama) read_moe_family(j, family, origin, m, refused);
  if (!refused.empty())
    throw InputError(fmt::format("{}: weft does not compute this model: {}", origin, fmt::join(refused, "; ")));
  try {
    m.validate();
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", origin, e.what()));
  }
  return m;
}

// A config's value of `key` in `j`, `fallback` when absent or null.
int64_t hf_int(const nlohmann::json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi,
               const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const auto& v = j[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
      v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw InputError(fmt::format("{}: field '{}' is {}; it must be a whole number from {} to {}", origin, key,
                                 v.dump(), lo, hi));
  return v.get<int64_t>();
}

double hf_number(const nlohmann::json& j, const char* key, double fallback, double lo, double hi,
                 const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const auto& v = j[key];
  if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi))
    throw InputError(fmt::format("{}: field '{}' is {}; it must be a number from {:g} to {:g}", origin, key,
                                 v.dump(), lo, hi));
  return v.get<double>();
}

// true or false; Llama 4's attn_temperature_tuning is written as 4 too, so a
// number is true unless 0, as Python reads it.
bool hf_flag(const nlohmann::json& j, const char* key, bool fallback, const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const auto& v = j[key];
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  throw InputError(fmt::format("{}: field '{}' is {}; it must be true or false", origin, key, v.dump()));
}

// A list of layer indices (mlp_only_layers, moe_layers), each from 0 to
// layers - 1, ascending and without repeats after sorting.
std::vector<int64_t> hf_layer_list(const nlohmann::json& j, const char* key, int64_t layers,
                                   const std::string& origin) {
  std::vector<int64_t> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  const auto& v = j[key];
  if (!v.is_array())
    throw InputError(fmt::format("{}: field '{}' is {}; it must be a list of layers", origin, key, v.dump()));
  for (const auto& i : v) {
    if (!i.is_number_integer() || i.get<int64_t>() < 0 || i.get<int64_t>() >= layers)
      throw InputError(fmt::format("{}: field '{}' holds {}, not a layer from 0 to num_hidden_layers - 1 = {}",
                                   origin, key, i.dump(), layers - 1));
    out.push_back(i.get<int64_t>());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The MoE layers `is_moe` names as weft's (step, dense_layers): the largest
// step whose pattern ((i + 1) % step == 0) holds every MoE layer, and the
// pattern's layers that are dense.
void moe_layer_pattern(const std::vector<bool>& is_moe, MoeSpec& moe) {
  const int64_t layers = int64_t(is_moe.size());
  moe.step = 1;
  for (int64_t step = layers; step > 1; --step) {
    bool holds = true;
    for (int64_t i = 0; i < layers && holds; ++i) holds = !is_moe[size_t(i)] || (i + 1) % step == 0;
    if (holds) {
      moe.step = step;
      break;
    }
  }
  moe.dense_layers.clear();
  for (int64_t i = 0; i < layers; ++i)
    if ((i + 1) % moe.step == 0 && !is_moe[size_t(i)]) moe.dense_layers.push_back(i);
}

// Llama 4's attention (Llama4TextConfig): NoPE layers with temperature
// tuning, chunked attention in the RoPE layers, QK L2 norm.
void read_llama4_attention(const nlohmann::json& j, const std::string& origin, ModelSpec& m,
                           std::vector<std::string>& refused) {
  const int64_t L = m.layers;
  AttentionVariant& a = m.attention;
  // no_rope_layers[i] is 1 where layer i uses RoPE; absent or empty: every
  // no_rope_layer_interval-th layer is NoPE.
  a.nope_interval = hf_int(j, "no_rope_layer_interval", 4, 1, int64_t{1} << 30, origin);
  if (j.contains("no_rope_layers") && j["no_rope_layers"].is_array() && !j["no_rope_layers"].empty()) {
    const auto& list = j["no_rope_layers"];
    std::vector<bool> rope;
    for (const auto& v : list) {
      if (!(v == 0 || v == 1))
        throw InputError(fmt::format("{}: field 'no_rope_layers' holds {}; each entry is 1 (RoPE) or 0 (NoPE)",
                                     origin, v.dump()));
      rope.push_back(v == 1);
    }
    if (int64_t(rope.size()) < L)
      throw InputError(fmt::format("{}: field 'no_rope_layers' has {} entries for num_hidden_layers={}", origin,
                                   rope.size(), L));
    a.nope_interval = -1;
    for (int64_t n = 1; n <= L + 1 && a.nope_interval < 0; ++n) {
      bool holds = true;
      for (int64_t i = 0; i < L && holds; ++i) holds = rope[size_t(i)] == ((i + 1) % n != 0);
      if (holds) a.nope_interval = n;
    }
    if (a.nope_interval < 0) {
      refused.push_back(fmt::format("no_rope_layers is {} (weft's NoPE layers are every n-th: those with "
                                    "(i + 1) % n == 0)",
                                    list.dump()));
      a.nope_interval = 0;
    }
  }
  if (a.nope_interval > L) a.nope_interval = 0;  // no layer is NoPE
  a.attention_chunk = hf_int(j, "attention_chunk_size", 8192, 1, int64_t{1} << 40, origin);
  if (j.contains("attention_chunk_size") && j["attention_chunk_size"].is_null()) a.attention_chunk = 0;
  if (hf_flag(j, "use_qk_norm", true, origin)) a.qk_norm = QkNorm::l2;
  const double scale = hf_number(j, "attn_scale", 0.1, 0, 1e3, origin);
  const int64_t floor = hf_int(j, "floor_scale", 8192, 1, int64_t{1} << 40, origin);
  if (hf_flag(j, "attn_temperature_tuning", true, origin) && a.nope_interval > 0 && scale > 0) {
    a.temperature_scale = scale;
    a.temperature_floor = floor;
  }
  // layer_types, where written, must be what the above derives.
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& types = j["layer_types"];
    bool agree = types.is_array() && int64_t(types.size()) >= L;
    for (int64_t i = 0; agree && i < L; ++i) {
      const bool nope = a.nope_interval > 0 && (i + 1) % a.nope_interval == 0;
      agree = nope ? types[size_t(i)] == "full_attention"
                   : types[size_t(i)] == "chunked_attention" ||
                         (a.attention_chunk == 0 && types[size_t(i)] == "full_attention");
    }
    if (!agree)
      refused.push_back(fmt::format("layer_types is {} (weft's Llama 4 attends in chunks in the RoPE layers and "
                                    "over the whole sequence in the NoPE layers)",
                                    types.dump()));
  }
}

void read_moe_family(const nlohmann::json& j, HfFamily family, const std::string& origin, ModelSpec& m,
                     std::vector<std::string>& refused) {
  MoeSpec& e = m.moe;
  const int64_t L = m.layers;
  // Qwen3's published configs say num_experts; transformers 5 writes it as
  // num_local_experts, Mixtral's name.
  const char* experts_key =
      family == HfFamily::qwen3_moe && !j.contains("num_local_experts") ? "num_experts" : "num_local_experts";
  e.experts = require_int(j, experts_key, origin, kMaxExperts, hf_architecture(family));
  e.top_k = hf_int(j, "num_experts_per_tok", family == HfFamily::mixtral ? 2 : family == HfFamily::qwen3_moe ? 8 : 1,
                   1, e.experts, origin);
  e.aux_loss_coef = hf_number(j, "router_aux_loss_coef", 0.001, 0, kMaxAuxLossCoef, origin);
  e.aux_scope = AuxLossScope::global;
  // Jitter multiplies the router's input by noise while training: not computed.
  if (j.contains("router_jitter_noise") && !j["router_jitter_noise"].is_null() &&
      !(j["router_jitter_noise"].is_number() && j["router_jitter_noise"].get<double>() == 0))
    refused.push_back(fmt::format("router_jitter_noise is {} (weft's router takes no noise: 0.0)",
                                  j["router_jitter_noise"].dump()));
  std::vector<bool> is_moe(size_t(L), true);
  switch (family) {
    case HfFamily::mixtral:
      // Every layer an MoE of intermediate_size experts; softmax, top k
      // renormalised (the same as a softmax over the top k logits).
      e.expert_intermediate = m.intermediate;
      e.weights = RouterWeights::renormalized;
      break;
    case HfFamily::qwen3_moe: {
      e.expert_intermediate = require_int(j, "moe_intermediate_size", origin, kMaxIntermediate, hf_architecture(family));
      e.weights = hf_flag(j, "norm_topk_prob", false, origin) ? RouterWeights::renormalized : RouterWeights::scores;
      const int64_t step = hf_int(j, "decoder_sparse_step", 1, 1, std::max<int64_t>(L, 1), origin);
      const auto mlp_only = hf_layer_list(j, "mlp_only_layers", L, origin);
      for (int64_t i = 0; i < L; ++i)
        is_moe[size_t(i)] = (i + 1) % step == 0 && !std::binary_search(mlp_only.begin(), mlp_only.end(), i);
      m.attention.qk_norm = QkNorm::rms;  // q_norm and k_norm over each head, before RoPE
      break;
    }
    case HfFamily::llama4_text: {
      // intermediate_size is the experts' and the shared expert's width,
      // intermediate_size_mlp the dense layers'.
      e.expert_intermediate = m.intermediate;
      e.shared_intermediate = m.intermediate;
      m.intermediate = hf_int(j, "intermediate_size_mlp", 16384, 1, kMaxIntermediate, origin);
      e.score = RouterScore::sigmoid;
      e.weights = RouterWeights::scores;
      e.gate_on = GateOn::input;
      if (j.contains("moe_layers") && !j["moe_layers"].is_null()) {
        const auto listed = hf_layer_list(j, "moe_layers", L, origin);
        for (int64_t i = 0; i < L; ++i) is_moe[size_t(i)] = std::binary_search(listed.begin(), listed.end(), i);
      } else {
        const int64_t step = hf_int(j, "interleave_moe_layer_step", 1, 1, std::max<int64_t>(L, 1), origin);
        for (int64_t i = 0; i < L; ++i) is_moe[size_t(i)] = (i + 1) % step == 0;
      }
      read_llama4_attention(j, origin, m, refused);
      break;
    }
    case HfFamily::llama: break;
  }
  if (std::find(is_moe.begin(), is_moe.end(), true) == is_moe.end()) {
    refused.push_back("no layer is an MoE layer (moe_layers, decoder_sparse_step or mlp_only_layers leave none); "
                      "such a model is a LlamaForCausalLM");
    e = MoeSpec{};
    return;
  }
  moe_layer_pattern(is_moe, e);
}

}  // namespace

ModelSpec model_from_hf_config(const std::string& path) {
  return model_from_hf_config_json(json_read_file(path, "model config"), path);
}

}  // namespace weft
