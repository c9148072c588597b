// The parameters one rank holds: Hugging Face names, full and local shapes,
// how tensor parallelism shards them, and their offsets in the stage's flat
// weight/gradient buffers (the order of memory::stage_param_elements).
// Initialisation is layout-independent: element (r, c) of a full tensor is a
// pure function of (seed, name, r, c), so every rank draws its own shard
// directly and any layout of a run starts from the same model.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/layout.h"
#include "core/model_spec.h"
#include "memory/shapes.h"
#include "trainer/checkpoint/hf_names.h"

namespace weft::trainer {

enum class ShardDim { none, rows, cols };  // which dim tp splits
// normal: Hugging Face's N(0, 0.02); lora_a: U(-1/sqrt(in), 1/sqrt(in)),
// the bound PEFT's default (Kaiming-uniform with a = sqrt(5)) gives A.
enum class ParamInit { normal, ones, zeros, lora_a };

struct ParamSpec {
  std::string name;    // Hugging Face name, e.g. model.layers.3.self_attn.q_proj.weight
  checkpoint::ParamKind kind = checkpoint::ParamKind::embed_tokens;  // a LoRA adapter: its base layer's
  int64_t expert = -1;  // the routed expert of the expert kinds
  int64_t rows = 0;    // full shape (out, in); norms are (C, 1)
  int64_t cols = 0;
  ShardDim shard = ShardDim::none;
  int64_t local_rows = 0;
  int64_t local_cols = 0;
  // The embedding and head of a padded vocabulary (ModelSpec::padded_vocab):
  // rows at or past real_rows (V) are padding, zero from the start, never
  // looked up and masked out of the loss, so they never get a gradient. 0:
  // every row is the model's.
  int64_t real_rows = 0;
  int64_t row_begin = 0;  // this rank's block in the full tensor
  int64_t col_begin = 0;
  int64_t offset = 0;     // in the flat buffers, elements
  bool decay = true;      // AdamW weight decay: 2-D weights yes, norms no
  ParamInit init = ParamInit::normal;
  // The last stage's copy of a tied embedding (its gradient is synchronised
  // with the first stage's, and counted once in the gradient norm).
  bool tied_copy = false;
  // A base weight under LoRA: in the frozen buffer (offset counts there),
  // with no gradient and no optimizer state.
  bool frozen = false;
  int64_t local_elements() const { return local_rows * local_cols; }
  // The full tensor's shape as checkpoints store it: (C) for norms.
  std::vector<int64_t> shape() const {
    return cols == 1 && shard == ShardDim::none ? std::vector<int64_t>{rows}
                                                : std::vector<int64_t>{rows, cols};
  }
};

// One naming table for the model, the checkpoints and the exporter.
using checkpoint::ParamKind;

// The stage's trainable parameters, `specs`, in the flat buffers the
// gradients, the optimizer and ZeRO work on: every parameter of the model,
// or under LoRA the adapters (per block, per targeted layer in block order,
// A then B), with the base model's parameters in `frozen`.
// A block's parameters are its two norms and attention, then its FFN: the
// attention norm, q, k, v, o, the FFN norm, Qwen3's q and k norms (each
// head's, (D), whole on every tp rank), then gate, up and down, or in
// an MoE block the router, each routed expert's gate, up and down (expert
// by expert, so an expert's weights are one range), and the shared
// expert's gate, up and down.
struct StageParams {
  std::vector<ParamSpec> specs;
  int64_t elements = 0;
  std::vector<ParamSpec> frozen;
  int64_t frozen_elements = 0;
  LoraSpec lora;
  // The base model's parameters: specs, or frozen under LoRA.
  const std::vector<ParamSpec>& model_specs() const { return lora.enabled() ? frozen : specs; }
  // Index into model_specs() of each kind for local layer l (block kinds;
  // `expert` the routed expert of the expert kinds) or -1.
  int64_t index(ParamKind kind, int64_t layer = 0, int64_t expert = -1) const;
  // The model parameter of a kind (present: asserted).
  const ParamSpec& model(ParamKind kind, int64_t layer = 0, int64_t expert = -1) const;
  // Local block `layer`'s parameters: model_specs()[block_first[layer],
  // block_first[layer + 1]) (layers + 1 entries), and whether it is an MoE
  // block.
  std::vector<int64_t> block_first;
  std::vector<char> block_moe;
  int64_t experts = 0;        // E of the MoE blocks
  // The routed experts this rank holds: E / ep from its ep rank's first
  // (every one without expert parallelism). index() and model() take a
  // global expert id among them.
  int64_t local_experts = 0, first_expert = 0;
  bool shared_expert = false;  // they have a shared expert
  bool qk_norm = false;        // every block has q and k norms
  // Index into specs of the A adapter of local block `layer`'s linear g (B
  // follows it), or -1 without one. In an MoE block gate, up and down are
  // its shared expert's.
  int64_t adapter(int64_t layer, Linear g) const {
    return lora.enabled() ? adapter_at[size_t(layer)][size_t(g)] : -1;
  }
  // Under LoRA each local block's adapters are specs[adapter_first[layer],
  // adapter_first[layer + 1]) (layers + 1 entries): its attention's, then
  // its FFN's (checkpoint::lora_param_table's order).
  std::vector<int64_t> adapter_first;
  std::vector<std::array<int64_t, kLinears>> adapter_at;
  // An MoE block's routed experts' adapters (checkpoint::ExpertLora): the
  // first local expert's first spec, or -1 without them; each local expert
  // has `expert_adapters` specs in a row (gate_up's A and B, then down's).
  std::vector<int64_t> expert_adapter_first;
  int64_t expert_adapters = 0;
  bool expert_gate_up = false, expert_down = false;  // which the experts have
  int64_t layers = 0;
  // The head reads the embedding table (tied embeddings on one stage).
  bool head_is_embedding = false;
};

// `ep_rank`: the rank's place in its ep group (Layout::ep), whose experts it holds.
StageParams stage_params(const ModelSpec& m, const Layout& l, const memory::StagePlan& plan,
                         int64_t tp_rank, int64_t ep_rank = 0);

// The values of parameter `p` at initialisation: element (r, c) of its
// full tensor. The draw hashes the name once here, not once per element.
class ParamInitDraw {
 public:
  ParamInitDraw(const ParamSpec& p, uint64_t seed);
  double operator()(int64_t r, int64_t c) const;

 private:
  const ParamSpec* p_;
  uint64_t base_;  // the stream of (seed, name)
};

}  // namespace weft::trainer
