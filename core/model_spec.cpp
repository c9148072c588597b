#include "core/model_spec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <type_traits>
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
// Attention chunks and temperature floors: positions, far past any context.
constexpr int64_t kMaxChunk = int64_t{1} << 40;
constexpr double kMaxTemperatureScale = 1e3;

}  // namespace

int64_t ModelSpec::moe_layers() const {
  // Every step-th layer but the dense ones among them (the planner asks
  // this per candidate: no walk over the layers).
  if (!moe.enabled() || moe.step < 1) return 0;
  int64_t n = layers / moe.step;
  for (const int64_t d : moe.dense_layers) n -= d < layers && (d + 1) % moe.step == 0 ? 1 : 0;
  return n;
}

int64_t ModelSpec::attention_params() const {
  const int64_t q = hidden * heads * head_dim;
  const int64_t kv = 2 * hidden * kv_heads * head_dim;
  const int64_t o = heads * head_dim * hidden;
  const int64_t qk_norms = attention.qk_norm == QkNorm::rms ? 2 * head_dim : 0;
  return q + kv + o + qk_norms;
}

namespace {

// A dense block's parameters, and an MoE block's: all of them, or those a
// token computes with (its top-k experts').
int64_t dense_block_params(const ModelSpec& m) {
  return m.attention_params() + 2 * m.hidden + 3 * m.hidden * m.intermediate;
}
int64_t moe_block_params(const ModelSpec& m, bool active) {
  const MoeSpec& e = m.moe;
  return m.attention_params() + 2 * m.hidden + e.experts * m.hidden +
         (active ? e.top_k : e.experts) * 3 * m.hidden * e.expert_intermediate + 3 * m.hidden * e.shared_intermediate;
}

}  // namespace

int64_t ModelSpec::layer_params(int64_t i) const {
  return moe_layer(i) ? moe_block_params(*this, false) : dense_block_params(*this);
}

int64_t ModelSpec::layer_active_params(int64_t i) const {
  return moe_layer(i) ? moe_block_params(*this, true) : dense_block_params(*this);
}

int64_t ModelSpec::padded_vocab(int64_t tp) const {
  if (tp <= 1 || vocab % tp == 0) return vocab;
  const int64_t unit = kVocabPadMultiple * tp;
  return (vocab + unit - 1) / unit * unit;
}

int64_t ModelSpec::param_count() const {
  // (Closed forms over the MoE layers' count: the planner asks per candidate.)
  const int64_t n = moe_layers();
  const int64_t blocks = (layers - n) * dense_block_params(*this) + (n > 0 ? n * moe_block_params(*this, false) : 0);
  return embedding_params() + blocks + hidden + head_params();
}

int64_t ModelSpec::flop_params() const {
  const int64_t n = moe_layers();
  const int64_t blocks = (layers - n) * dense_block_params(*this) + (n > 0 ? n * moe_block_params(*this, true) : 0);
  return blocks + hidden + vocab * hidden;
}

namespace {

// Each MoE field out of range or inconsistent, named; none for a dense model
// that leaves them all at their defaults.
std::vector<std::string> moe_problems(const ModelSpec& m) {
  std::vector<std::string> bad;
  const MoeSpec& e = m.moe;
  if (!e.enabled()) {
    if (!(e == MoeSpec{}))
      bad.push_back(fmt::format("moe.experts={} but other MoE fields are set (top_k={} expert_intermediate={}); "
                                "an MoE model needs experts from 1 to {}",
                                e.experts, e.top_k, e.expert_intermediate, kMaxExperts));
    return bad;
  }
  if (e.experts > kMaxExperts)
    bad.push_back(fmt::format("moe.experts={} must be from 1 to {}", e.experts, kMaxExperts));
  if (e.top_k < 1 || e.top_k > e.experts)
    bad.push_back(fmt::format("moe.top_k={} must be from 1 to experts={}", e.top_k, e.experts));
  if (e.expert_intermediate < 1 || e.expert_intermediate > kMaxIntermediate)
    bad.push_back(fmt::format("moe.expert_intermediate={} must be from 1 to {}", e.expert_intermediate,
                              kMaxIntermediate));
  if (e.shared_intermediate < 0 || e.shared_intermediate > kMaxIntermediate)
    bad.push_back(fmt::format("moe.shared_intermediate={} must be from 0 (no shared expert) to {}",
                              e.shared_intermediate, kMaxIntermediate));
  if (!(e.route_scale > 0 && e.route_scale <= kMaxRouteScale))
    bad.push_back(fmt::format("moe.route_scale={} must be above 0 and at most {:g}", e.route_scale,
                              kMaxRouteScale));
  if (!(e.aux_loss_coef >= 0 && e.aux_loss_coef <= kMaxAuxLossCoef))
    bad.push_back(fmt::format("moe.aux_loss_coef={} must be from 0 (no balancing loss) to {:g}", e.aux_loss_coef,
                              kMaxAuxLossCoef));
  if (!(e.imbalance == 0 || (e.imbalance >= 1 && e.imbalance <= kMaxImbalance)))
    bad.push_back(fmt::format("moe.imbalance={} must be 0 (the worst case) or from 1 (balanced) to {:g}",
                              e.imbalance, kMaxImbalance));
  if (!(e.capacity_factor == 0 || (e.capacity_factor > 0 && e.capacity_factor <= kMaxCapacityFactor)))
    bad.push_back(fmt::format("moe.capacity_factor={} must be 0 (dropless) or above 0 and at most {:g}",
                              e.capacity_factor, kMaxCapacityFactor));
  if (m.layers > 0 && (e.step < 1 || e.step > m.layers)) {
    bad.push_back(fmt::format("moe.step={} must be from 1 to layers={}", e.step, m.layers));
    return bad;
  }
  for (size_t j = 0; j < e.dense_layers.size(); ++j) {
    const int64_t i = e.dense_layers[j];
    if (i < 0 || i >= m.layers)
      bad.push_back(fmt::format("moe.dense_layers holds {}, not a layer (0 to {})", i, m.layers - 1));
    else if ((i + 1) % e.step != 0)
      bad.push_back(fmt::format("moe.dense_layers holds {}, which moe.step={} already leaves dense "
                                "(MoE layers are those with (i + 1) % step == 0)",
                                i, e.step));
    if (j > 0 && i <= e.dense_layers[j - 1])
      bad.push_back(fmt::format("moe.dense_layers must ascend without repeats ({} after {})", i,
                                e.dense_layers[j - 1]));
  }
  if (bad.empty() && m.layers > 0 && m.moe_layers() == 0)
    bad.push_back(fmt::format("moe.step={} and moe.dense_layers leave no MoE layer of the {}", e.step, m.layers));
  return bad;
}

std::vector<std::string> attention_problems(const ModelSpec& m) {
  std::vector<std::string> bad;
  const AttentionVariant& a = m.attention;
  if (a.nope_interval < 0 || (m.layers > 0 && a.nope_interval > m.layers))
    bad.push_back(fmt::format("attention.nope_interval={} must be from 0 (RoPE in every layer) to layers={}",
                              a.nope_interval, m.layers));
  if (a.attention_chunk < 0 || a.attention_chunk > kMaxChunk)
    bad.push_back(fmt::format("attention.attention_chunk={} must be from 0 (the whole sequence) to {}",
                              a.attention_chunk, kMaxChunk));
  if (!(a.temperature_scale >= 0 && a.temperature_scale <= kMaxTemperatureScale))
    bad.push_back(fmt::format("attention.temperature_scale={} must be from 0 (off) to {:g}", a.temperature_scale,
                              kMaxTemperatureScale));
  else if (a.temperature_scale > 0 && (a.temperature_floor < 1 || a.temperature_floor > kMaxChunk))
    bad.push_back(fmt::format("attention.temperature_floor={} must be from 1 to {} when temperature_scale={} "
                              "scales the queries",
                              a.temperature_floor, kMaxChunk, a.temperature_scale));
  if (a.temperature_scale == 0 && a.temperature_floor != 0)
    bad.push_back(fmt::format("attention.temperature_floor={} is set but temperature_scale=0 (off); leave it 0 "
                              "or give a scale",
                              a.temperature_floor));
  if (a.temperature_scale > 0 && a.nope_interval == 0)
    bad.push_back(fmt::format("attention.temperature_scale={} scales the NoPE layers' queries, but "
                              "nope_interval=0 names none",
                              a.temperature_scale));
  return bad;
}

}  // namespace

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
  for (auto& p : moe_problems(*this)) bad.push_back(std::move(p));
  for (auto& p : attention_problems(*this)) bad.push_back(std::move(p));
  if (bad.empty()) {
    // The counts are int64 and weft multiplies them by bytes per parameter
    // (16 and more for the optimizer), so bound them, in double, before any
    // int64 product can overflow.
    const double c = double(hidden);
    const double attention = c * double(heads) * double(head_dim) * 2 + 2 * c * double(kv_heads) * double(head_dim) +
                             2 * double(head_dim) + 2 * c;
    const double moe_layers = moe.enabled() ? double(layers) : 0;  // at most every layer
    const double ffn = 3 * c * double(intermediate) * double(layers) +
                       moe_layers * (double(moe.experts) * c * (1 + 3 * double(moe.expert_intermediate)) +
                                     3 * c * double(moe.shared_intermediate));
    const double params = double(vocab) * c * 2 + double(layers) * attention + ffn + c;
    if (params > kMaxParams)
      bad.push_back(fmt::format("{:.3g} parameters (vocab={} hidden={} intermediate={} layers={} heads={} "
                                "kv_heads={} head_dim={}{}) are more than the {:.3g} weft can count",
                                params, vocab, hidden, intermediate, layers, heads, kv_heads, head_dim,
                                moe.enabled() ? fmt::format(" experts={} expert_intermediate={} shared_intermediate={}",
                                                            moe.experts, moe.expert_intermediate,
                                                            moe.shared_intermediate)
                                              : "",
                                kMaxParams));
  }
  if (!bad.empty())
    throw InputError(fmt::format("model '{}': {}", name, fmt::join(bad, "; ")));
}

std::vector<std::string> ModelSpec::not_yet_computed() const {
  // Every field of the spec is computed; chunked attention over sequences
  // longer than the chunk is a rule of the run (Layout::violations).
  return {};
}

void ModelSpec::require_computed(const std::string& what) const {
  const auto parts = not_yet_computed();
  if (parts.empty()) return;
  throw InputError(fmt::format("weft cannot {} {} yet: it does not compute {}", what, name, fmt::join(parts, ", ")));
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
  // Likewise the experts and the attention variants, only when present.
  if (moe.enabled())
    text += fmt::format("E{}k{}f{}s{}{}{}x{:.17g}g{}p{}d{}", moe.experts, moe.top_k, moe.expert_intermediate,
                        moe.shared_intermediate, router_score_name(moe.score), router_weights_name(moe.weights),
                        moe.route_scale, gate_on_name(moe.gate_on), moe.step, fmt::join(moe.dense_layers, ","));
  if (!attention.plain())
    text += fmt::format("q{}n{}c{}t{:.17g}/{}", qk_norm_name(attention.qk_norm), attention.nope_interval,
                        attention.attention_chunk, attention.temperature_scale, attention.temperature_floor);
  const uint64_t h = fnv1a64(text);
  return fmt::format("{:016x}", h);
}

std::string ModelSpec::summary() const {
  const double n = static_cast<double>(param_count());
  const std::string size = n >= 1e9 ? fmt::format("{:.2f}B", n / 1e9)
                           : n >= 1e6 ? fmt::format("{:.2f}M", n / 1e6)
                                      : fmt::format("{:.1f}K", n / 1e3);
  const std::string rope = rope_scaling_summary(rope_scaling);
  std::string extra;
  if (moe.enabled()) {
    const int64_t n_moe = moe_layers();
    const double active = double(flop_params() + embedding_params());
    extra += fmt::format("; experts {}x{} top-{} {}{}{}{}{}, {} active", moe.experts, moe.expert_intermediate,
                         moe.top_k, router_score_name(moe.score),
                         moe.weights == RouterWeights::renormalized ? " renormalized" : "",
                         moe.gate_on == GateOn::input ? " on input" : "",
                         moe.shared_intermediate > 0 ? fmt::format(" + shared {}", moe.shared_intermediate) : "",
                         n_moe < layers ? fmt::format(" in {} of {} layers", n_moe, layers) : "",
                         active >= 1e9 ? fmt::format("{:.2f}B", active / 1e9) : fmt::format("{:.2f}M", active / 1e6));
  }
  std::vector<std::string> attn;
  if (attention.qk_norm != QkNorm::none) attn.push_back(fmt::format("qk-norm {}", qk_norm_name(attention.qk_norm)));
  if (attention.nope_interval > 0) attn.push_back(fmt::format("NoPE every {}", attention.nope_interval));
  if (attention.attention_chunk > 0) attn.push_back(fmt::format("chunk {}", attention.attention_chunk));
  if (attention.temperature_scale > 0)
    attn.push_back(fmt::format("temperature {:g}/{}", attention.temperature_scale, attention.temperature_floor));
  if (!attn.empty()) extra += fmt::format("; {}", fmt::join(attn, ", "));
  return fmt::format("{} ({} params: V={} C={} F={} L={} H={} H_kv={} D={}{}{}{}{})", name, size, vocab,
                     hidden, intermediate, layers, heads, kv_heads, head_dim,
                     tied_embeddings ? " tied" : "", rope.empty() ? "" : " ", rope, extra);
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
  // Likewise the experts and the attention variants.
  if (m.moe.enabled())
    j["moe"] = {{"experts", m.moe.experts},
                {"top_k", m.moe.top_k},
                {"expert_intermediate", m.moe.expert_intermediate},
                {"shared_intermediate", m.moe.shared_intermediate},
                {"score", router_score_name(m.moe.score)},
                {"weights", router_weights_name(m.moe.weights)},
                {"route_scale", m.moe.route_scale},
                {"gate_on", gate_on_name(m.moe.gate_on)},
                {"step", m.moe.step},
                {"dense_layers", m.moe.dense_layers},
                {"aux_loss_coef", m.moe.aux_loss_coef},
                {"aux_scope", aux_loss_scope_name(m.moe.aux_scope)},
                {"capacity_factor", m.moe.capacity_factor},
                {"imbalance", m.moe.imbalance},
                {"moe_layers", m.moe_layers()},
                {"active_params", m.flop_params() + m.embedding_params()}};
  if (!m.attention.plain())
    j["attention"] = {{"qk_norm", qk_norm_name(m.attention.qk_norm)},
                      {"nope_interval", m.attention.nope_interval},
                      {"attention_chunk", m.attention.attention_chunk},
                      {"temperature_scale", m.attention.temperature_scale},
                      {"temperature_floor", m.attention.temperature_floor}};
}

namespace {

// One of `names` (the enum's values in order) read from j[key] of `section`,
// or `fallback` when absent; InputError naming the field and the valid names.
template <typename Enum, size_t N>
Enum enum_field(const nlohmann::json& j, const char* section, const char* key, Enum fallback,
                const std::array<const char*, N>& names) {
  if (!j.contains(key)) return fallback;
  for (size_t i = 0; i < N; ++i)
    if (j[key].is_string() && j[key].get<std::string>() == names[i]) return Enum(i);
  throw InputError(fmt::format("model spec: field '{}.{}' is {}; valid: {}", section, key, j[key].dump(),
                               fmt::join(names, ", ")));
}

// A field of `section`: an integer or number as T, `fallback` when absent
// and `fallback` is given, else required.
template <typename T>
T number_field(const nlohmann::json& j, const char* section, const char* key, std::optional<T> fallback) {
  if (!j.contains(key)) {
    if (fallback) return *fallback;
    throw InputError(fmt::format("model spec: missing field '{}.{}'", section, key));
  }
  const bool ok = std::is_integral_v<T> ? j[key].is_number_integer() : j[key].is_number();
  if (!ok)
    throw InputError(fmt::format("model spec: field '{}.{}' must be {}, got {}", section, key,
                                 std::is_integral_v<T> ? "an integer" : "a number", j[key].dump()));
  return j[key].get<T>();
}

MoeSpec moe_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw InputError(fmt::format("model spec: field 'moe' must be an object, got {}", j.dump()));
  MoeSpec e;
  e.experts = number_field<int64_t>(j, "moe", "experts", std::nullopt);
  e.top_k = number_field<int64_t>(j, "moe", "top_k", std::nullopt);
  e.expert_intermediate = number_field<int64_t>(j, "moe", "expert_intermediate", std::nullopt);
  e.shared_intermediate = number_field<int64_t>(j, "moe", "shared_intermediate", int64_t{0});
  e.score = enum_field(j, "moe", "score", RouterScore::softmax, std::array{"softmax", "sigmoid"});
  e.weights = enum_field(j, "moe", "weights", RouterWeights::renormalized, std::array{"scores", "renormalized"});
  e.route_scale = number_field<double>(j, "moe", "route_scale", 1.0);
  e.gate_on = enum_field(j, "moe", "gate_on", GateOn::output, std::array{"output", "input"});
  e.step = number_field<int64_t>(j, "moe", "step", int64_t{1});
  if (j.contains("dense_layers")) {
    const auto& d = j["dense_layers"];
    if (!d.is_array())
      throw InputError(fmt::format("model spec: field 'moe.dense_layers' must be a list of layers, got {}", d.dump()));
    for (const auto& i : d) {
      if (!i.is_number_integer())
        throw InputError(fmt::format("model spec: field 'moe.dense_layers' holds {}, not a layer", i.dump()));
      e.dense_layers.push_back(i.get<int64_t>());
    }
  }
  e.aux_loss_coef = number_field<double>(j, "moe", "aux_loss_coef", 0.0);
  e.aux_scope = enum_field(j, "moe", "aux_scope", AuxLossScope::global, std::array{"global", "per_layer"});
  e.capacity_factor = number_field<double>(j, "moe", "capacity_factor", 0.0);
  e.imbalance = number_field<double>(j, "moe", "imbalance", 0.0);
  return e;
}

AttentionVariant attention_from_json(const nlohmann::json& j) {
  if (!j.is_object())
    throw InputError(fmt::format("model spec: field 'attention' must be an object, got {}", j.dump()));
  AttentionVariant a;
  a.qk_norm = enum_field(j, "attention", "qk_norm", QkNorm::none, std::array{"none", "rms", "l2"});
  a.nope_interval = number_field<int64_t>(j, "attention", "nope_interval", int64_t{0});
  a.attention_chunk = number_field<int64_t>(j, "attention", "attention_chunk", int64_t{0});
  a.temperature_scale = number_field<double>(j, "attention", "temperature_scale", 0.0);
  a.temperature_floor = number_field<int64_t>(j, "attention", "temperature_floor", int64_t{0});
  return a;
}

}  // namespace

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
  m.moe = j.contains("moe") ? moe_from_json(j["moe"]) : MoeSpec{};
  m.attention = j.contains("attention") ? attention_from_json(j["attention"]) : AttentionVariant{};
  m.validate();
}

}  // namespace weft
