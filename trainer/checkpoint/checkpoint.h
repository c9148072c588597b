// Checkpoint folders. A checkpoint is a folder (by convention
// <root>/step_000100) holding
//
//   model.safetensors      every parameter, unsharded, Hugging Face Llama
//                          names (hf_names.h), metadata {"format": "pt"}
//   optimizer.safetensors  "exp_avg.<param>", "exp_avg_sq.<param>" and,
//                          when the model is kept in lower precision,
//                          "master.<param>" (fp32), unsharded
//   manifest.json          manifest.h; lists both files with size and CRC32C
//
// Tensors are stored whole, in the model's own shapes, so a checkpoint saved
// under one parallel layout loads under any other: each rank slices what its
// layout holds from the full tensors.
//
// Saving builds the folder under "<dir>.tmp-<pid>", fsyncs every file and the
// folder, then swaps it into place (file_io.h: commit_dir). A crash at any
// moment leaves the previous checkpoint complete; leftovers carry suffixes
// that latest_checkpoint ignores. Loading checks the manifest, then every
// file's size and checksum, then the tensor names and shapes, before handing
// out any tensor: a damaged checkpoint is refused whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model_spec.h"
#include "trainer/checkpoint/file_io.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/manifest.h"
#include "trainer/checkpoint/safetensors.h"

namespace weft::checkpoint {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
// Delayed FP8 scaling's amax history (Layout::fp8), in optimizer.safetensors
// beside the Adam moments: (layers, slots, kFp8DelayedHistory) fp32, the
// slots 7 GEMMs x 3 operands and in an MoE model each routed expert's 3
// GEMMs x 3 operands after them (memory::fp8_delayed_slots_per_block),
// oldest entry first; the manifest's run.fp8_history_len says how many
// entries are filled. Layout-independent: after each step every rank of a
// stage holds the same history, of every expert.
inline constexpr const char* kFp8HistoryTensor = "fp8.amax_history";
inline constexpr const char* kManifestFile = "manifest.json";

struct SaveOptions {
  // Called after each stage: "model", "optimizer", "manifest", "synced",
  // "swapped" (and "moved_aside" where the file system cannot swap folders).
  // Tests use it to fail or kill the process at that moment.
  StageHook on_stage;
};

// Writes a checkpoint folder at `dir` (replacing an earlier checkpoint there)
// and returns the manifest as written, with weft_version and files filled in.
// `model_tensors` must be exactly hf_param_table(manifest.model), in any
// order, with those shapes and a floating-point dtype; `optimizer_tensors`
// use optim_state_name names of those parameters and their shapes. InputError
// for anything else, and when `dir` exists but is not a checkpoint folder.
Manifest save_checkpoint(const std::string& dir, const std::vector<TensorRef>& model_tensors,
                         const std::vector<TensorRef>& optimizer_tensors, const Manifest& manifest,
                         const SaveOptions& options = {});

// A loaded and fully validated checkpoint. Tensors point into the mapped
// files and live as long as this object.
struct Checkpoint {
  std::string dir;
  Manifest manifest;
  SafetensorsFile model;
  SafetensorsFile optimizer;
};

// How much of a checkpoint loading verifies. The checksums read every byte
// of its files: a run that uses the tensors verifies them; a check of the
// command line before the run starts needs only the structure.
enum class Verify { structure, checksums };

// Loads `dir`. InputError when it does not exist; FileFormatError naming the
// folder, file and fault for a bad manifest, a size or checksum mismatch
// (truncated or corrupted file), or a missing, unexpected or misshapen tensor.
Checkpoint load_checkpoint(const std::string& dir, Verify verify = Verify::checksums);

// A LoRA checkpoint (the manifest's run.lora) holds the adapters alone; its
// LoRA settings, off for a full model's. FileFormatError for a malformed field.
LoraSpec checkpoint_lora(const Manifest& man);
// The parameters a checkpoint holds: the model's (hf_param_table), or a LoRA
// checkpoint's adapters (lora_param_table).
std::vector<ParamInfo> checkpoint_param_table(const Manifest& man);

// Each architecture field that differs between the checkpoint's model and
// `model`, as "layers: checkpoint 8, this run 4"; empty when compatible (the
// name and max_seq may differ).
std::vector<std::string> model_differences(const ModelSpec& checkpoint, const ModelSpec& model);

// InputError naming `origin` and every differing field when the checkpoint is
// of a different model.
void check_compatible(const Manifest& manifest, const ModelSpec& model,
                      const std::string& origin = "checkpoint");

// "step_000100": the folder name of a step's checkpoint under a root.
std::string checkpoint_dir_name(int64_t step);

// Records `dir_name` (a step_N folder under `root`) as the newest checkpoint
// of the run: "<root>/latest", written atomically after the folder is in
// place, so --resume continues from the checkpoint written last even where a
// higher step number is lying around.
void mark_latest(const std::string& root, const std::string& dir_name);

// The newest complete checkpoint under `root` (a folder of step_N folders):
// the one "<root>/latest" names when it is complete; else the highest N
// whose manifest parses and whose files exist with their
// recorded sizes (checksums are left to load_checkpoint). Temporary folders
// are ignored; a "step_N.old-<pid>" folder left by a save that died between
// moving the old folder aside and putting the new one in place counts as
// step_N when step_N itself is missing. nullopt when there is none.
std::optional<std::string> latest_checkpoint(const std::string& root);

// The checkpoint `--resume` continues from: the newest under `root` (the one
// "latest" names, else the highest step with a manifest; a step_N.old-<pid>
// when a save died with step_N moved aside). InputError when that one is damaged (missing, a manifest
// that does not parse, a file not at its recorded size), naming it, the
// fault and the newest intact one to give --resume-from: a run never falls
// back to an older checkpoint by itself, which would train steps again.
// nullopt when `root` holds no checkpoint.
std::optional<std::string> resume_checkpoint(const std::string& root);

// The refusal of a --resume whose newest checkpoint `newest` under `root` is
// damaged (`fault`: sizes, or checksums found when it is loaded), naming the
// newest checkpoint that is intact to its checksums to give --resume-from,
// or saying none is left.
InputError resume_damaged(const std::string& root, const std::string& newest, const std::string& fault);

}  // namespace weft::checkpoint
