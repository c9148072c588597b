#include "core/run_spec.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"

namespace weft {

namespace {

constexpr const char* kHfModules[kLinears] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
constexpr const char* kShort[kLinears] = {"q", "k", "v", "o", "gate", "up", "down"};

}  // namespace

const char* hf_module_name(Linear g) { return kHfModules[int(g)]; }
const char* short_name(Linear g) { return kShort[int(g)]; }

std::string LoraSpec::targets_text() const {
  std::string out;
  for (int g = 0; g < kLinears; ++g)
    if (targets_linear(Linear(g))) out += (out.empty() ? "" : ",") + std::string(kShort[g]);
  return out;
}

LoraSpec LoraSpec::with_rank(int64_t rank) {
  return LoraSpec{.rank = rank, .alpha = 2.0 * double(rank), .dropout = 0, .targets = kAllTargets};
}

uint32_t LoraSpec::parse_targets(const std::string& text) {
  if (text == "all") return kAllTargets;
  uint32_t bits = 0;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, end - at);
    // Hugging Face's module names (q_proj) are taken too.
    if (item.size() > 5 && item.ends_with("_proj")) item.resize(item.size() - 5);
    int found = -1;
    for (int g = 0; g < kLinears; ++g)
      if (item == kShort[g]) found = g;
    if (found < 0)
      throw InputError(fmt::format("--lora-targets '{}': unknown layer '{}'; valid: any of q, k, v, o, gate, up, "
                                   "down (or q_proj, ...), comma-separated, or all",
                                   text, text.substr(at, end - at)));
    bits |= 1u << found;
    at = end + 1;
  }
  return bits;
}

void RunSpec::validate() const {
  if (seq <= 0) throw InputError(fmt::format("--seq {} must be a positive token count", seq));
  if (global_batch <= 0)
    throw InputError(
        fmt::format("--global-batch {} must be a positive number of sequences", global_batch));
  if (lora.rank < 0) throw InputError(fmt::format("--lora {} must be a positive rank (0: off)", lora.rank));
  if (lora.enabled()) {
    if (!(lora.alpha > 0) || !std::isfinite(lora.alpha))
      throw InputError(fmt::format("--lora-alpha {} must be a positive number", lora.alpha));
    if (!(lora.dropout >= 0 && lora.dropout < 1))
      throw InputError(fmt::format("--lora-dropout {} must lie in [0, 1)", lora.dropout));
    if ((lora.targets & LoraSpec::kAllTargets) == 0 || (lora.targets & ~LoraSpec::kAllTargets) != 0)
      throw InputError("--lora-targets must name at least one of q, k, v, o, gate, up, down");
    if (lora.gate_up_rank < 0)
      throw InputError(fmt::format("--lora-gate-up-rank {} must be a positive rank (0: --lora's)", lora.gate_up_rank));
    if (lora.gate_up_rank > 0 && !lora.targets_linear(Linear::gate))
      throw InputError(fmt::format("--lora-gate-up-rank {} sets the experts' gate_up adapters' rank, but "
                                   "--lora-targets {} leaves gate and up out",
                                   lora.gate_up_rank, lora.targets_text()));
  }
}

const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision precision_parse(const std::string& s) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp32") return Precision::fp32;
  throw InputError(fmt::format("unknown precision '{}'; valid: bf16, fp32", s));
}

void to_json(nlohmann::json& j, const LoraSpec& l) {
  j = nlohmann::json{{"rank", l.rank}, {"alpha", l.alpha}, {"dropout", l.dropout}, {"targets", l.targets_text()}};
  if (l.gate_up_rank > 0) j["gate_up_rank"] = l.gate_up_rank;
}

void from_json(const nlohmann::json& j, LoraSpec& l) {
  if (!j.is_object() || !j.contains("rank"))
    throw InputError("lora: expected {\"rank\": r, \"alpha\": a, \"dropout\": p, \"targets\": \"q,v\"}");
  l.rank = json_integer(j, "rank", "lora");
  l.alpha = j.value("alpha", 2.0 * double(l.rank));
  l.dropout = j.value("dropout", 0.0);
  l.targets = LoraSpec::parse_targets(j.value("targets", std::string("all")));
  l.gate_up_rank = j.contains("gate_up_rank") ? json_integer(j, "gate_up_rank", "lora") : 0;
}

void to_json(nlohmann::json& j, const RunSpec& r) {
  j = nlohmann::json{
      {"seq", r.seq}, {"global_batch", r.global_batch}, {"precision", to_string(r.precision)}};
  if (r.lora.enabled()) j["lora"] = r.lora;
}

void from_json(const nlohmann::json& j, RunSpec& r) {
  if (!j.is_object() || !j.contains("seq") || !j.contains("global_batch"))
    throw InputError("run spec: expected {\"seq\": T, \"global_batch\": B, \"precision\": ...}");
  r.seq = json_integer(j, "seq", "run spec");
  r.global_batch = json_integer(j, "global_batch", "run spec");
  r.precision = precision_parse(j.value("precision", std::string("bf16")));
  r.lora = j.contains("lora") ? j.at("lora").get<LoraSpec>() : LoraSpec{};
  r.validate();
}

}  // namespace weft
