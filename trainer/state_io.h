// Between a model stage and checkpoint folders: gathers what a rank holds
// into the full Hugging Face tensors a checkpoint stores, and slices them back
// into the rank's shards on load, so a checkpoint loads under any layout.
#pragma once

#include <string>
#include <type_traits>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/optim/optimizer.h"

namespace weft::trainer {

struct SaveInfo {
  int64_t step = 0;
  int64_t data_position = 0;
  uint64_t seed = 0;
  double lr = 0;
  nlohmann::json run = nlohmann::json::object();
};

// Writes weights and Adam state as a checkpoint folder at `dir`, in fp32: a
// bf16 run stores its fp32 master weights, so it resumes exactly. Gradients
// are not saved (every step starts from zero), so the gradient type G plays
// no part.
template <typename Elem, typename G>
void state_save(const std::string& dir, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& optim,
                const SaveInfo& info);

// Copies this rank's slices of the checkpoint's weights (and, with an
// optimizer, its Adam state and update count) into the stage; a bf16 stage
// gets their rounding and, with an optimizer, the fp32 values as its master.
// Throws InputError when the checkpoint is of another model.
template <typename Elem, typename G>
void state_load(const checkpoint::Checkpoint& ck, LlamaStage<Elem, G>& stage,
                std::type_identity_t<Optimizer<Elem, G>>* optim);

}  // namespace weft::trainer
