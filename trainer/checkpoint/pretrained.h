// Pretrained weights a run starts from (`weft train --init`): a Hugging Face
// model folder (hf_folder.h) or a weft checkpoint folder (checkpoint.h). Only
// the parameters are taken; the run starts at step 0 with a fresh optimizer
// and data position, which is what sets --init apart from --resume.
//
// Everything is checked when the folder is opened, before any rank copies a
// value: its model (config.json or the manifest), and each parameter's
// presence, shape and dtype. pretrained_check then compares that model with
// the run's, field by field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/model_spec.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_folder.h"

namespace weft::checkpoint {

enum class PretrainedKind { hugging_face, weft_checkpoint };

// An opened folder. Tensors point into its mapped files and live as long as
// this object.
struct Pretrained {
  std::string dir;
  PretrainedKind kind = PretrainedKind::hugging_face;
  ModelSpec model;  // as the folder describes it
  int64_t bos_token_id = -1;  // -1 when the folder names none (or several)
  int64_t eos_token_id = -1;
  // The stored tensor of each parameter of hf_param_table(model), in its
  // stored dtype: for a weft checkpoint the fp32 master copy where it has one.
  std::map<std::string, TensorRef, std::less<>> params;
  std::optional<HfFolder> hf;             // what keeps the files mapped
  // Tensors converted on opening, which `params` point into: Llama 4's
  // routed experts, stored fused (feed_forward.experts.gate_up_proj (E, C,
  // 2F) and down_proj (E, F, C)), as each expert's gate and up (F, C) and
  // down (C, F); and its q and k projections, whose rows Meta's rotary
  // embedding pairs as neighbours (2i, 2i + 1) within each head, in weft's
  // (and the Hugging Face Llama's) order, pairs (i, i + D/2): attention is
  // the same, since queries and keys are permuted alike.
  std::vector<std::vector<std::byte>> converted;
  std::optional<Checkpoint> checkpoint;

  // InternalError when `name` is not a parameter of `model` (open checked
  // every one).
  const TensorRef& param(std::string_view name) const;
  // e.g. "Hugging Face folder 'x' (4 files, BF16)", for the run's log.
  std::string describe() const;
};

// A content hash of the parameters (CRC32C over each one's name, dtype,
// shape and stored bytes, in name order; "crc32c:xxxxxxxx"): what a LoRA
// checkpoint records of the base model its adapters were trained on. It
// reads every byte once (several GB/s).
std::string pretrained_hash(const Pretrained& p);

// Only the model the folder holds (config.json or manifest.json); no weights
// are read. The same InputError as pretrained_open for a folder of neither kind.
ModelSpec pretrained_model(const std::string& dir);

// Opens `dir`. InputError when it is missing, not a folder, or neither a
// Hugging Face folder (config.json) nor a weft checkpoint (manifest.json);
// FileFormatError naming the folder and the tensor for a parameter that is
// missing, has a shape other than the model's (both shapes named) or a
// dtype that is not floating point, and for a tensor that is no parameter of
// weft's Llama (a bias, say). Tensors that hold no parameter are ignored:
// rotary inv_freq buffers, which older transformers saved, and a tied model's
// lm_head.weight, which transformers also overwrites with the embedding.
// `verify` applies to weft checkpoints (load_checkpoint); Hugging Face folders
// carry no checksums.
Pretrained pretrained_open(const std::string& dir, Verify verify = Verify::checksums);

// InputError naming `dir` and every architecture field in which the run's
// model differs from the pretrained one. The run's vocabulary may be larger
// (a padded vocabulary: state_io.h says how the extra rows start), not smaller.
void pretrained_check(const ModelSpec& pretrained, const ModelSpec& run, const std::string& dir);

}  // namespace weft::checkpoint
