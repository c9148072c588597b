// MoeSpec: the Mixture-of-Experts FFN of a model, and the attention variants
// the MoE families bring (Qwen3's per-head QK RMSNorm, Llama 4's NoPE layers,
// chunked attention, QK L2 norm and attention temperature). Part of
// ModelSpec (core/model_spec.h); a dense Llama leaves all of it at its
// defaults.
//
// An MoE layer replaces the SwiGLU FFN by
//   router:  logits = x W_r^T (E outputs, no bias), scored by softmax over
//            the E (Mixtral, Qwen3) or by sigmoid (Llama 4); each token takes
//            the k highest-scoring experts (ties: the lower index);
//   weights: the chosen scores as they are, or divided by their sum over
//            the k (Mixtral; Qwen3 when norm_topk_prob), times route_scale;
//   experts: E SwiGLU FFNs of width expert_intermediate; the weight
//            multiplies each chosen expert's output (Mixtral, Qwen3) or its
//            input (Llama 4);
//   shared:  an always-on SwiGLU FFN of width shared_intermediate added to
//            the sum (Llama 4; 0: none).
// Layer i (from 0) is an MoE layer when (i + 1) % step == 0 and i is not in
// dense_layers (Llama 4's interleave_moe_layer_step, Qwen3's
// decoder_sparse_step and mlp_only_layers); the others keep the dense FFN of
// width ModelSpec::intermediate.
//
// The load-balancing loss, coefficient times (E = experts, k = top_k,
// c_e = tokens routed to e, P_e = e's mean score, T tokens):
//   global    transformers' load_balancing_loss_func: the routers of every
//             MoE layer pooled (T x MoE layers rows), E * sum_e c_e/T * P_e;
//             c_e counts each of the k choices, so one layer's value is k
//             times Megatron's.
//   per_layer Megatron's aux_loss: E * sum_e c_e/(T k) * P_e for each MoE
//             layer, summed over the layers.
// Both over the tokens of one micro-batch (all of its sequence, also when cp
// splits it), and both count the router's choices before a capacity drops
// any (Megatron's tokens_per_expert).
//
// The capacity: without one (capacity_factor 0) every choice is computed
// (dropless). With a factor f each expert keeps at most
// ceil(f * rows * k / E) of the rows a rank routes in one micro-batch
// (Megatron's moe_expert_capacity_factor over the rank's own tokens), the
// later tokens' choices past it dropped (its "position" drop policy): a
// dropped choice adds nothing to its token's output, and the others keep
// their weights. f >= E / k never drops; f = 1 keeps the balanced share.
// Like the balancing loss's settings it is a training setting, not the
// model's: which choices drop depends on the rows each rank routes (tp under
// sp and cp split them), so layouts that split the tokens differently drop
// differently, as in Megatron.
//
// Free of fmt and the JSON library: the moe kernels (nvcc too) include it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace weft {

enum class RouterScore { softmax, sigmoid };
// The combine weights: the scores of the chosen experts as they are, or
// divided by their sum over the k.
enum class RouterWeights { scores, renormalized };
// Where the weight multiplies: the expert's output (Mixtral, Qwen3) or its
// input (Llama 4's moe_apply_probs_on_input).
enum class GateOn { output, input };
enum class AuxLossScope { global, per_layer };

// The bounds validate() puts on the MoE fields (DeepSeek-V3 has 256 experts,
// Kimi K2 384; top-k 8).
inline constexpr int64_t kMaxExperts = int64_t{1} << 14;
inline constexpr double kMaxAuxLossCoef = 1e3;
inline constexpr double kMaxRouteScale = 1e3;
inline constexpr double kMaxCapacityFactor = 1e3;
inline constexpr double kMaxImbalance = 1e6;

// A dispatch the tuning measured (MoeSpec::measured): in trials whose ranks
// each routed `rows` token rows, the most choices of one micro-batch that
// one ep rank's experts (a block of E / ep in a row) took, over the balanced
// rows x k / ep, times the tuning's margin.
struct MeasuredDispatch {
  int64_t rows = 0;
  int64_t ep = 0;
  double factor = 0;
  bool operator==(const MeasuredDispatch&) const = default;
};

struct MoeSpec {
  int64_t experts = 0;                // E routed experts; 0: a dense model
  int64_t top_k = 0;                  // k, 1 <= k <= E
  int64_t expert_intermediate = 0;    // each routed expert's SwiGLU width
  int64_t shared_intermediate = 0;    // the shared expert's SwiGLU width; 0: none
  RouterScore score = RouterScore::softmax;
  RouterWeights weights = RouterWeights::renormalized;
  double route_scale = 1.0;
  GateOn gate_on = GateOn::output;
  int64_t step = 1;                   // MoE layers: (i + 1) % step == 0 ...
  std::vector<int64_t> dense_layers;  // ... but these, ascending
  double aux_loss_coef = 0;           // 0: no balancing loss
  AuxLossScope aux_scope = AuxLossScope::global;
  double capacity_factor = 0;         // 0: dropless
  // Expert parallelism's receive buffers: `imbalance` times the rows a rank
  // receives under balanced routing (rows x k), at most the worst case
  // (received_rows); 0: the worst case. A training setting like the
  // capacity; a batch routed past it stops the run with a clear error.
  double imbalance = 0;
  // Where `imbalance` is 0, the receive buffers the tuning sized from its
  // trials' dispatches (the tuner's TuneOptions::size_buffers): a rank
  // routing `rows` under ep takes the factor measured at that ep from the
  // trials that routed the most rows up to `rows` (the largest factor among
  // them), the worst case where none did. Held while tuning only: it is not
  // written with the model, and the run the tuning hands on holds its
  // layout's factor in `imbalance`.
  std::vector<MeasuredDispatch> measured;

  bool enabled() const { return experts > 0; }
  // The imbalance factor the receive buffers of a rank routing `rows` under
  // ep hold (0: the worst case).
  double imbalance_for(int64_t rows, int64_t ep) const {
    if (imbalance > 0 || ep <= 1) return ep <= 1 ? 0.0 : imbalance;
    int64_t nearest = 0;
    double f = 0;
    for (const MeasuredDispatch& d : measured) {
      if (d.ep != ep || d.rows > rows || d.rows < nearest) continue;
      if (d.rows > nearest) f = 0;
      nearest = d.rows;
      f = std::max(f, d.factor);
    }
    return f;
  }
  // Rows each expert keeps at most of `rows` routed tokens; 0: all (dropless).
  int64_t capacity(int64_t rows) const {
    if (capacity_factor <= 0 || experts <= 0) return 0;
    return int64_t(std::ceil(capacity_factor * double(rows * top_k) / double(experts)));
  }
  // Rows the routed experts compute at most for `rows` tokens: every choice,
  // or E x capacity where that is fewer.
  int64_t routed_rows(int64_t rows) const {
    const int64_t c = capacity(rows);
    return c > 0 ? std::min(rows * top_k, experts * c) : rows * top_k;
  }
  // Rows one rank's E / ep experts receive at most under expert parallelism
  // over ep ranks that route `rows` tokens each: a token sends at most
  // min(k, E / ep) of its choices to one rank, and each source at most its
  // capacity per expert; the worst case, one rank taking every choice it
  // can. routed_rows(rows) for ep 1.
  //
  // With an imbalance factor f (imbalance_for), ceil(f x rows x k) where
  // that is fewer: the balanced share times f.
  int64_t received_rows(int64_t rows, int64_t ep) const {
    const int64_t worst = received_rows_worst(rows, ep);
    const double f = imbalance_for(rows, ep);
    if (f <= 0) return worst;
    return std::min(worst, int64_t(std::ceil(f * double(rows * top_k))));
  }
  // The worst case alone, whatever the imbalance factor.
  int64_t received_rows_worst(int64_t rows, int64_t ep) const {
    if (ep <= 1) return routed_rows(rows);
    const int64_t local = experts / ep, c = capacity(rows);
    const int64_t per_source = rows * std::min(top_k, local);
    return ep * (c > 0 ? std::min(per_source, local * c) : per_source);
  }
  bool operator==(const MoeSpec&) const = default;
};

// Query-key normalisation inside attention: none (Llama), RMSNorm over each
// head's D with a learned weight before RoPE (Qwen3's q_norm and k_norm), or
// an L2 norm without weight after RoPE, on RoPE layers only (Llama 4's
// use_qk_norm: x / sqrt(mean(x^2) + eps)).
enum class QkNorm { none, rms, l2 };

// Llama 4's attention (transformers' Llama4TextAttention):
// - layer i has no RoPE (NoPE) when nope_interval > 0 and (i + 1) %
//   nope_interval == 0; its queries are scaled by
//   1 + temperature_scale * log1p(floor((pos + 1) / temperature_floor))
//   where temperature_scale > 0 (attn_temperature_tuning, attn_scale,
//   floor_scale);
// - the other (RoPE) layers attend within chunks of attention_chunk
//   positions (0: the whole sequence): a query at p sees keys from
//   floor(p / chunk) * chunk to p.
struct AttentionVariant {
  QkNorm qk_norm = QkNorm::none;
  int64_t nope_interval = 0;
  int64_t attention_chunk = 0;
  double temperature_scale = 0;
  int64_t temperature_floor = 0;

  bool plain() const { return *this == AttentionVariant{}; }
  bool operator==(const AttentionVariant&) const = default;
};

const char* router_score_name(RouterScore s);       // "softmax", "sigmoid"
const char* router_weights_name(RouterWeights w);   // "scores", "renormalized"
const char* gate_on_name(GateOn g);                 // "output", "input"
const char* aux_loss_scope_name(AuxLossScope s);    // "global", "per_layer"
const char* qk_norm_name(QkNorm q);                 // "none", "rms", "l2"

}  // namespace weft
