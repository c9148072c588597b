#include "core/run_spec.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"

namespace weft {

void RunSpec::validate() const {
  if (seq <= 0) throw InputError(fmt::format("--seq {} must be a positive token count", seq));
  if (global_batch <= 0)
    throw InputError(
        fmt::format("--global-batch {} must be a positive number of sequences", global_batch));
}

const char* to_string(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision precision_parse(const std::string& s) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp32") return Precision::fp32;
  throw InputError(fmt::format("unknown precision '{}'; valid: bf16, fp32", s));
}

void to_json(nlohmann::json& j, const RunSpec& r) {
  j = nlohmann::json{
      {"seq", r.seq}, {"global_batch", r.global_batch}, {"precision", to_string(r.precision)}};
}

void from_json(const nlohmann::json& j, RunSpec& r) {
  if (!j.is_object() || !j.contains("seq") || !j.contains("global_batch"))
    throw InputError("run spec: expected {\"seq\": T, \"global_batch\": B, \"precision\": ...}");
  r.seq = json_integer(j, "seq", "run spec");
  r.global_batch = json_integer(j, "global_batch", "run spec");
  r.precision = precision_parse(j.value("precision", std::string("bf16")));
  r.validate();
}

}  // namespace weft
