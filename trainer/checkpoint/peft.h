// PEFT LoRA adapter folders, as the `peft` package's save_pretrained writes
// and loads them:
//
//   adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha",
//                               "lora_dropout", "target_modules", ...}
//   adapter_model.safetensors  "base_model.model.<module>.lora_A.weight"
//                              (r, in) and ".lora_B.weight" (out, r)
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

// Writes a PEFT folder: adapter_config.json (base_model_name_or_path as given)
// and adapter_model.safetensors with `tensors` (weft's names, stored under
// PEFT's), and the export marker, built aside and swapped in. Creates the
// folder; replaces only an earlier adapter export (export_target_check), never
// one of `inputs` (the first: the checkpoint it comes from).
void peft_write(const std::string& dir, const LoraSpec& lora, const std::string& base_model,
                const std::vector<TensorRef>& tensors, const std::vector<std::string>& inputs);

}  // namespace weft::checkpoint
