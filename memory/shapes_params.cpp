// A stage's parameter counts: which FFN each of its layer slots holds, its
// blocks' elements (dense and MoE), LoRA's adapters, and the stage's
// trainable and frozen totals (memory/shapes.h). Split from shapes.cpp,
// whose tables they feed.
#include <algorithm>

#include "memory/shapes.h"
#include "memory/shapes_detail.h"

namespace weft::memory {
SlotFfn slot_ffn(const ModelSpec& m, const Layout& l, int64_t stage, int64_t position) {
  bool dense = false, moe = false;
  for (int64_t c = 0; c < l.vpp; ++c)
    if (position < l.chunk_layers(m, stage, c)) {
      const bool here = m.moe_layer(global_layer(m, l, stage, c, position));
      moe = moe || here;
      dense = dense || !here;
    }
  return dense && moe ? SlotFfn::both : moe ? SlotFfn::moe : SlotFfn::dense;
}

LinearShape linear_shape(const ModelSpec& m, const Layout& l, Linear g) {
  const int64_t t = l.tp, C = m.hidden, D = m.head_dim;
  switch (g) {
    case Linear::q: return {C, m.heads / t * D};
    case Linear::k:
    case Linear::v: return {C, m.kv_heads / t * D};
    case Linear::o: return {m.heads / t * D, C};
    case Linear::gate:
    case Linear::up: return {C, m.intermediate / t};
    case Linear::down: return {m.intermediate / t, C};
  }
  return {};
}

int64_t lora_block_elements(const ModelSpec& m, const Layout& l, const LoraSpec& lora, bool moe) {
  if (!lora.enabled()) return 0;
  const int64_t r = lora.rank, C = m.hidden;
  int64_t n = 0;
  for (int g = 0; g < kLinears; ++g) {
    if (!lora.targets_linear(Linear(g))) continue;
    const LinearShape s = linear_shape(m, l, Linear(g));
    if (!moe || g < int(Linear::gate)) {
      n += r * (s.K + s.N);
      continue;
    }
    // The shared expert's, split over tp as a dense FFN's.
    if (m.moe.shared_intermediate > 0) n += r * (C + m.moe.shared_intermediate / l.tp);
  }
  if (moe) {
    // Each of this ep rank's routed experts: gate_up's A (r, C) and B
    // (2 F_e, r), down's A (r, F_e) and B (C, r), whole (etp1).
    const int64_t Fe = m.moe.expert_intermediate, local = m.moe.experts / std::max<int64_t>(1, l.ep);
    if (lora.targets_linear(Linear::gate)) n += local * lora.experts_gate_up_rank() * (C + 2 * Fe);
    if (lora.targets_linear(Linear::down)) n += local * r * (Fe + C);
  }
  return n;
}

int64_t lora_largest_block_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan) {
  const int64_t dense = plan.layers > plan.moe_layers ? lora_block_elements(m, l, plan.lora, false) : 0;
  return std::max(dense, plan.moe_layers > 0 ? lora_block_elements(m, l, plan.lora, true) : 0);
}

int64_t global_layer(const ModelSpec& m, const Layout& l, int64_t stage, int64_t chunk, int64_t layer) {
  return l.virtual_first_layer(m, chunk * l.pp + stage) + layer;
}

namespace detail {

int64_t block_param_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan) {
  const int64_t dense = plan.layers > plan.moe_layers ? dense_block_param_elements(m, l) : 0;
  return std::max(dense, plan.moe_layers > 0 ? moe_block_param_elements(m, l) : 0);
}

}  // namespace detail

namespace {

// A block's norms and attention on one tp rank (Qwen3's q and k norms whole).
int64_t block_attention_elements(const ModelSpec& m, const Layout& l) {
  const int64_t t = l.tp, C = m.hidden, D = m.head_dim;
  const int64_t qk_norms = m.attention.qk_norm == QkNorm::rms ? 2 * D : 0;
  return 2 * C + (2 * (m.heads / t) + 2 * (m.kv_heads / t)) * D * C + qk_norms;
}

}  // namespace

int64_t dense_block_param_elements(const ModelSpec& m, const Layout& l) {
  return block_attention_elements(m, l) + 3 * (m.intermediate / l.tp) * m.hidden;
}

int64_t moe_block_param_elements(const ModelSpec& m, const Layout& l) {
  const MoeSpec& e = m.moe;
  // The router whole; the rank's E / ep routed experts whole.
  // (Their width split over tp under an expert tp degree.)
  const int64_t local = e.experts / std::max<int64_t>(1, l.ep);
  return block_attention_elements(m, l) + e.experts * m.hidden +
         3 * local * (e.expert_intermediate / std::max<int64_t>(1, l.etp)) * m.hidden +
         3 * (e.shared_intermediate / l.tp) * m.hidden;
}

namespace {

int64_t stage_model_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan) {
  const int64_t table = (m.padded_vocab(l.tp) / l.tp) * m.hidden;
  int64_t n = (plan.layers - plan.moe_layers) * dense_block_param_elements(m, l);
  if (plan.moe_layers > 0) n += plan.moe_layers * moe_block_param_elements(m, l);
  if (plan.has_embedding) n += table;
  if (plan.has_head) {
    n += m.hidden;  // final norm
    // A tied head shares the embedding table when both sit on one stage; on
    // another stage it keeps its own copy whose gradient is all-reduced.
    if (!(m.tied_embeddings && plan.has_embedding)) n += table;
  }
  return n;
}

}  // namespace

int64_t stage_param_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan) {
  if (!plan.lora.enabled()) return stage_model_elements(m, l, plan);
  return (plan.layers - plan.moe_layers) * lora_block_elements(m, l, plan.lora, false) +
         plan.moe_layers * lora_block_elements(m, l, plan.lora, true);
}

int64_t stage_frozen_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan) {
  return plan.lora.enabled() ? stage_model_elements(m, l, plan) : 0;
}

}  // namespace weft::memory
