// ModelSpec: the architecture of a Llama-family decoder, its presets, its exact
// parameter count, and import from a Hugging Face config.json.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/moe_spec.h"
#include "core/rope_scaling.h"

namespace weft {

// The bounds validate() puts on a model, far beyond any published Llama
// (V 256k, C 16k, F 53k, L 126, H 128, D 256) and far inside what the int64
// sizes and the int32 token ids and kernel loop counts can hold.
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;  // ids are int32
inline constexpr int64_t kVocabPadMultiple = 128;        // rows of a padded vocabulary per tp rank: a multiple
inline constexpr int64_t kMaxHidden = int64_t{1} << 20;
inline constexpr int64_t kMaxIntermediate = int64_t{1} << 22;
inline constexpr int64_t kMaxLayers = int64_t{1} << 14;
inline constexpr int64_t kMaxHeads = int64_t{1} << 14;  // H and H_kv
inline constexpr int64_t kMaxHeadDim = int64_t{1} << 14;
// RoPE's base: published models use 1e4 to 1e8; below 1 the frequencies
// would rise with the dim.
inline constexpr double kMinRopeTheta = 1, kMaxRopeTheta = 1e12;
// RMSNorm's epsilon: published models use 1e-6 to 1e-5; it must stay a
// normal fp32 number (above 1.2e-38) and must not swamp the mean square.
inline constexpr double kMinNormEps = 1e-30, kMaxNormEps = 1;

struct ModelSpec {
  std::string name;
  int64_t vocab = 0;         // V
  int64_t hidden = 0;        // C
  int64_t intermediate = 0;  // F, the dense layers' SwiGLU inner width
  int64_t layers = 0;        // L
  int64_t heads = 0;         // H
  int64_t kv_heads = 0;      // H_kv (GQA when < H)
  int64_t head_dim = 0;      // D; H * D need not equal C
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // none for plain RoPE; llama3 for Llama 3.1 and 3.2
  double norm_eps = 1e-5;
  bool tied_embeddings = false;
  int64_t max_seq = 2048;    // max_position_embeddings, informational
  MoeSpec moe;                  // experts; none for a dense Llama
  AttentionVariant attention;   // plain for Llama (core/moe_spec.h)

  // Whether layer i (from 0) has an MoE FFN, and how many do. (Inline: the
  // planner asks for each layer of each stage of each candidate.)
  bool moe_layer(int64_t i) const {
    if (!moe.enabled() || moe.step < 1 || (i + 1) % moe.step != 0) return false;
    return !std::binary_search(moe.dense_layers.begin(), moe.dense_layers.end(), i);
  }
  int64_t moe_layers() const;
  // Parameters of one block's attention: q, k, v, o and Qwen3's q and k norms.
  int64_t attention_params() const;
  // Parameters of block i: attention, two norms, and its FFN: gate, up and
  // down, or the router, every expert's and the shared expert's.
  int64_t layer_params(int64_t i) const;
  // Of those, the ones a token's matmuls use: the router, k experts' and the
  // shared expert's (every one in a dense block).
  int64_t layer_active_params(int64_t i) const;
  // Embedding table V x C.
  int64_t embedding_params() const { return vocab * hidden; }
  // LM head parameters stored separately (0 when tied to the embedding).
  int64_t head_params() const { return tied_embeddings ? 0 : vocab * hidden; }
  // The rows of the embedding and head tables under tensor parallelism of
  // degree tp: V where tp divides it, else V rounded up to a multiple of
  // kVocabPadMultiple * tp (Megatron's rule: each rank's shard a multiple of
  // 128 rows). The extra rows are padding: zero, never looked up, masked out
  // of the softmax, and left out of checkpoints and exports, so the model and
  // its losses stay those of V. --vocab instead changes V itself.
  int64_t padded_vocab(int64_t tp) const;
  // Every stored parameter, counted once (tied weights once).
  int64_t param_count() const;
  // Parameters that take part in a matmul per token: every block weight (of
  // an MoE layer the router, the k chosen experts and the shared one), the
  // final norm and the LM head (V x C, also when tied), but not the input
  // embedding lookup. This is the N of MFU's 6N (see core/flops.h).
  int64_t flop_params() const;

  // Throws InputError naming each field that is zero/negative, past the
  // bounds above or inconsistent.
  void validate() const;
  // The parts of this model weft's trainer, memory model and cost model do
  // not compute yet, each named; the one place a field the spec gains
  // before the trainer computes it is refused. Empty for every model today:
  // MoE layers train under the layouts trainer::require_moe_layout allows,
  // and attention within chunks over sequences past the chunk is a layout
  // rule (Layout::violations).
  std::vector<std::string> not_yet_computed() const;
  // InputError naming them, when there are any: "weft cannot <what> <name>
  // yet: ...".
  void require_computed(const std::string& what) const;
  // Stable 16-hex-digit hash of the architecture (not the name, nor the
  // balancing loss's coefficient and scope: a training setting).
  std::string hash() const;
  // One-line summary, e.g. "llama2-7b (6.74B params: V=32000 C=4096 ...)".
  std::string summary() const;
};

// Names of every preset, in a stable order.
std::vector<std::string> model_preset_names();
// A preset by name; InputError listing valid names when unknown.
ModelSpec model_preset(const std::string& name);
// Reads a Hugging Face config.json of LlamaForCausalLM, MixtralForCausalLM,
// Qwen3MoeForCausalLM or Llama 4 (Llama4ForCausalLM, model_type
// "llama4_text", or the text_config of Llama4ForConditionalGeneration);
// InputError naming the file and the missing or invalid field: a value past
// the bounds above, a bos or eos token id outside the vocabulary, another
// architecture, or a computation weft lacks (biases, sliding-window
// attention, router jitter, ...).
ModelSpec model_from_hf_config(const std::string& path);
ModelSpec model_from_hf_config_json(const nlohmann::json& j, const std::string& origin);
// A preset name or a path to a config.json.
ModelSpec model_resolve(const std::string& name_or_path);

// rope_scaling in Hugging Face's form, which weft's own JSON shares:
// {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
//  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, or
// null for plain RoPE.
nlohmann::json rope_scaling_to_json(const RopeScaling& s);
// Reads that form (the type also under the older key "type"; null, a missing
// type and "default" are plain RoPE) and validates it. InputError naming
// `origin`, `field` and the offending key: a rope type weft does not compute
// (linear, dynamic, yarn, longrope, ...), a missing or non-numeric value, or
// a value out of range.
RopeScaling rope_scaling_from_json(const nlohmann::json& j, const std::string& origin,
                                   const std::string& field);

void to_json(nlohmann::json& j, const ModelSpec& m);
void from_json(const nlohmann::json& j, ModelSpec& m);

}  // namespace weft
