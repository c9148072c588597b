// Evaluating a checkpoint: its mean loss and perplexity on validation
// samples of one dataset or of each of several, and optionally the logits of
// the first sample for comparison with another implementation
// (tools/verify_export.py checks the Hugging Face export).
//
// Each dataset is read as a whole (its val split when it has one, else its
// train split) with the fixed validation order (loader.h), `samples`
// sequences each. The overall loss is the mean over every evaluated token;
// for a blend (`--data 0.7 A 0.3 B`) it is the mean of the parts' losses
// weighted by the blend's weights: the loss expected on the samples the
// blend draws. A dataset holding fewer windows than `samples` is evaluated
// on each of its windows once, and the output says so.
//
// `checkpoint` may also be a folder of checkpoints (a run's checkpoints/ or
// the run folder): the newest is evaluated, and the output names it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace weft::trainer {

struct EvalConfig {
  std::string checkpoint;  // checkpoint folder, or a folder of them (the newest is used)
  std::vector<std::string> data;  // --data's items (data_spec.h); empty: the default corpus
  int64_t samples = 64;    // validation sequences per dataset, at most its windows
  int64_t seq = 0;         // 0: the sequence length the checkpoint was trained with
  std::string dump_dir;    // if set: tokens.npy (T) int32 and logits.npy (T, V) fp32 of the first
                           // dataset's sample 0
  int64_t threads = 0;
};

struct EvalLoss {
  std::string data;  // the dataset's path
  double weight = 1;  // its blend weight (1 outside a blend)
  double loss = 0;    // nats/token
  int64_t tokens = 0;
  double perplexity() const;
};

struct EvalResult {
  std::vector<EvalLoss> parts;  // one per dataset
  double loss = 0;              // overall, nats/token
  int64_t tokens = 0;
  double perplexity() const;
};

EvalResult evaluate(const EvalConfig& config, std::FILE* log);

// Writes a C-order .npy array of float32 or int32.
void npy_write(const std::string& path, const void* data, const char* descr,
               const std::vector<int64_t>& shape);

}  // namespace weft::trainer
