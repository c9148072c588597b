#include "trainer/model/params.h"

#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/hash.h"

namespace weft::trainer {

namespace {

// The order of the parameters every block starts with, in the flat buffers.
constexpr ParamKind kBlockHead[] = {ParamKind::input_layernorm, ParamKind::q_proj, ParamKind::k_proj,
                                    ParamKind::v_proj,          ParamKind::o_proj,
                                    ParamKind::post_attention_layernorm};
constexpr int64_t kHead = 6;
// The kind of each linear layer (Linear's order).
constexpr ParamKind kLinearKind[kLinears] = {ParamKind::q_proj,    ParamKind::k_proj,  ParamKind::v_proj,
                                             ParamKind::o_proj,    ParamKind::gate_proj, ParamKind::up_proj,
                                             ParamKind::down_proj};

// Where `kind` sits in a block (params.h's order), or -1 where the block has
// none.
// `expert` counts from the block's first (this ep rank's first routed expert).
int64_t block_position(ParamKind kind, bool moe, int64_t experts, bool shared, int64_t expert, bool qk) {
  for (int64_t i = 0; i < kHead; ++i)
    if (kBlockHead[i] == kind) return i;
  if (kind == ParamKind::q_norm) return qk ? kHead : -1;
  if (kind == ParamKind::k_norm) return qk ? kHead + 1 : -1;
  const int64_t ffn = kHead + (qk ? 2 : 0);  // the FFN's first
  switch (kind) {
    case ParamKind::gate_proj: return moe ? -1 : ffn;
    case ParamKind::up_proj: return moe ? -1 : ffn + 1;
    case ParamKind::down_proj: return moe ? -1 : ffn + 2;
    case ParamKind::router: return moe ? ffn : -1;
    case ParamKind::expert_gate:
    case ParamKind::expert_up:
    case ParamKind::expert_down:
      if (!moe || expert < 0 || expert >= experts) return -1;
      return ffn + 1 + 3 * expert + (int64_t(kind) - int64_t(ParamKind::expert_gate));
    case ParamKind::shared_gate:
    case ParamKind::shared_up:
    case ParamKind::shared_down:
      if (!moe || !shared) return -1;
      return ffn + 1 + 3 * experts + (int64_t(kind) - int64_t(ParamKind::shared_gate));
    default: return -1;
  }
}

}  // namespace

using checkpoint::hf_param_name;

int64_t StageParams::index(ParamKind kind, int64_t layer, int64_t expert) const {
  const auto& all = model_specs();
  const bool has_embed = !all.empty() && all[0].kind == ParamKind::embed_tokens;
  if (checkpoint::is_block_param(kind)) {
    if (layer < 0 || layer >= layers) return -1;
    const int64_t i = block_position(kind, block_moe[size_t(layer)], local_experts, shared_expert,
                                     expert < 0 ? expert : expert - first_expert, qk_norm);
    return i < 0 ? -1 : block_first[size_t(layer)] + i;
  }
  if (kind == ParamKind::embed_tokens) return has_embed ? 0 : -1;
  const int64_t tail = block_first.back();
  if (kind == ParamKind::final_norm) return tail < int64_t(all.size()) ? tail : -1;
  if (kind == ParamKind::lm_head) {
    if (head_is_embedding) return 0;
    return tail + 1 < int64_t(all.size()) ? tail + 1 : -1;
  }
  return -1;
}

const ParamSpec& StageParams::model(ParamKind kind, int64_t layer, int64_t expert) const {
  const int64_t i = index(kind, layer, expert);
  WEFT_ASSERT(i >= 0);
  return model_specs()[size_t(i)];
}

StageParams stage_params(const ModelSpec& m, const Layout& l, const memory::StagePlan& plan,
                         int64_t tp_rank, int64_t ep_rank) {
  const int64_t t = l.tp, C = m.hidden, D = m.head_dim;
  StageParams sp;
  sp.layers = plan.layers;
  sp.lora = plan.lora;
  const bool lora = plan.lora.enabled();
  // A parameter of the full shape (rows, cols), this tp rank's block of it,
  // at the end of a flat buffer of `elements`.
  const auto spec = [&](std::string name, ParamKind kind, int64_t rows, int64_t cols, ShardDim shard,
                        int64_t expert, int64_t elements) {
    ParamSpec p;
    p.name = std::move(name);
    p.kind = kind;
    p.expert = expert;
    p.rows = rows;
    p.cols = cols;
    p.shard = shard;
    p.local_rows = shard == ShardDim::rows ? rows / t : rows;
    p.local_cols = shard == ShardDim::cols ? cols / t : cols;
    p.row_begin = shard == ShardDim::rows ? tp_rank * p.local_rows : 0;
    p.col_begin = shard == ShardDim::cols ? tp_rank * p.local_cols : 0;
    p.offset = elements;
    return p;
  };
  // Under LoRA the model's parameters go to the frozen list and buffer.
  auto add = [&](ParamKind kind, int64_t layer, int64_t rows, int64_t cols, ShardDim shard, int64_t expert = -1) {
    auto& list = lora ? sp.frozen : sp.specs;
    int64_t& elements = lora ? sp.frozen_elements : sp.elements;
    ParamSpec p = spec(hf_param_name(m, kind, layer, expert), kind, rows, cols, shard, expert, elements);
    p.frozen = lora;
    const bool norm = kind == ParamKind::input_layernorm || kind == ParamKind::post_attention_layernorm ||
                      kind == ParamKind::final_norm || kind == ParamKind::q_norm || kind == ParamKind::k_norm;
    p.decay = !norm;
    p.init = norm ? ParamInit::ones : ParamInit::normal;
    elements += p.local_elements();
    list.push_back(p);
  };
  // The vocabulary's tables hold Vp rows, tp's padding of V past the model's.
  const int64_t Vp = m.padded_vocab(t);
  auto padded = [&] { (lora ? sp.frozen : sp.specs).back().real_rows = Vp > m.vocab ? m.vocab : 0; };
  if (plan.has_embedding) {
    add(ParamKind::embed_tokens, 0, Vp, C, ShardDim::rows);
    padded();
  }
  // The stage's blocks in order: chunk 0's, then chunk 1's, ...; chunk c is
  // virtual stage c * pp + stage.
  std::vector<int64_t> global_of;
  for (int64_t c = 0; c < l.vpp; ++c)
    for (int64_t i = 0, n = l.chunk_layers(m, plan.stage, c); i < n; ++i)
      global_of.push_back(memory::global_layer(m, l, plan.stage, c, i));
  WEFT_ASSERT(int64_t(global_of.size()) == plan.layers);
  auto global = [&](int64_t i) { return global_of[size_t(i)]; };
  sp.experts = m.moe.experts;
  sp.local_experts = m.moe.enabled() ? m.moe.experts / l.ep : 0;
  sp.first_expert = ep_rank * sp.local_experts;
  WEFT_ASSERT(ep_rank >= 0 && ep_rank < l.ep);
  sp.shared_expert = m.moe.shared_intermediate > 0;
  sp.qk_norm = m.attention.qk_norm == QkNorm::rms;
  // The routed experts and the router are whole on every tp rank (an
  // expert tp degree of 1, Megatron's default); the shared expert splits
  // over tp as a dense FFN does. Under expert parallelism the block holds
  // the ep rank's E / ep routed experts, [first_expert, + local_experts).
  const int64_t Fe = m.moe.expert_intermediate, Fs = m.moe.shared_intermediate;
  for (int64_t i = 0; i < plan.layers; ++i) {
    const int64_t layer = global(i);
    const bool moe = m.moe_layer(layer);
    sp.block_first.push_back(int64_t((lora ? sp.frozen : sp.specs).size()));
    sp.block_moe.push_back(moe ? 1 : 0);
    add(ParamKind::input_layernorm, layer, C, 1, ShardDim::none);
    add(ParamKind::q_proj, layer, m.heads * D, C, ShardDim::rows);
    add(ParamKind::k_proj, layer, m.kv_heads * D, C, ShardDim::rows);
    add(ParamKind::v_proj, layer, m.kv_heads * D, C, ShardDim::rows);
    add(ParamKind::o_proj, layer, C, m.heads * D, ShardDim::cols);
    add(ParamKind::post_attention_layernorm, layer, C, 1, ShardDim::none);
    if (sp.qk_norm) {
      add(ParamKind::q_norm, layer, D, 1, ShardDim::none);
      add(ParamKind::k_norm, layer, D, 1, ShardDim::none);
    }
    if (!moe) {
      add(ParamKind::gate_proj, layer, m.intermediate, C, ShardDim::rows);
      add(ParamKind::up_proj, layer, m.intermediate, C, ShardDim::rows);
      add(ParamKind::down_proj, layer, C, m.intermediate, ShardDim::cols);
      continue;
    }
    add(ParamKind::router, layer, m.moe.experts, C, ShardDim::none);
    for (int64_t e = sp.first_expert; e < sp.first_expert + sp.local_experts; ++e) {
      // (etp = tp: split as a dense FFN's, gate and up by rows, down by columns)
      const bool split = l.etp > 1;
      add(ParamKind::expert_gate, layer, Fe, C, split ? ShardDim::rows : ShardDim::none, e);
      add(ParamKind::expert_up, layer, Fe, C, split ? ShardDim::rows : ShardDim::none, e);
      add(ParamKind::expert_down, layer, C, Fe, split ? ShardDim::cols : ShardDim::none, e);
    }
    if (Fs > 0) {
      add(ParamKind::shared_gate, layer, Fs, C, ShardDim::rows);
      add(ParamKind::shared_up, layer, Fs, C, ShardDim::rows);
      add(ParamKind::shared_down, layer, C, Fs, ShardDim::cols);
    }
  }
  sp.block_first.push_back(int64_t((lora ? sp.frozen : sp.specs).size()));
  if (plan.has_head) {
    add(ParamKind::final_norm, 0, C, 1, ShardDim::none);
    if (m.tied_embeddings && plan.has_embedding) {
      sp.head_is_embedding = true;
    } else {
      add(ParamKind::lm_head, 0, Vp, C, ShardDim::rows);
      padded();
      // A tied head on another stage is a copy of the embedding table: it is
      // initialised from the embedding's name so both copies start equal.
      if (m.tied_embeddings) {
        auto& list = lora ? sp.frozen : sp.specs;
        list.back().name = hf_param_name(ParamKind::embed_tokens, 0);
        list.back().tied_copy = true;
      }
    }
  }
  // The adapters: each shards with its base layer, as Megatron's and the
  // public LoRA implementations do: a column-parallel layer's B splits its
  // outputs and A (r, C) is whole on every tp rank; a row-parallel layer's A
  // splits its inputs and B (C, r) is whole. The whole ones' gradients are
  // partial sums over tp (each rank saw its part of the outputs or inputs)
  // and are summed like sequence-parallel norms' (reduce_replicated_grads).
  // An MoE block's routed experts' adapters are whole, as the experts are
  // (etp1), each ep rank holding its experts'; its shared expert's shard as
  // a dense FFN's.
  const int64_t r = plan.lora.rank;
  const auto add_adapter = [&](std::string name, ParamKind kind, bool b, int64_t rows, int64_t cols,
                               ShardDim shard, int64_t expert) {
    ParamSpec p = spec(std::move(name), kind, rows, cols, shard, expert, sp.elements);
    p.init = b ? ParamInit::zeros : ParamInit::lora_a;
    sp.elements += p.local_elements();
    sp.specs.push_back(p);
  };
  sp.expert_gate_up = lora && m.moe.enabled() && plan.lora.targets_linear(Linear::gate);
  sp.expert_down = lora && m.moe.enabled() && plan.lora.targets_linear(Linear::down);
  sp.expert_adapters = 2 * (int64_t(sp.expert_gate_up) + int64_t(sp.expert_down));
  for (int64_t i = 0; lora && i < plan.layers; ++i) {
    const bool moe = sp.block_moe[size_t(i)] != 0;
    sp.adapter_first.push_back(int64_t(sp.specs.size()));
    auto& at = sp.adapter_at.emplace_back();
    at.fill(-1);
    sp.expert_adapter_first.push_back(-1);
    const auto linear = [&](Linear lin) {
      if (!plan.lora.targets_linear(lin)) return;
      const bool col = column_parallel(lin);
      // The layer's full (out, in); an MoE block's FFN linears are its shared expert's.
      const bool ffn = int(lin) >= int(Linear::gate);
      const int64_t width = ffn && moe ? m.moe.shared_intermediate : m.intermediate;
      const memory::LinearShape s = memory::linear_shape(m, l, lin);
      const int64_t full_k = ffn ? (lin == Linear::down ? width : C) : (col ? s.K : s.K * t);
      const int64_t full_n = ffn ? (lin == Linear::down ? C : width) : (col ? s.N * t : s.N);
      constexpr ParamKind kShared[3] = {ParamKind::shared_gate, ParamKind::shared_up, ParamKind::shared_down};
      const ParamKind kind = ffn && moe ? kShared[int(lin) - int(Linear::gate)] : kLinearKind[int(lin)];
      at[size_t(lin)] = int64_t(sp.specs.size());
      for (const bool b : {false, true})
        add_adapter(checkpoint::lora_param_name(m, lin, global(i), b), kind, b, b ? full_n : r, b ? r : full_k,
                    b ? (col ? ShardDim::rows : ShardDim::none) : (col ? ShardDim::none : ShardDim::cols), -1);
    };
    for (Linear lin : {Linear::q, Linear::k, Linear::v, Linear::o}) linear(lin);
    if (!moe) {
      for (Linear lin : {Linear::gate, Linear::up, Linear::down}) linear(lin);
      continue;
    }
    if (sp.expert_adapters > 0) sp.expert_adapter_first.back() = int64_t(sp.specs.size());
    for (int64_t e = sp.first_expert; e < sp.first_expert + sp.local_experts; ++e)
      for (const auto site : {checkpoint::ExpertLora::gate_up, checkpoint::ExpertLora::down}) {
        const bool gate_up = site == checkpoint::ExpertLora::gate_up;
        if (!(gate_up ? sp.expert_gate_up : sp.expert_down)) continue;
        for (const bool b : {false, true}) {
          const auto shape = checkpoint::lora_expert_shape(m, site, checkpoint::lora_site_rank(plan.lora, site), b);
          add_adapter(checkpoint::lora_expert_name(m, site, global(i), e, b),
                      gate_up ? ParamKind::expert_gate : ParamKind::expert_down, b, shape[0], shape[1],
                      ShardDim::none, e);
        }
      }
    if (sp.shared_expert)
      for (Linear lin : {Linear::gate, Linear::up, Linear::down}) linear(lin);
  }
  if (lora) sp.adapter_first.push_back(int64_t(sp.specs.size()));
  WEFT_ASSERT(sp.elements == memory::stage_param_elements(m, l, plan));
  WEFT_ASSERT(sp.frozen_elements == memory::stage_frozen_elements(m, l, plan));
  return sp;
}

ParamInitDraw::ParamInitDraw(const ParamSpec& p, uint64_t seed) : p_(&p), base_(splitmix64(seed ^ fnv1a64(p.name))) {}

double ParamInitDraw::operator()(int64_t r, int64_t c) const {
  const ParamSpec& p = *p_;
  if (p.init == ParamInit::ones) return 1.0;
  if (p.init == ParamInit::zeros || (p.real_rows > 0 && r >= p.real_rows)) return 0.0;
  // A counter-based draw: Box-Muller on two uniforms hashed from (seed, name,
  // element index), so no rank needs the full tensor or a shared stream.
  const uint64_t key = base_ + uint64_t(r * p.cols + c) * 2;
  const double u1 = (double(splitmix64(key) >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = double(splitmix64(key + 1) >> 11) * 0x1.0p-53;
  if (p.init == ParamInit::lora_a) return (2.0 * u1 - 1.0) / std::sqrt(double(p.cols));
  // Hugging Face's initializer_range for Llama.
  return 0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace weft::trainer
