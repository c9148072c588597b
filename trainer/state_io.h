// Between a model stage and checkpoint folders: gathers what a rank holds
// into the full Hugging Face tensors a checkpoint stores, and slices them back
// into the rank's shards on load, so a checkpoint loads under any layout; and
// slices pretrained weights (a Hugging Face folder or a checkpoint) into a
// new run's stage the same way.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/peft.h"
#include "trainer/checkpoint/pretrained.h"
#include "trainer/optim/optimizer.h"

namespace weft::trainer {

struct SaveInfo {
  int64_t step = 0;
  int64_t data_position = 0;
  uint64_t seed = 0;
  double lr = 0;
  nlohmann::json run = nlohmann::json::object();
  int64_t bos_token_id = -1;  // -1: unknown
  int64_t eos_token_id = -1;
};

// Writes weights and Adam state as a checkpoint folder at `dir`, in fp32: a
// bf16 run stores its fp32 master weights, so it resumes exactly. Gradients
// are not saved (every step starts from zero), so the gradient type G plays
// no part.
template <typename Elem, typename G>
void state_save(const std::string& dir, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& optim,
                const SaveInfo& info);

// A save in two halves, so that the files can be written while training
// goes on (trainer/async_save.h): state_gather collects every rank's state
// into host memory on world rank 0 (a collective: every rank calls it, at a
// step boundary) and returns what it writes there; the others get null.
// state_write writes it (no communication; any thread). state_save is the
// two in a row, then a barrier.
struct SaveJob {
  std::string dir;
  std::vector<std::vector<float>> stages;  // per pipeline stage: weights, m, v (and FP8 history)
  std::vector<float> history;              // delayed FP8 scaling's history, in global layer order
  std::vector<checkpoint::TensorRef> model, state;  // views into the above
  checkpoint::Manifest manifest;
};
// `reuse`: a written job whose storage rank 0 fills again (same sizes: no
// allocation, no fresh pages), or null.
template <typename Elem, typename G>
std::unique_ptr<SaveJob> state_gather(const std::string& dir, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& optim,
                                      const SaveInfo& info, std::unique_ptr<SaveJob> reuse = nullptr);
void state_write(SaveJob& job);

// Copies this rank's slices of the checkpoint's weights (and, with an
// optimizer, its Adam state and update count) into the stage; a bf16 stage
// gets their rounding and, with an optimizer, the fp32 values as its master.
// Throws InputError when the checkpoint is of another model.
template <typename Elem, typename G>
void state_load(const checkpoint::Checkpoint& ck, LlamaStage<Elem, G>& stage,
                std::type_identity_t<Optimizer<Elem, G>>* optim);

// Pretrained weights as the start of a new run: this rank's slices of them,
// widened to fp32 from their stored dtype and rounded once to Elem (a bf16
// stage keeps the fp32 values as its master). The optimizer keeps the state
// it was built with: zero moments and no updates, so the run starts at step 0.
//
// Where the run's vocabulary is larger than the pretrained one (--vocab pads
// it, e.g. to a multiple of tp), every extra row of the embedding and of an
// untied head starts as the mean of the pretrained rows. A padded id's logit
// is then the mean of the real ids' logits, so by Jensen (exp(mean) <= mean
// exp) the padding adds at most log(1 + pad / V) nats to the starting loss,
// whatever the hidden state; zero rows would give logit 0, which may exceed
// every real logit. Rows of ids the data never uses get no gradient through
// the embedding and learn to fall in the head; ids it does use (tokens added
// to the tokenizer) start from the average token. This is the mean
// initialisation of transformers' resize_token_embeddings without its random
// part, so that every layout starts from the same model.
//
// Throws InputError when the pretrained model differs from the stage's
// (pretrained_check).
// Under LoRA (the stage's params().lora) only the frozen base model is
// loaded; the adapters keep the start init_weights gave them.
template <typename Elem, typename G>
void state_init(const checkpoint::Pretrained& src, LlamaStage<Elem, G>& stage,
                Optimizer<Elem, G>& optim);

// LoRA adapters from a PEFT folder (--lora-init) in place of the stage's
// start: this rank's slices of them. InputError when its rank, alpha or
// targets are not the stage's (dropout, a training setting, may differ).
template <typename Elem, typename G>
void state_lora_init(const checkpoint::PeftAdapter& src, LlamaStage<Elem, G>& stage, Optimizer<Elem, G>& optim);

// LoRA checkpoints hold the adapters alone and record the base model they
// adapt (the manifest's run.lora.base): pretrained weights by absolute path
// and content hash (checkpoint::pretrained_hash), or a random initialisation
// by its seed. `src` null: random.
nlohmann::json lora_base_record(const checkpoint::Pretrained* src, uint64_t seed);
// The recorded base, opened and its hash checked (InputError when the
// folder's hash is no longer the recorded one; `where` names the
// checkpoint); nullopt for a random base.
std::optional<checkpoint::Pretrained> lora_base_open(const nlohmann::json& base, const std::string& where);
// The recorded base into the stage's frozen weights; InputError when the
// folder's hash is no longer the recorded one (`where` names the checkpoint).
// state_load calls it for a LoRA stage.
template <typename Elem, typename G>
void lora_base_load(const nlohmann::json& base, LlamaStage<Elem, G>& stage, const std::string& where);

}  // namespace weft::trainer
