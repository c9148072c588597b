#include "core/model_spec.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/hash.h"
#include "core/json_io.h"

namespace weft {

namespace {

// The most parameters a ModelSpec may have: 2^50 (1.1e15, some 500 times the
// largest published Llama), so that bytes per parameter times it stays far
// inside int64.
constexpr double kMaxParams = 1125899906842624.0;

}  // namespace

int64_t ModelSpec::block_params() const {
  const int64_t q = hidden * heads * head_dim;
  const int64_t kv = 2 * hidden * kv_heads * head_dim;
  const int64_t o = heads * head_dim * hidden;
  const int64_t mlp = 3 * hidden * intermediate;
  const int64_t norms = 2 * hidden;
  return q + kv + o + mlp + norms;
}

int64_t ModelSpec::padded_vocab(int64_t tp) const {
  if (tp <= 1 || vocab % tp == 0) return vocab;
  const int64_t unit = kVocabPadMultiple * tp;
  return (vocab + unit - 1) / unit * unit;
}

int64_t ModelSpec::param_count() const {
  return embedding_params() + layers * block_params() + hidden + head_params();
}

int64_t ModelSpec::flop_params() const {
  return layers * block_params() + hidden + vocab * hidden;
}

void ModelSpec::validate() const {
  std::vector<std::string> bad;
  auto positive = [&](const char* field, int64_t v, int64_t max) {
    if (v <= 0) bad.push_back(fmt::format("{}={} must be positive", field, v));
    else if (v > max) bad.push_back(fmt::format("{}={} must be from 1 to {}", field, v, max));
  };
  positive("vocab", vocab, kMaxVocab);
  positive("hidden", hidden, kMaxHidden);
  positive("intermediate", intermediate, kMaxIntermediate);
  positive("layers", layers, kMaxLayers);
  positive("heads", heads, kMaxHeads);
  positive("kv_heads", kv_heads, kMaxHeads);
  positive("head_dim", head_dim, kMaxHeadDim);
  if (heads > 0 && kv_heads > 0 && heads % kv_heads != 0)
    bad.push_back(fmt::format("heads={} must be a multiple of kv_heads={}", heads, kv_heads));
  if (head_dim > 0 && head_dim % 2 != 0)
    bad.push_back(fmt::format("head_dim={} must be even for rotary embeddings", head_dim));
  if (!(rope_theta >= kMinRopeTheta && rope_theta <= kMaxRopeTheta))
    bad.push_back(fmt::format("rope_theta={} must be from {:g} to {:g}", rope_theta, kMinRopeTheta, kMaxRopeTheta));
  if (!(norm_eps >= kMinNormEps && norm_eps <= kMaxNormEps))
    bad.push_back(fmt::format("norm_eps={} must be from {:g} to {:g}", norm_eps, kMinNormEps, kMaxNormEps));
  for (auto& p : rope_scaling_problems(rope_scaling)) bad.push_back(std::move(p));
  if (bad.empty()) {
    // The counts are int64 and weft multiplies them by bytes per parameter
    // (16 and more for the optimizer), so bound them, in double, before any
    // int64 product can overflow.
    const double c = double(hidden), block = c * double(heads) * double(head_dim) * 2 +
                                             2 * c * double(kv_heads) * double(head_dim) +
                                             3 * c * double(intermediate) + 2 * c;
    const double params = double(vocab) * c * 2 + double(layers) * block + c;
    if (params > kMaxParams)
      bad.push_back(fmt::format("{:.3g} parameters (vocab={} hidden={} intermediate={} layers={} heads={} "
                                "kv_heads={} head_dim={}) are more than the {:.3g} weft can count",
                                params, vocab, hidden, intermediate, layers, heads, kv_heads, head_dim,
                                kMaxParams));
  }
  if (!bad.empty())
    throw InputError(fmt::format("model '{}': {}", name, fmt::join(bad, "; ")));
}

std::string ModelSpec::hash() const {
  // FNV-1a over the canonical architecture text: stable across platforms.
  std::string text = fmt::format("V{}C{}F{}L{}H{}K{}D{}r{:.17g}e{:.17g}t{}", vocab, hidden,
                                 intermediate, layers, heads, kv_heads, head_dim, rope_theta,
                                 norm_eps, tied_embeddings ? 1 : 0);
  // Plain RoPE adds nothing, so the hashes of models without scaling (and the
  // recipes and checkpoints that record them) stay what they were.
  const RopeScaling& s = rope_scaling;
  if (s.enabled())
    text += fmt::format("s{}f{:.17g}l{:.17g}h{:.17g}o{}", rope_scaling_type_name(s.type), s.factor,
                        s.low_freq_factor, s.high_freq_factor, s.original_max_position);
  const uint64_t h = fnv1a64(text);
  return fmt::format("{:016x}", h);
}

std::string ModelSpec::summary() const {
  const double n = static_cast<double>(param_count());
  const std::string size = n >= 1e9 ? fmt::format("{:.2f}B", n / 1e9)
                           : n >= 1e6 ? fmt::format("{:.2f}M", n / 1e6)
                                      : fmt::format("{:.1f}K", n / 1e3);
  const std::string rope = rope_scaling_summary(rope_scaling);
  return fmt::format("{} ({} params: V={} C={} F={} L={} H={} H_kv={} D={}{}{}{})", name, size, vocab,
                     hidden, intermediate, layers, heads, kv_heads, head_dim,
                     tied_embeddings ? " tied" : "", rope.empty() ? "" : " ", rope);
}

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

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

ModelSpec model_preset(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name == p.name) {
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
  }
  throw InputError(fmt::format("unknown model preset '{}'; valid presets: {} (or a path to a "
                               "Hugging Face config.json)",
                               name, fmt::join(model_preset_names(), ", ")));
}

namespace {

int64_t require_int(const nlohmann::json& j, const char* key, const std::string& origin,
                    int64_t max = INT64_MAX) {
  if (!j.contains(key))
    throw InputError(fmt::format("{}: missing field '{}' (LlamaForCausalLM config)", origin, key));
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

// The architectures a config may name: weft computes LlamaForCausalLM only
// (MistralForCausalLM, say, attends through a sliding window).
bool llama_architecture(const std::string& name) { return name == "LlamaForCausalLM"; }

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

ModelSpec model_from_hf_config_checked(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object", origin));
  if (j.contains("model_type") && !j["model_type"].is_null() && j["model_type"] != "llama")
    throw InputError(fmt::format("{}: model_type {} is not supported; weft trains \"llama\"", origin,
                                 j["model_type"].dump()));
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    const auto& a = j["architectures"];
    bool ok = a.is_array() && !a.empty();
    for (const auto& name : a.is_array() ? a : nlohmann::json::array())
      ok = ok && name.is_string() && llama_architecture(name.get<std::string>());
    if (!ok)
      throw InputError(fmt::format("{}: field 'architectures' is {}; weft computes [\"LlamaForCausalLM\"] "
                                   "only (another architecture computes something else with these weights)",
                                   origin, a.dump()));
  }
  ModelSpec m;
  m.name = std::filesystem::path(origin).parent_path().filename().string();
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
  if (j.contains("quantization_config") && !j["quantization_config"].is_null())
    refused.push_back("quantization_config is present (weft reads unquantized fp32, bf16 or fp16 weights)");
  if (!refused.empty())
    throw InputError(fmt::format("{}: weft's Llama does not compute this model: {}", origin,
                                 fmt::join(refused, "; ")));
  try {
    m.validate();
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", origin, e.what()));
  }
  return m;
}

}  // namespace

ModelSpec model_from_hf_config(const std::string& path) {
  return model_from_hf_config_json(json_read_file(path, "model config"), path);
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

void to_json(nlohmann::json& j, const ModelSpec& m) {
  j = nlohmann::json{{"name", m.name},
                     {"vocab", m.vocab},
                     {"hidden", m.hidden},
                     {"intermediate", m.intermediate},
                     {"layers", m.layers},
                     {"heads", m.heads},
                     {"kv_heads", m.kv_heads},
                     {"head_dim", m.head_dim},
                     {"rope_theta", m.rope_theta},
                     {"norm_eps", m.norm_eps},
                     {"tied_embeddings", m.tied_embeddings},
                     {"max_seq", m.max_seq},
                     {"params", m.param_count()},
                     {"hash", m.hash()}};
  // Only when set, so that the JSON of models with plain RoPE is unchanged.
  if (m.rope_scaling.enabled()) j["rope_scaling"] = rope_scaling_to_json(m.rope_scaling);
}

void from_json(const nlohmann::json& j, ModelSpec& m) {
  const std::string origin = "model spec";
  auto get_int = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer())
      throw InputError(fmt::format("{}: missing or non-integer field '{}'", origin, key));
    return j[key].get<int64_t>();
  };
  if (!j.is_object()) throw InputError(fmt::format("{}: not a JSON object", origin));
  // Optional fields keep their default when absent, and are refused, named,
  // when present with the wrong type.
  auto optional = [&](const char* key, auto fallback, bool (nlohmann::json::*is)() const noexcept,
                      const char* what) {
    if (!j.contains(key)) return fallback;
    if (!(j[key].*is)())
      throw InputError(fmt::format("{}: field '{}' must be {}, got {}", origin, key, what, j[key].dump()));
    return j[key].get<decltype(fallback)>();
  };
  m.name = optional("name", std::string("model"), &nlohmann::json::is_string, "a string");
  m.vocab = get_int("vocab");
  m.hidden = get_int("hidden");
  m.intermediate = get_int("intermediate");
  m.layers = get_int("layers");
  m.heads = get_int("heads");
  m.kv_heads = get_int("kv_heads");
  m.head_dim = get_int("head_dim");
  m.rope_theta = optional("rope_theta", 10000.0, &nlohmann::json::is_number, "a number");
  m.norm_eps = optional("norm_eps", 1e-5, &nlohmann::json::is_number, "a number");
  m.tied_embeddings = optional("tied_embeddings", false, &nlohmann::json::is_boolean, "true or false");
  m.max_seq = optional("max_seq", int64_t{2048}, &nlohmann::json::is_number_integer, "an integer");
  m.rope_scaling = j.contains("rope_scaling")
                       ? rope_scaling_from_json(j["rope_scaling"], origin, "rope_scaling")
                       : RopeScaling{};
  m.validate();
}

}  // namespace weft
