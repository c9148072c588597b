// The stage's launch and copy helpers, shared by the files that define
// LlamaStage's members (llama.cpp, llama_parallel.cpp, llama_head.cpp). Internal to
// trainer/model.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/fp8/fp8_ops.h"
#include "kernels/gemm/gemm.h"
#include "memory/device.h"
#include "trainer/model/llama.h"
#include "trainer/model/op_run.h"

namespace weft::trainer {

// The FP8 scaling state's layout and rules, shared by llama_fp8.cpp (the
// casts and GEMMs) and llama_fp8_scaling.cpp (the per-step state).
namespace fp8_detail {
inline constexpr int kRoles = 3;  // input, weight, output gradient
inline constexpr int64_t kSlot = kFp8DelayedHistory + 2;  // history, the step's amax, the step's scale
inline constexpr int64_t kStepAmax = kFp8DelayedHistory, kScale = kFp8DelayedHistory + 1;
inline kernels::Fp8Format format_of(int role) {
  return role == 2 ? kernels::Fp8Format::e5m2 : kernels::Fp8Format::e4m3;
}
// MPI's max of NaN is undefined: a NaN amax travels as +inf, which keeps the
// previous scale (fp8_scale) just as NaN would.
inline float reducible(float amax) { return std::isnan(amax) ? std::numeric_limits<float>::infinity() : amax; }
template <typename Elem>
inline constexpr bool kGpu = std::is_same_v<Elem, kernels::bf16>;
}  // namespace fp8_detail

// Pointers to one block's tensors for one slot (LlamaStage::block).
template <typename Elem, typename G>
struct LlamaStage<Elem, G>::Block {
  int64_t slot = 0;   // the activation slot of its micro-batch
  int64_t layer = 0;  // local index
  int64_t index = 0;  // the stage's block index: chunk * blocks per chunk + layer
  int64_t global = 0; // the model's layer index
  bool fp8 = false;   // its linear layers run in FP8 (Layout::fp8_layer)
  Checkpointing mode = Checkpointing::none;
  // Parameters and their gradients.
  const Elem *w_attn_norm, *wq, *wk, *wv, *wo, *w_mlp_norm, *wg, *wu, *wd;
  // (null for frozen parameters under LoRA)
  G *g_attn_norm, *gq, *gk, *gv, *go, *g_mlp_norm, *gg, *gu, *gd;
  // Qwen3's q and k norms (null without them).
  const Elem *w_q_norm, *w_k_norm;
  G *g_q_norm, *g_k_norm;
  // LoRA adapters of each linear layer (null where it has none): A (r, K)
  // and B (N, r), and their gradients.
  std::array<const Elem*, kLinears> lora_a{}, lora_b{};
  std::array<G*, kLinears> lora_ga{}, lora_gb{};
  // Activations (nullptr where the layout has none).
  Elem* x_in;
  A* rstd1;
  A* xhat1;
  Elem *ln1, *q, *k, *v, *out;
  // Qwen3's q and k norms: their inputs and 1/rms per row and head (null
  // without them).
  Elem *q_raw, *k_raw;
  A *q_rstd, *k_rstd;
  A* lse;
  Elem* probs;
  Elem* x_mid;
  A* rstd2;
  A* xhat2;
  Elem *ln2, *gate, *up, *act;
  // GEMM inputs kept as FP8 codes for the weight gradient
  // (memory::fp8_saved_inputs), null where this block keeps none: ln1 for
  // q, k and v, ln2 for gate and up, act for down. ln1, ln2 and act then
  // point at their compute-type scratch.
  Fp8Kept in_qkv, in_gate_up, in_down;
  // An MoE block (llama_moe.cpp): the router's weight, expert 0's gate
  // (each expert's gate, up and down follow one another, kExpertStride
  // apart), the shared expert's, and their gradients; gate, up and down
  // above are then null.
  bool moe = false;
  const Elem *w_router, *w_experts, *w_sg, *w_su, *w_sd;
  G *g_router, *g_experts, *g_sg, *g_su, *g_sd;
  // LoRA on its routed experts: the first local expert's first adapter and
  // its gradient (StageParams::expert_adapter_first; each expert's follow
  // one another), null without them. The shared expert's are lora_a/b's
  // gate, up and down.
  const Elem* lora_experts;
  G* lora_g_experts;
  // Its saved tensors (memory::block_saved_shapes), null where its mode
  // drops them and no rebuild is in flight: the router's scores, the chosen
  // experts and their weights, the permutation (each choice's row, then the
  // E + 1 expert offsets), the permuted input, the experts' gate, up and
  // SwiGLU output, with the gate on the output each received row's weight
  // (the SwiGLU's row scale), the shared expert's gate, up and output; and
  // the router's statistics (E counts, then E score sums as doubles).
  A *moe_scores, *moe_weights, *moe_row_weights;
  int32_t* moe_experts;
  int64_t* moe_routing;
  int64_t* moe_stats;
  Elem *moe_in, *moe_gate, *moe_up, *moe_act, *sh_gate, *sh_up, *sh_act;
};

// A list of GEMMs as one grouped launch's params (kernels/gemm/gemm.h).
template <typename P>
kernels::GroupedOf<P> grouped(const std::vector<P>& gemms) {
  return {.gemms = gemms.data(), .count = int64_t(gemms.size())};
}

// The entries in waves none of which holds two with the same C (a grouped
// launch's entries run at once): under expert parallelism an expert's rows
// come from several ranks in runs of their own, each adding to the expert's
// weight gradient. Each entry goes to the first wave without its C, so an
// expert's runs add in their order, wave after wave.
template <typename P>
std::vector<std::vector<P>> waves(const std::vector<P>& gemms) {
  std::vector<std::vector<P>> out;
  for (const P& g : gemms) {
    size_t w = 0;
    while (w < out.size() &&
           std::any_of(out[w].begin(), out[w].end(), [&](const P& other) { return other.c == g.c; }))
      ++w;
    if (w == out.size()) out.emplace_back();
    out[w].push_back(g);
  }
  return out;
}

template <typename P>
inline constexpr bool kIsGemm = false;
template <typename E>
inline constexpr bool kIsGemm<kernels::GemmParams<E>> = true;
template <typename E>
inline constexpr bool kIsGemm<kernels::GemmAccParams<E>> = true;
template <typename E>
inline constexpr bool kIsGemm<kernels::Fp8GemmParams<E>> = true;  // cuBLASLt's scratch, as the bf16 GEMMs
template <typename E>
inline constexpr bool kIsGemm<kernels::Fp8GemmAccParams<E>> = true;
template <typename E>
inline constexpr bool kIsGemm<kernels::GroupedGemmParams<E>> = true;  // its pointer arrays beside cuBLASLt's
template <typename E>
inline constexpr bool kIsGemm<kernels::GroupedGemmAccParams<E>> = true;

template <typename Elem, typename G>
template <typename P>
void LlamaStage<Elem, G>::run(const P& p, const char* op, const char* cpu_scratch) {
  kernels::Workspace ws;
  if (const int64_t need = kernels::workspace_bytes(p, stream_.backend); need > 0) {
    const char* name = !on_device() ? cpu_scratch : kIsGemm<P> ? "scratch.gemm" : "scratch.kernels";
    const int64_t have = name && table_->has(name) ? table_->bytes(name) : 0;
    if (need > have)
      throw InternalError(fmt::format("kernel workspace of {} needs {} bytes, the shape table's {} has {}",
                                      op, need, name ? name : "(none)", have));
    ws = {table_->get<std::byte>(name), have};
  }
  trainer::run(p, ws, op, stream_);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::copy(void* dst, const void* src, int64_t bytes) {
  memory::copy(dst, src, bytes, stream_);
}

}  // namespace weft::trainer
