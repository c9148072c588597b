// moe: the routing and token movement of a Mixture-of-Experts FFN. The
// experts' own GEMMs are gemm's: after the permute each local expert's tokens
// are contiguous rows, one GEMM per expert (a grouped GEMM on the GPU).
//
// One MoE layer over rows = B * T tokens, E experts, k of them per token:
// 1. route: the router's logits (rows, E) (x W_r^T, a gemm) are scored over
//    the experts, softmax (Mixtral, Qwen3) or sigmoid (Llama 4); each token
//    takes the k highest-scoring experts, highest first (ties: the lower
//    index), with combine weights scale * s_e, divided by their sum over the
//    k when renormalised. Softmax then top-k then renormalised is Mixtral's
//    "top-k of the logits, softmax over the k". The scores (rows, E) are
//    kept for the backward; each expert's token count and score sum are
//    what the load-balancing loss is made of.
// 2. permute: each token's row copied once per choice into expert order
//    (expert 0's tokens first, each expert's in token order), scaled by its
//    weight where the gate applies to the expert's input (Llama 4). A
//    capacity drops an expert's tokens past it, the later tokens first.
//    Where the gate applies to the output it may also lay the weights out
//    in row order, for an expert that scales its own activation by them
//    (swiglu.h's row scale: Megatron-Core's order, which keeps none of the
//    experts' outputs); the combine is then the plain sum, and the
//    permute's backward takes the weights' gradients back from the rows.
// 3. the experts, by the caller.
// 4. unpermute: out[t] = sum over t's choices of w_j * y[pos(t, j)], or the
//    plain sum where the gate applied to the input; a dropped choice adds
//    nothing.
// The backwards run the same way back; every weight's gradient is a dot
// product of the rows it scaled.
//
// Every sum over tokens (counts, score sums) and over a row's choices runs in
// a fixed order, so results do not depend on the thread count.
//
// Backends: the CPU (float, double), the reference, and CUDA (bf16 tokens,
// fp32 scores and weights, every output in device memory; moe.cu says how).
// A build without CUDA refuses bf16 (kernels/cuda_unavailable.cpp).
#pragma once

#include <cstdint>

#include "core/moe_spec.h"
#include "kernels/kernel.h"

namespace weft::kernels {

// The router's scoring, its combine weights and where they multiply are
// the model's (core/moe_spec.h).
using weft::GateOn;
using weft::RouterScore;
using weft::AuxLossScope;
using weft::RouterWeights;

struct RouterConfig {
  int64_t experts = 0;  // E
  int64_t top_k = 0;    // k, 1 <= k <= E
  RouterScore score = RouterScore::softmax;
  RouterWeights weights = RouterWeights::scores;
  double scale = 1.0;  // every weight multiplied by it (route_scale)
};

template <typename Elem>
struct MoeRouteParams {
  int64_t rows = 0;
  RouterConfig router;
  const Elem* logits = nullptr;       // (rows, E)
  Acc<Elem>* scores = nullptr;        // (rows, E) overwritten: softmax over E, or sigmoid
  int32_t* experts = nullptr;         // (rows, k) overwritten, highest score first
  Acc<Elem>* weights = nullptr;       // (rows, k) overwritten
  int64_t* counts = nullptr;          // (E) added to: tokens routed to each expert
  double* score_sums = nullptr;       // (E) added to: each expert's scores summed over the rows; may be null
};

// dlogits from the combine weights' gradient and, for the balancing loss, a
// gradient of each expert's score that is the same for every token (the
// loss is linear in each expert's mean score).
template <typename Elem>
struct MoeRouteBackwardParams {
  int64_t rows = 0;
  RouterConfig router;
  const Acc<Elem>* scores = nullptr;            // (rows, E) from the forward
  const int32_t* experts = nullptr;             // (rows, k)
  const Acc<Elem>* dweights = nullptr;          // (rows, k)
  const double* dscore_per_expert = nullptr;    // (E), or null: no balancing loss
  Elem* dlogits = nullptr;                      // (rows, E) overwritten
};

template <typename Elem>
struct MoePermuteParams {
  int64_t rows = 0;
  int64_t C = 0;
  int64_t experts = 0;                // E
  int64_t top_k = 0;                  // k
  int64_t capacity = 0;               // tokens an expert keeps at most (0: all, dropless)
  GateOn gate = GateOn::output;
  const int32_t* expert_of = nullptr;  // (rows, k) from route
  const Acc<Elem>* weights = nullptr;  // (rows, k); read only with GateOn::input
  const Elem* x = nullptr;             // (rows, C)
  Elem* out = nullptr;                 // (rows * k, C): the first offsets[E] rows written
  int64_t* offsets = nullptr;          // (E + 1) overwritten: expert e's rows [offsets[e], offsets[e + 1])
  int64_t* position = nullptr;         // (rows, k) overwritten: the out row of each choice, -1 when dropped
  int64_t* dropped = nullptr;          // (1) added to: choices dropped by the capacity; may be null
  // (rows * k) the first offsets[E] written: each out row's weight, with
  // GateOn::output only; may be null.
  Acc<Elem>* row_weights = nullptr;
};

// dx from the permuted rows' gradient: dx[t] = sum over t's kept choices of
// dout[pos] (times w_j with GateOn::input, which also gives dweights[t, j] =
// x[t] . dout[pos], 0 for a dropped choice). With GateOn::output and
// row_dweights (the rows' weight gradients, where the experts applied the
// weights), dweights[t, j] = row_dweights[pos], 0 for a dropped choice.
template <typename Elem>
struct MoePermuteBackwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  int64_t top_k = 0;
  GateOn gate = GateOn::output;
  const int64_t* position = nullptr;   // (rows, k)
  const Acc<Elem>* weights = nullptr;  // (rows, k); GateOn::input only
  const Elem* x = nullptr;             // (rows, C); GateOn::input only
  const Elem* dout = nullptr;          // (rows * k, C)
  Elem* dx = nullptr;                  // (rows, C) overwritten or, with Write::accumulate, added to
  Acc<Elem>* dweights = nullptr;       // (rows, k) overwritten; GateOn::input, or with row_dweights
  Write write = Write::overwrite;
  const Acc<Elem>* row_dweights = nullptr;  // (rows * k) in row order; GateOn::output only, may be null
};

template <typename Elem>
struct MoeUnpermuteParams {
  int64_t rows = 0;
  int64_t C = 0;
  int64_t top_k = 0;
  GateOn gate = GateOn::output;
  const int64_t* position = nullptr;   // (rows, k)
  const Acc<Elem>* weights = nullptr;  // (rows, k); GateOn::output only
  const Elem* y = nullptr;             // (rows * k, C): the experts' outputs in permuted order
  Elem* out = nullptr;                 // (rows, C) overwritten or, with Write::accumulate, added to
  Write write = Write::overwrite;
};

// dy[pos(t, j)] = w_j * dout[t] (dout[t] with GateOn::input); with
// GateOn::output also dweights[t, j] = y[pos] . dout[t] (0 when dropped).
// Rows of dy that no choice lands on are left as they are.
template <typename Elem>
struct MoeUnpermuteBackwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  int64_t top_k = 0;
  GateOn gate = GateOn::output;
  const int64_t* position = nullptr;   // (rows, k)
  const Acc<Elem>* weights = nullptr;  // (rows, k); GateOn::output only
  const Elem* y = nullptr;             // (rows * k, C); GateOn::output only
  const Elem* dout = nullptr;          // (rows, C)
  Elem* dy = nullptr;                  // (rows * k, C) overwritten where a choice lands
  Acc<Elem>* dweights = nullptr;       // (rows, k) overwritten; GateOn::output only
};

#define WEFT_MOE_PROTOCOL(Params)                                                       \
  template <typename Elem>                                                              \
  bool supports(const Params<Elem>& p, Backend backend = Backend::cpu);                 \
  template <typename Elem>                                                              \
  int64_t workspace_bytes(const Params<Elem>& p, Backend backend = Backend::cpu);       \
  template <typename Elem>                                                              \
  Status launch(const Params<Elem>& p, Workspace ws, Stream stream = {});

WEFT_MOE_PROTOCOL(MoeRouteParams)
WEFT_MOE_PROTOCOL(MoeRouteBackwardParams)
WEFT_MOE_PROTOCOL(MoePermuteParams)
WEFT_MOE_PROTOCOL(MoePermuteBackwardParams)
WEFT_MOE_PROTOCOL(MoeUnpermuteParams)
WEFT_MOE_PROTOCOL(MoeUnpermuteBackwardParams)

#undef WEFT_MOE_PROTOCOL

// The load-balancing loss of one micro-batch (core/moe_spec.h says the two
// scopes), on the host, from what route() summed over the micro-batch's
// `tokens` rows in each of its `layers` MoE layers: counts (layers, E), the
// tokens each expert took (all k choices, so a layer's counts sum to
// tokens * k), and score_sums (layers, E). Returns coef times the loss, and
// overwrites dscore (layers, E) with its derivative with respect to the
// score of expert e at any one row of layer l: the loss is linear in each
// expert's score sum, so every row has the same, which is route's backward
// dscore_per_expert. The counts take no gradient (a choice is not
// differentiable), as in transformers and Megatron.
//   global:    R = tokens * layers, c_e and S_e summed over the layers;
//              coef * E * sum_e (c_e / R) (S_e / R)
//   per_layer: coef * sum_l E * sum_e c_le / (tokens k) * S_le / tokens
// InputError for a size below 1, k past E, a negative coefficient, or
// counts and score sums that are not a route's (a layer whose counts do not
// sum to tokens * k, a negative or non-finite score sum).
double moe_balance_loss(AuxLossScope scope, double coef, int64_t layers, int64_t experts, int64_t top_k,
                        int64_t tokens, const int64_t* counts, const double* score_sums, double* dscore);

}  // namespace weft::kernels
