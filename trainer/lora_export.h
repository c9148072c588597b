// A LoRA checkpoint out of weft: its adapters as a PEFT adapter folder that
// the `peft` package loads onto the transformers base, or merged into the
// base as a whole Hugging Face model folder (what peft's merge_and_unload()
// gives): W + (alpha / r) B A for every adapted layer.
#pragma once

#include <string>

namespace weft::trainer {

// InputError when the checkpoint holds no adapters (a full model: export_hf)
// or its out folder holds anything but an earlier export. The adapters are
// written in fp32 (the master copy where the checkpoint has one);
// base_model_name_or_path is the recorded base folder (empty for a random
// base).
void lora_export_adapter(const std::string& checkpoint_dir, const std::string& out_dir);

// The base model (the recorded folder, its hash checked, or the random
// initialisation from its seed) with the adapters merged in, in fp32; the
// sums W + s B A are taken in fp64 and rounded once.
void lora_export_merged(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace weft::trainer
