// The manifest.json of a checkpoint folder: everything besides the tensors
// that a resumed run needs (step, data position, RNG, optimizer settings), the
// model and layout it was saved under, and the size and checksum of each
// tensor file so that a damaged checkpoint is refused before it is used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/layout.h"
#include "core/model_spec.h"

namespace weft::checkpoint {

// Version of the checkpoint folder format this weft writes and the newest it
// reads. Bump when a field changes meaning or a reader would misread a folder.
constexpr int64_t kCheckpointFormatVersion = 1;

struct OptimizerManifest {
  std::string kind = "adamw";
  double lr = 0.0;  // learning rate of the last applied update
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 0.0;  // max global gradient norm; 0 for none
  int64_t step = 0;        // updates applied (Adam's bias correction uses it)
};

struct FileRecord {
  std::string name;  // relative to the checkpoint folder
  int64_t bytes = 0;
  std::string checksum;  // "crc32c:" + 8 hex digits over the whole file
};

struct Manifest {
  int64_t format_version = kCheckpointFormatVersion;
  std::string weft_version;         // filled in by save_checkpoint
  int64_t step = 0;                 // training steps completed
  int64_t data_position = 0;        // global index of the next sample to consume
  std::vector<uint64_t> rng_state;  // the caller's RNG state, opaque here
  OptimizerManifest optimizer;
  Layout layout;  // layout at save time; tensors are stored unsharded
  ModelSpec model;
  nlohmann::json run = nlohmann::json::object();  // run fields the caller keeps (seq, batch,
                                                  // schedule, seed, ...), free-form
  int64_t bos_token_id = -1;                      // -1 when unknown
  int64_t eos_token_id = -1;
  std::vector<FileRecord> files;  // filled in by save_checkpoint

  // nullptr when the manifest lists no such file.
  const FileRecord* file(const std::string& name) const;
};

nlohmann::json manifest_to_json(const Manifest& m);
// FileFormatError naming `origin` and the missing or malformed field, or a
// format version newer than this weft reads.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& origin);

}  // namespace weft::checkpoint
