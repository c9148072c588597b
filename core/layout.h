// Layout: how one run is laid out over the devices, and its one canonical
// text form, e.g. "tp2-pp4-dp8-mb1-vpp1-sp-ckpt:none-attn:flash-norm:fused-zero1-grad:fp32";
// with context parallelism "tp2-cp2-pp4-dp8-...-zero1-grad:fp32-cp:ring" (cp
// and its transport are left out at cp 1, so older layouts read the same),
// with FP8 GEMMs "...-grad:fp32-fp8:delayed" (left out when off), with an
// uneven pipeline split "...-split:1.2x62.1" (left out when even), with
// hybrid sharding "...-zero3@8-..." (ZeRO shards within groups of 8 ranks).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft {

// What the backward pass recomputes instead of keeping from the forward:
// selective: the attention core (scores, softmax, attention output);
// ffn: the MLP (post-attention norm, gate/up projections and SwiGLU);
// full: the whole block from its input.
enum class Checkpointing { none, selective, ffn, full };
// flash and materialized are weft's own kernels (CPU and CUDA); cudnn is
// cuDNN's fused SDPA, so it runs on GPUs only (kernels/attention/attention.h).
enum class AttentionKind { flash, materialized, cudnn };
enum class NormKind { fused, unfused };
// The dtype gradients accumulate over micro-batches and are reduced over dp
// in. bf16 halves their memory and the data-parallel volume, at the cost of
// rounding each micro-batch's sum and each reduction to 8 mantissa bits (a
// gradient 2^-8 below the running sum is lost); fp32 is exact to fp32. bf16
// needs bf16 compute: the CPU trainer runs in fp32 throughout.
enum class GradPrecision { fp32, bf16 };
// How context-parallel ranks (cp > 1) share the keys and values of the
// sequence they split; each rank holds chunks r and 2*cp-1-r of 2*cp equal
// chunks, which balances the causal work:
// ring:      K/V chunks passed around the ring while attention computes on the
//            current one, the partial outputs merged through the lse;
//            dK/dV travel back around the ring in the backward.
// allgather: K/V all-gathered before attention, dK/dV reduce-scattered after.
// a2a:       Ulysses: all-to-all from sequence-split to head-split before
//            attention and back after (local heads and kv heads divisible by cp).
enum class CpComm { ring, allgather, a2a };
// How expert parallelism moves each rank's routed rows to the ranks holding
// their experts (Layout::ep > 1), Megatron's token dispatchers:
// a2a:       all-to-all with per-expert counts: each rank sends only the rows
//            routed to each other rank's experts, and gets their outputs
//            back the same way.
// allgather: every rank's routed rows all-gathered over ep, each rank
//            computing its experts' share of them; the outputs
//            reduce-scattered back (more bytes, no per-peer counts; for
//            small ep and large top-k).
enum class MoeDispatch { a2a, allgather };
// FP8 GEMMs for the linear layers of the transformer blocks (q, k, v, o,
// gate, up, down; never the embedding, the LM head or attention's own
// products), E4M3 forward operands and E5M2 output gradients with per-tensor
// scales (kernels/fp8/fp8.h), accumulating in fp32:
// off:        every GEMM in the compute precision.
// tensorwise: current scaling: each operand's scale from its own amax, taken
//             over the tp*cp ranks that share the tensor, when it is cast.
// delayed:    each operand's scale from the largest amax of the previous
//             steps' history (kDelayedHistory steps), reduced over every
//             rank once per step; a tensor without history scales like
//             tensorwise.
// blockwise:  block scaling (DeepSeek-V3's and Transformer Engine's block
//             recipe): every operand in E4M3 with a current scale per tile,
//             1 x 128 along the GEMM's reduction dimension for activations
//             and output gradients (each quantised once per use: the weight
//             gradient reduces over tokens, so it takes 128 x 1 tiles of
//             both) and 128 x 128 blocks of the weights. A tile lies inside
//             one rank's part of a tensor, so no amax is reduced; a GEMM is
//             blockwise when its local K and N are multiples of 128 and the
//             runs of consecutive tokens a rank holds (T, or T / (2 cp)
//             under cp) are too, else it stays in the compute precision.
//             The CPU trainer emulates it; the GPU trainer refuses it.
// The first and last fp8_bf16_layers blocks keep their GEMMs in the compute
// precision (text fp8:delayed@N), and so does any GEMM whose local
// dimensions are not all multiples of 16 (the FP8 tensor cores' rule). On
// the CPU, FP8 is emulated: the fp32 GEMMs see quantised-dequantised operands.
enum class Fp8Recipe { off, tensorwise, delayed, blockwise };
inline constexpr int64_t kFp8BlockTile = 128;
inline constexpr int64_t kFp8DelayedHistory = 16;

struct Layout {
  int64_t tp = 1;   // tensor-parallel degree
  int64_t cp = 1;   // context-parallel degree: ranks that split each sequence
  CpComm cp_comm = CpComm::ring;
  int64_t pp = 1;   // pipeline stages
  int64_t dp = 1;   // data-parallel replicas
  // Expert parallelism (MoE models): the routed experts split over ep
  // consecutive ranks of dp x cp (cp fastest, Megatron's folding of the
  // expert grid), E / ep on each, every tp rank holding its ep rank's
  // experts whole (an expert tp degree of 1). Each rank routes its own
  // rows and sends each choice to the rank holding its expert (all-to-all
  // with per-expert counts, dropless unless a capacity factor drops). The
  // experts' gradients sum over the expert data-parallel group, the dp x cp
  // ranks holding the same experts (every ep-th); ZeRO shards every
  // parameter over that group, and the other parameters' shards then sum
  // over ep too (hybrid sharding's two levels: shard group = the expert
  // data-parallel group, replicas = the ep group). Text ep2; 1 by default.
  int64_t ep = 1;
  MoeDispatch dispatch = MoeDispatch::a2a;  // text dispatch:allgather; printed at ep > 1
  // The expert tp degree: 1 (every tp rank holds its experts whole), or tp
  // (each expert's width split over the tp ranks as a dense FFN's: gate and
  // up by rows, down by columns, the partial outputs summed over tp; without
  // sp, where the tp ranks route the same rows). Text etp2; 1 by default.
  int64_t etp = 1;
  // Megatron's folding of the expert grid at an expert tp degree of 1: the
  // ep group takes the tp ranks first (tp fastest, then ep / tp consecutive
  // ranks of dp x cp), so every tp rank holds different experts, E / ep of
  // them, and the ep group of ep <= 8 ranks stays in one node. ep counts the
  // whole group (Megatron's EP), so tp divides it and ep / tp divides dp x
  // cp; each tp rank routes its own rows (sp). The experts' gradients sum
  // over the ranks holding the same ones (dp x cp / (ep / tp), of one tp
  // rank), the rest as without folding. Text epfold; off by default.
  bool ep_fold = false;
  // The capacity factor an MoE model's blocks drop at (MoeSpec::
  // capacity_factor: each expert keeps ceil(f x rows x k / E) of a rank's
  // rows; 0: dropless). A training setting of the model's, which the tuner
  // searches among the values the user lists (--moe-capacity-factor
  // 0,1.25), so it travels with the layout: a layout is trained only with a
  // model that drops at its factor (violations() says so otherwise), and
  // evaluated with such a copy of the model. Text cap:1.25; 0 is not printed.
  double capacity_factor = 0;
  int64_t mb = 1;   // micro-batch size in sequences
  int64_t vpp = 1;  // virtual pipeline chunks per stage (interleaved 1F1B when > 1)
  bool sp = false;  // sequence parallelism of the norm regions (needs tp > 1)
  Checkpointing ckpt = Checkpointing::none;
  int64_t ckpt_layers = 0;  // 0: every layer of a stage; k > 0: the first k of each stage
  AttentionKind attention = AttentionKind::flash;
  NormKind norm = NormKind::fused;
  int64_t zero = 0;  // ZeRO stage 0-3 over the dp axis
  // Hybrid sharding (torchtitan's HSDP, ZeRO++'s hpZ): ZeRO shards the
  // weights, gradients and optimizer state within groups of zero_group
  // consecutive ranks of dp x cp (cp fastest, so a group holds whole cp
  // groups first) and replicates them across the groups; gradients
  // reduce-scatter within a group, then the shards all-reduce across the
  // groups holding the same one. 0: one group of all dp x cp ranks. Text
  // zero3@8; a group of all dp x cp reads as 0.
  int64_t zero_group = 0;
  GradPrecision grad = GradPrecision::fp32;
  Fp8Recipe fp8 = Fp8Recipe::off;
  int64_t fp8_bf16_layers = 0;  // first and last N blocks keep compute-precision GEMMs
  // The decoder layers of each virtual stage v = chunk * pp + stage, in model
  // order (pp * vpp counts summing to L); empty: the even split, L / (pp *
  // vpp) each. The first virtual stage also runs the embedding and the last
  // the final norm, the head and the loss, so either may hold no layer at all
  // (Megatron's account_for_embedding_in_pipeline_split and _loss_: the
  // embedding or the loss counted as a layer); every other holds at least
  // one. Text: split:1.2x62.1 (one virtual stage of 1 layer, 62 of 2, one of
  // 1); a list of equal counts is the even split and reads as empty.
  std::vector<int64_t> split;

  // Whether global block `layer` runs its linear layers in FP8 (before the
  // multiple-of-16 rule, which depends on each GEMM's local shape).
  bool fp8_layer(const ModelSpec& m, int64_t layer) const {
    return fp8 != Fp8Recipe::off && layer >= fp8_bf16_layers && layer < m.layers - fp8_bf16_layers;
  }

  // Bytes of one gradient element (and of the data-parallel reductions).
  int64_t grad_bytes() const { return grad == GradPrecision::bf16 ? 2 : 4; }

  int64_t world() const { return tp * cp * pp * dp; }
  // Ranks a parameter's gradient sums over and ZeRO shards its state over:
  // the data-parallel replicas times the context-parallel ranks (each sees
  // only its part of every sequence).
  int64_t shard_ways() const { return dp * cp; }
  // Ranks ZeRO shards its state over: the shard group of hybrid sharding,
  // else all dp x cp.
  // Under expert parallelism, the expert data-parallel group of dp x cp /
  // ep_dpcp().
  int64_t zero_shards() const { return zero_group > 0 ? zero_group : ep > 1 ? dp * cp / ep_dpcp() : dp * cp; }
  // Shard groups holding the same shard (the replicas the shards all-reduce
  // over): 1 without hybrid sharding; ep_dpcp() under expert parallelism
  // (where the experts' ranges differ between them and do not all-reduce).
  int64_t zero_replicas() const { return zero_group > 0 ? dp * cp / zero_group : ep > 1 ? ep_dpcp() : 1; }
  bool hybrid_sharding() const { return zero_group > 0; }
  // The part of the ep group over dp x cp: ep, or folded over tp ep / tp.
  int64_t ep_dpcp() const { return ep_fold && tp > 0 && ep % tp == 0 ? ep / tp : ep; }
  // The dp x cp ranks holding the same experts: dp x cp / ep_dpcp().
  int64_t expert_dp() const { return ep > 0 ? dp * cp / ep_dpcp() : dp * cp; }
  // Tokens of each sequence one rank holds: T / cp.
  int64_t local_seq(const RunSpec& run) const { return run.seq / cp; }
  // Micro-batches per optimizer step on each dp replica (gradient accumulation).
  int64_t micro_batches(const RunSpec& run) const { return run.global_batch / (mb * dp); }
  bool uneven() const { return !split.empty(); }
  // Layers of virtual stage v (0 .. pp * vpp - 1), and the global index of its first.
  // (A split of the wrong length, which violations() names, reads as 0
  // past its end.)
  int64_t virtual_layers(const ModelSpec& m, int64_t v) const {
    if (split.empty()) return m.layers / (pp * vpp);
    return v >= 0 && size_t(v) < split.size() ? split[size_t(v)] : 0;
  }
  int64_t virtual_first_layer(const ModelSpec& m, int64_t v) const;
  // Layers of model chunk `chunk` on pipeline stage `stage`.
  int64_t chunk_layers(const ModelSpec& m, int64_t stage, int64_t chunk) const {
    return virtual_layers(m, chunk * pp + stage);
  }
  // Layers held by pipeline stage `stage` (all its chunks).
  int64_t stage_layers(const ModelSpec& m, int64_t stage) const;
  // The most layers any stage holds, and any one chunk of `stage`.
  int64_t max_stage_layers(const ModelSpec& m) const;
  int64_t max_chunk_layers(const ModelSpec& m, int64_t stage) const;
  // Layers of each chunk of `stage` that use the checkpointing mode: all, or
  // the first K / vpp of each (ckpt@K), at most the chunk's own.
  int64_t chunk_checkpointed(const ModelSpec& m, int64_t stage) const;
  // Layers of stage `stage` that use the checkpointing mode (the rest keep everything).
  int64_t checkpointed_layers(const ModelSpec& m, int64_t stage) const;
  // Whether the split differs from the even one only on the first and last
  // virtual stage (Megatron's first/last-stage counts): then the stages
  // between are alike, and stage 1 bounds them.
  bool edge_split() const;

  std::string to_string() const;
  // Parses the text form; fields may come in any order and missing ones take
  // the defaults above. InputError names an unknown or malformed field.
  static Layout parse(const std::string& text);

  // Every rule this layout breaks for (model, run, world), each with its values.
  std::vector<std::string> violations(const ModelSpec& m, const RunSpec& run, int64_t world) const;
  // Throws LayoutError listing every violation.
  void validate(const ModelSpec& m, const RunSpec& run, int64_t world) const;

  bool operator==(const Layout&) const = default;
};

// The model a layout runs: `m`, dropping at the layout's capacity factor
// (a copy where m's differs; MoE models only, a dense one is m as it is).
ModelSpec model_for(const ModelSpec& m, const Layout& l);

const char* to_string(Checkpointing c);
const char* to_string(AttentionKind a);
const char* to_string(NormKind n);
const char* to_string(GradPrecision g);
const char* to_string(CpComm c);
const char* to_string(MoeDispatch d);
const char* to_string(Fp8Recipe r);
Checkpointing checkpointing_parse(const std::string& s);
AttentionKind attention_parse(const std::string& s);
NormKind norm_parse(const std::string& s);
GradPrecision grad_precision_parse(const std::string& s);
CpComm cp_comm_parse(const std::string& s);
MoeDispatch moe_dispatch_parse(const std::string& s);
Fp8Recipe fp8_recipe_parse(const std::string& s);
// The split's text, "1.2x62.1" (runs of equal counts as NxK: N layers, K
// virtual stages), and back; the parser names a malformed count.
std::string split_text(const std::vector<int64_t>& split);
std::vector<int64_t> split_parse(const std::string& s);
// The split that gives the first virtual stage `first` layers, the last
// `last`, and spreads the rest evenly over the pp * vpp - 2 between; empty
// when that is the even split, nullopt when the rest does not divide (or a
// count would be negative, or a stage between would be empty).
std::optional<std::vector<int64_t>> edge_split(int64_t layers, int64_t virtual_stages, int64_t first, int64_t last);
// The GEMM precision of a layout as reports print it: "bf16" (the compute
// precision; fp32 on the CPU) or "fp8:tensorwise", "fp8:delayed@1".
std::string gemm_precision_text(const Layout& l);

void to_json(nlohmann::json& j, const Layout& l);
void from_json(const nlohmann::json& j, Layout& l);

}  // namespace weft
