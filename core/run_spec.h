// RunSpec: what one training run asks for, independent of the layout.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace weft {

enum class Precision { bf16, fp32 };

// The linear layers of a block, in the order the trainer runs them (and
// memory::Fp8Gemm indexes them): q, k, v and o of the attention, gate, up
// and down of the MLP.
enum class Linear : int { q, k, v, o, gate, up, down };
inline constexpr int kLinears = 7;
// Hugging Face's module name of each (q_proj, ..., down_proj) and the short
// one the command line takes (q, ..., down).
const char* hf_module_name(Linear g);
const char* short_name(Linear g);
// Column-parallel under tensor parallelism (q, k, v, gate, up: the outputs
// split), else row-parallel (o, down: the inputs split).
inline bool column_parallel(Linear g) { return g != Linear::o && g != Linear::down; }

// LoRA fine-tuning (rank 0: off). Each targeted linear layer y = x W^T gains
// adapters A (r, in) and B (out, r): y = x W^T + (alpha / r) (drop(x) A^T) B^T,
// with A drawn at random and B zero at the start, so training starts from
// the base model; every weight of the base model (W, the norms, the
// embedding and the head) is frozen: no gradient, no optimizer state.
struct LoraSpec {
  int64_t rank = 0;
  double alpha = 0;    // the adapters' output is scaled by alpha / rank
  double dropout = 0;  // of the adapters' input, while training
  uint32_t targets = 0;  // bit int(Linear)
  // An MoE model's routed experts' fused gate_up adapter at a rank of its
  // own, its alpha scaled alike (0: rank and alpha): what PEFT makes of a
  // Mixtral's or Qwen3-MoE's gate and up targets, fused at twice the rank
  // (its rank_pattern and alpha_pattern for gate_up_proj).
  int64_t gate_up_rank = 0;
  bool enabled() const { return rank > 0; }
  bool targets_linear(Linear g) const { return (targets >> int(g)) & 1u; }
  double scale() const { return alpha / double(rank); }
  int64_t experts_gate_up_rank() const { return gate_up_rank > 0 ? gate_up_rank : rank; }
  double experts_gate_up_alpha() const { return alpha * double(experts_gate_up_rank()) / double(rank); }
  // "q,k,v,o,gate,up,down" (the targeted ones, in block order).
  std::string targets_text() const;
  // The common practice (the QLoRA study's finding that adapting every
  // linear layer matches full fine-tuning): all seven.
  static constexpr uint32_t kAllTargets = (1u << kLinears) - 1;
  // LoRA of `rank` with alpha 2 x rank, no dropout, every linear layer.
  static LoraSpec with_rank(int64_t rank);
  // "q,v" or "all" -> the target bits; InputError naming a bad entry.
  static uint32_t parse_targets(const std::string& text);
  bool operator==(const LoraSpec&) const = default;
};

struct RunSpec {
  int64_t seq = 2048;           // T, tokens per sequence
  int64_t global_batch = 2048;  // sequences per optimizer step, over all ranks
  Precision precision = Precision::bf16;
  LoraSpec lora{};              // rank 0: every weight trains

  int64_t tokens_per_step() const { return seq * global_batch; }
  // Bytes of one weight/activation element in compute precision.
  int64_t compute_bytes() const { return precision == Precision::bf16 ? 2 : 4; }
  // InputError naming any zero or negative value.
  void validate() const;
};

const char* to_string(Precision p);
Precision precision_parse(const std::string& s);

// {"rank", "alpha", "dropout", "targets": "q,k,...", and "gate_up_rank"
// where it is set}; a run without LoRA writes no "lora" field.
void to_json(nlohmann::json& j, const LoraSpec& l);
void from_json(const nlohmann::json& j, LoraSpec& l);
void to_json(nlohmann::json& j, const RunSpec& r);
void from_json(const nlohmann::json& j, RunSpec& r);

}  // namespace weft
