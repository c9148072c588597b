// RunSpec: what one training run asks for, independent of the layout.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace weft {

enum class Precision { bf16, fp32 };

struct RunSpec {
  int64_t seq = 2048;           // T, tokens per sequence
  int64_t global_batch = 2048;  // sequences per optimizer step, over all ranks
  Precision precision = Precision::bf16;

  int64_t tokens_per_step() const { return seq * global_batch; }
  // Bytes of one weight/activation element in compute precision.
  int64_t compute_bytes() const { return precision == Precision::bf16 ? 2 : 4; }
  // InputError naming any zero or negative value.
  void validate() const;
};

const char* to_string(Precision p);
Precision precision_parse(const std::string& s);

void to_json(nlohmann::json& j, const RunSpec& r);
void from_json(const nlohmann::json& j, RunSpec& r);

}  // namespace weft
