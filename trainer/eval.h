// Evaluating a checkpoint: its mean loss on validation samples, and
// optionally the logits of the first sample for comparison with another
// implementation (tools/verify_export.py checks the Hugging Face export).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace weft::trainer {

struct EvalConfig {
  std::string checkpoint;  // checkpoint folder
  std::string data;        // token file or folder; empty: the default corpus
  int64_t samples = 64;    // validation sequences
  int64_t seq = 0;         // 0: the sequence length the checkpoint was trained with
  std::string dump_dir;    // if set: tokens.npy (T) int32 and logits.npy (T, V) fp32 of sample 0
  int64_t threads = 0;
};

struct EvalResult {
  double loss = 0;  // nats/token
  int64_t tokens = 0;
};

EvalResult evaluate(const EvalConfig& config, std::FILE* log);

// Writes a C-order .npy array of float32 or int32.
void npy_write(const std::string& path, const void* data, const char* descr,
               const std::vector<int64_t>& shape);

}  // namespace weft::trainer
