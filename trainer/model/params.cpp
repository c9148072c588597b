#include "trainer/model/params.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "core/hash.h"

namespace weft::trainer {

namespace {

constexpr int kBlockKinds = 9;
// The order of a block's parameters in the flat buffers.
constexpr ParamKind kBlock[kBlockKinds] = {
    ParamKind::input_layernorm, ParamKind::q_proj,    ParamKind::k_proj,
    ParamKind::v_proj,          ParamKind::o_proj,    ParamKind::post_attention_layernorm,
    ParamKind::gate_proj,       ParamKind::up_proj,   ParamKind::down_proj};

}  // namespace

using checkpoint::hf_param_name;

int64_t StageParams::index(ParamKind kind, int64_t layer) const {
  const bool has_embed = !specs.empty() && specs[0].name == hf_param_name(ParamKind::embed_tokens, 0);
  const int64_t base = has_embed ? 1 : 0;
  for (int i = 0; i < kBlockKinds; ++i)
    if (kBlock[i] == kind) return base + layer * kBlockKinds + i;
  if (kind == ParamKind::embed_tokens) return has_embed ? 0 : -1;
  const int64_t tail = base + layers * kBlockKinds;
  if (kind == ParamKind::final_norm) return tail < int64_t(specs.size()) ? tail : -1;
  if (kind == ParamKind::lm_head) {
    if (head_is_embedding) return 0;
    return tail + 1 < int64_t(specs.size()) ? tail + 1 : -1;
  }
  return -1;
}

StageParams stage_params(const ModelSpec& m, const Layout& l, const memory::StagePlan& plan,
                         int64_t tp_rank) {
  const int64_t t = l.tp, C = m.hidden, D = m.head_dim;
  StageParams sp;
  sp.layers = plan.layers;
  sp.first_layer = plan.stage * plan.layers;
  auto add = [&](ParamKind kind, int64_t layer, int64_t rows, int64_t cols, ShardDim shard) {
    ParamSpec p;
    p.name = hf_param_name(kind, layer);
    p.rows = rows;
    p.cols = cols;
    p.shard = shard;
    p.local_rows = shard == ShardDim::rows ? rows / t : rows;
    p.local_cols = shard == ShardDim::cols ? cols / t : cols;
    p.row_begin = shard == ShardDim::rows ? tp_rank * p.local_rows : 0;
    p.col_begin = shard == ShardDim::cols ? tp_rank * p.local_cols : 0;
    p.offset = sp.elements;
    const bool norm = kind == ParamKind::input_layernorm || kind == ParamKind::post_attention_layernorm ||
                      kind == ParamKind::final_norm;
    p.decay = !norm;
    p.init = norm ? ParamInit::ones : ParamInit::normal;
    sp.elements += p.local_elements();
    sp.specs.push_back(p);
  };
  if (plan.has_embedding) add(ParamKind::embed_tokens, 0, m.vocab, C, ShardDim::rows);
  for (int64_t i = 0; i < plan.layers; ++i) {
    // Local block i sits in chunk i / Lc, which is virtual stage chunk * pp + stage.
    const int64_t Lc = plan.layers / l.vpp;
    const int64_t layer = ((i / Lc) * l.pp + plan.stage) * Lc + i % Lc;
    add(ParamKind::input_layernorm, layer, C, 1, ShardDim::none);
    add(ParamKind::q_proj, layer, m.heads * D, C, ShardDim::rows);
    add(ParamKind::k_proj, layer, m.kv_heads * D, C, ShardDim::rows);
    add(ParamKind::v_proj, layer, m.kv_heads * D, C, ShardDim::rows);
    add(ParamKind::o_proj, layer, C, m.heads * D, ShardDim::cols);
    add(ParamKind::post_attention_layernorm, layer, C, 1, ShardDim::none);
    add(ParamKind::gate_proj, layer, m.intermediate, C, ShardDim::rows);
    add(ParamKind::up_proj, layer, m.intermediate, C, ShardDim::rows);
    add(ParamKind::down_proj, layer, C, m.intermediate, ShardDim::cols);
  }
  if (plan.has_head) {
    add(ParamKind::final_norm, 0, C, 1, ShardDim::none);
    if (m.tied_embeddings && plan.has_embedding) {
      sp.head_is_embedding = true;
    } else {
      add(ParamKind::lm_head, 0, m.vocab, C, ShardDim::rows);
      // A tied head on another stage is a copy of the embedding table: it is
      // initialised from the embedding's name so both copies start equal.
      if (m.tied_embeddings) {
        sp.specs.back().name = hf_param_name(ParamKind::embed_tokens, 0);
        sp.specs.back().tied_copy = true;
      }
    }
  }
  WEFT_ASSERT(sp.elements == memory::stage_param_elements(m, l, plan));
  return sp;
}

double param_init_value(const ParamSpec& p, uint64_t seed, int64_t r, int64_t c) {
  if (p.init == ParamInit::ones) return 1.0;
  // A counter-based draw: Box-Muller on two uniforms hashed from (seed, name,
  // element index), so no rank needs the full tensor or a shared stream.
  const uint64_t key = splitmix64(seed ^ fnv1a64(p.name)) + uint64_t(r * p.cols + c) * 2;
  const double u1 = (double(splitmix64(key) >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = double(splitmix64(key + 1) >> 11) * 0x1.0p-53;
  // Hugging Face's initializer_range for Llama.
  return 0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace weft::trainer
