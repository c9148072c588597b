// PEFT LoRA adapter folders, as the `peft` package's save_pretrained writes
// and loads them:
//
//   adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha",
//                               "lora_dropout", "target_modules", ...}
//   adapter_model.safetensors  "base_model.model.<module>.lora_A.weight"
//                              (r, in) and ".lora_B.weight" (out, r)
//
// An MoE model's routed experts are adapted as PEFT adapts transformers'
// 3-D expert tensors ("target_parameters": ["experts.gate_up_proj",
// "experts.down_proj"]): one pair per layer and tensor, every expert's
// packed, lora_A (r E, in) expert by expert and lora_B (out, r E) rank by
// rank (column j E + e is expert e's column j), where in and out are the
// stored tensor's (E, out, in) for Mixtral and Qwen3-MoE; Llama 4 stores
// its experts (E, in, out), so there lora_A is weft's B transposed and
// lora_B its A transposed. With both targeted PEFT nests its two wrappers:
// gate_up_proj's pair is "...experts.base_layer.lora_A.weight", down's
// "...experts.lora_A.weight". weft keeps each expert's (hf_names.h's
// lora_expert_name) and converts both ways (peft_expert_pack / _unpack).
//
// Only what weft's LoRA computes is read: plain LoRA (no DoRA, no rsLoRA,
// no per-layer rank or alpha patterns, no biases, no extra trained modules,
// weights stored (out, in)); anything else is refused with the field named.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model_spec.h"
#include "core/run_spec.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/safetensors.h"

namespace weft::checkpoint {

inline constexpr const char* kPeftConfigFile = "adapter_config.json";
inline constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";

struct PeftAdapter {
  std::string dir;
  LoraSpec lora;          // r, lora_alpha, lora_dropout, target_modules
  nlohmann::json config;  // adapter_config.json as read
  SafetensorsFile file;
  // Adapters read in another row order than the file's: a Llama 4 model's
  // q and k lora_B, whose rows PEFT keeps in Meta's rotary pairs, as the
  // base's (llama4_form.h); by weft's name, into `converted`.
  std::vector<std::vector<std::byte>> converted;
  std::map<std::string, TensorRef, std::less<>> reordered;
  // The adapter of block `layer`'s linear g (b: lora_B), by weft's name
  // (lora_param_name), in weft's row order; FileFormatError naming the
  // folder when absent.
  const TensorRef& tensor(const std::string& name) const;
};

// Opens and checks `dir`: InputError when it is not a PEFT LoRA folder or
// uses a feature weft's LoRA lacks (named); FileFormatError for a tensor
// whose shape is not the model's (both shapes named), a missing adapter, or
// a tensor that is no LoRA adapter of the model's linear layers.
PeftAdapter peft_open(const std::string& dir, const ModelSpec& m);

// The name PEFT's file gives layer `layer`'s packed adapter of `site` (A or
// B), without kPeftPrefix.
std::string peft_expert_name(const ModelSpec& m, const LoraSpec& lora, ExpertLora site, int64_t layer, bool b);
// Every expert's adapter (weft's, lora_expert_shape, fp32, expert after
// expert) packed into PEFT's tensor, and back.
std::vector<float> peft_expert_pack(const ModelSpec& m, ExpertLora site, int64_t rank, bool b,
                                    const std::vector<const float*>& experts);
std::vector<int64_t> peft_expert_shape(const ModelSpec& m, ExpertLora site, int64_t rank, bool b);
void peft_expert_unpack(const ModelSpec& m, ExpertLora site, int64_t rank, bool b, const float* packed,
                        int64_t expert, float* out);

// Writes a PEFT folder: adapter_config.json (base_model_name_or_path as given)
// and adapter_model.safetensors with `tensors` (weft's names, stored under
// PEFT's), and the export marker, built aside and swapped in. Creates the
// folder; replaces only an earlier adapter export (export_target_check), never
// one of `inputs` (the first: the checkpoint it comes from).
// `tensors` are stored as named; an MoE model's experts' go in packed
// (peft_expert_pack) under peft_expert_name. `m` says which modules and
// expert tensors the config targets.
void peft_write(const std::string& dir, const ModelSpec& m, const LoraSpec& lora, const std::string& base_model,
                const std::vector<TensorRef>& tensors, const std::vector<std::string>& inputs);

}  // namespace weft::checkpoint
