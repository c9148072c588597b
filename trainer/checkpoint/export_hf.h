// Export of a checkpoint as a Hugging Face model folder that transformers
// loads: config.json and a model.safetensors of fp32 parameters under their
// Hugging Face names. A dense model is a LlamaForCausalLM; an MoE model the
// class its FFN is named for (hf_names.h's ffn_naming): MixtralForCausalLM,
// Qwen3MoeForCausalLM or Llama4ForCausalLM (Llama 4's text model, its
// experts fused as its checkpoints store them: llama4_form.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model_spec.h"
#include "trainer/checkpoint/file_io.h"
#include "trainer/checkpoint/safetensors.h"

namespace weft::checkpoint {

// The config.json of a model, of its family's class; bos/eos ids are
// written when not negative. model_from_hf_config reads it back to the same
// model, the balancing loss's scope aside (a run's setting, which configs do
// not record). InputError naming every part of the model that class does
// not compute (a Mixtral-named MoE with dense layers, say).
nlohmann::json hf_config_json(const ModelSpec& m, int64_t bos_token_id = -1,
                              int64_t eos_token_id = -1);

struct ExportOptions {
  // Called after "config", "model", "synced" and "swapped"; for tests.
  StageHook on_stage;
};

// Loads and validates `checkpoint_dir` and writes `out_dir` atomically (built
// under a temporary name, then swapped in). Parameters are written as fp32:
// the fp32 master copy where the checkpoint has one, else the stored weights
// widened, with the marker (kExportMarkerFile) that lets a later export
// replace the folder. InputError when `out_dir` exists and is anything but
// an earlier export of weft's (config.json and model.safetensors with the
// marker), so a mistyped path never deletes a user's files.
void export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
               const ExportOptions& options = {});

// The folder export_hf writes, from given fp32 tensors under Hugging Face
// names (a merged LoRA model); the same checks of `out_dir` (none of
// `inputs`, the first of which is the checkpoint it comes from, may be it,
// hold it or lie inside it) and the same atomic swap.
void hf_folder_write(const std::string& out_dir, const std::vector<std::string>& inputs, const ModelSpec& model,
                     int64_t bos_token_id, int64_t eos_token_id, const std::vector<TensorRef>& tensors,
                     const ExportOptions& options = {});

}  // namespace weft::checkpoint
