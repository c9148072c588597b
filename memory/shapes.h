// The one table of every tensor a rank allocates for a layout: parameters,
// gradients, optimizer state, saved activations, logits, scratch and
// communication buffers, each in a memory category. The memory model sums it;
// the trainer allocates from it through the arena, so prediction and
// measurement are built from the same list.
//
// Dimension letters: B micro-batch (layout.mb), T sequence, C hidden,
// F intermediate, H heads, H_kv kv heads, D head dim, V vocab, t the tp degree,
// T_sp = T / t under sequence parallelism (else T).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/device_spec.h"
#include "core/layout.h"
#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft::memory {

// What NCCL takes on a GPU of a multi-rank run beyond the arena (its
// communicators' buffers and handles): a stated 512 MiB, which with the
// measured single-process runtime keeps the earlier stated 1 GiB for such
// runs until one is measured.
inline constexpr int64_t kNcclRuntimeBytes = int64_t{512} << 20;

enum class Category { weights, grads, optimizer, activations, logits, workspace, comm, overhead };
constexpr int kCategories = 8;
const char* to_string(Category c);
constexpr std::array<Category, kCategories> kAllCategories = {
    Category::weights,   Category::grads,     Category::optimizer, Category::activations,
    Category::logits,    Category::workspace, Category::comm,      Category::overhead};

struct TensorShape {
  const char* name;      // e.g. "layer.attn.q"; static storage
  Category category;
  int64_t elements;      // of one instance
  int64_t element_bytes;
  int64_t count;         // instances live at the peak (layers x micro-batches in flight)
  int64_t bytes() const { return elements * element_bytes * count; }
};

// What the FFN of a slot position holds (StagePlan): a dense block's in
// every chunk, an MoE block's in every chunk, or either (interleaved dense
// and MoE layers whose chunks disagree at that position).
enum class SlotFfn : int { dense, moe, both };
struct SlotPositions {
  int64_t positions = 0;
  int64_t checkpointed = 0;  // of them, among the slot's first slot_checkpointed
};

// Which layers and pieces of the model a pipeline stage holds.
struct StagePlan {
  int64_t stage = 0;
  int64_t layers = 0;            // blocks on this stage
  int64_t checkpointed = 0;      // of which use the checkpointing mode
  // A chunk-micro-batch's activation slot holds the saved tensors of the
  // stage's largest chunk (an uneven split's smaller chunks leave part of
  // theirs unused), of which the first slot_checkpointed blocks use the mode.
  int64_t slot_layers = 0;
  int64_t slot_checkpointed = 0;
  int64_t in_flight_chunks = 0;  // chunk-micro-batches in flight (pipeline schedule)
  // MoE models: the stage's blocks with an MoE FFN, and the slot's
  // positions by SlotFfn (position i holds block i of whichever chunk is in
  // flight). A dense model's positions are all dense.
  int64_t moe_layers = 0;
  std::array<SlotPositions, 3> slot_ffn{};
  bool has_embedding = false;    // first stage
  bool has_head = false;         // last stage: final norm, LM head, loss
  // LoRA (RunSpec::lora): the parameters above are frozen and the stage
  // trains the adapters of its blocks.
  LoraSpec lora;
};

StagePlan stage_plan(const ModelSpec& m, const RunSpec& run, const Layout& l, int64_t stage);
// What slot position `position` of `stage` holds (over the stage's chunks).
SlotFfn slot_ffn(const ModelSpec& m, const Layout& l, int64_t stage, int64_t position);

// (K, N) of one block's linear layer y = x W^T on one tp rank: W is (N, K),
// the outputs N split for column-parallel layers, the inputs K for row-parallel ones.
struct LinearShape {
  int64_t K = 0, N = 0;
};
LinearShape linear_shape(const ModelSpec& m, const Layout& l, Linear g);

// Trainable parameter elements held by one rank of `stage` before ZeRO
// sharding (tp-sharded): the flat buffers the gradients, the optimizer and
// ZeRO work on. Every parameter of the model, or with LoRA the adapters:
// per targeted layer A (r, K) and B (N, r) on one tp rank, in its LinearShape.
int64_t stage_param_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan);
// The frozen ones (the base model under LoRA, else 0): weights only, whole
// on every dp rank.
int64_t stage_frozen_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan);
// The adapters of one block on one tp rank: a dense block's, or an MoE
// block's (`moe`: its attention's, its ep rank's routed experts' and its
// shared expert's; trainer/model/params.h).
int64_t lora_block_elements(const ModelSpec& m, const Layout& l, const LoraSpec& lora, bool moe);
// The largest of the stage's blocks' adapters (a ZeRO group under LoRA).
int64_t lora_largest_block_elements(const ModelSpec& m, const Layout& l, const StagePlan& plan);

// Elements of one block's parameters on one tp rank: a dense block's, an
// MoE block's (the router and the experts whole, the shared expert split
// over tp).
int64_t dense_block_param_elements(const ModelSpec& m, const Layout& l);
int64_t moe_block_param_elements(const ModelSpec& m, const Layout& l);
struct Fp8SavedInputs;
// Activations one block saves for its backward, per micro-batch, for a
// checkpointing mode (count 1): what the backward finds without recomputing.
// The GEMM inputs `fp8` names are kept as FP8 codes (fp8_saved_inputs).
// `ffn`: a dense block's, an MoE block's, or both lists merged (a slot
// position that holds either), in one order, so each list is a subsequence
// of the merged one.
// An MoE block keeps, besides its attention's and its FFN norm's: the
// router's scores (rows, E) fp32, the chosen experts (rows, k) int32 and
// their weights fp32, the permutation (each choice's row, rows k, then
// expert offsets, E + 1, int64), the permuted input (rows k, C), the
// experts' gate, up and SwiGLU output (rows k, F_e), their output (rows k,
// C; only with the gate on the output, for the weights' gradient), and the
// shared expert's gate, up and output (rows, F_s / tp). Every mode keeps the
// router's per-expert counts and score sums (layer.moe.stats, 2 E of 8
// bytes), which the balancing loss of the micro-batch reads in each MoE
// layer's backward. rows = B T_sp, this rank's norm region (its own 1 / tp
// under sequence parallelism: the routed experts run on them, the shared
// expert on all B T), k the top-k; the experts hold exactly rows k
// (dropless, without expert parallelism).
void block_saved_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, Checkpointing mode,
                        const Fp8SavedInputs& fp8, std::vector<TensorShape>& out, SlotFfn ffn = SlotFfn::dense);

// FP8 GEMMs (Layout::fp8). The seven linear layers of a block, in the order
// the trainer and the scaling state index them; (K, N) of y = x W^T on one tp
// rank, and whether the GEMM runs in FP8 in an FP8 block: its rows M (B*T/cp
// tokens), K and N all multiples of 16, the FP8 tensor cores' rule.
enum class Fp8Gemm : int { q, k, v, o, gate, up, down };
inline constexpr int kFp8Gemms = 7;
struct Fp8GemmShape {
  int64_t K = 0, N = 0;
  bool fp8 = false;
};
std::array<Fp8GemmShape, kFp8Gemms> fp8_gemm_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l);
// The FP8 tensor cores' rule: a GEMM of M rows, K and N takes FP8 operands
// when all three are positive multiples of 16.
bool fp8_gemm_dims(int64_t M, int64_t K, int64_t N);
// Block scaling's rule (fp8:blockwise): K, N and the runs of consecutive
// tokens a rank holds (fp8_token_run: T, or T / (2 cp) chunks under cp) are
// positive multiples of kFp8BlockTile, so that every tile lies inside one
// rank's part and matches the tile one rank holding everything would form.
int64_t fp8_token_run(const RunSpec& run, const Layout& l);
bool fp8_block_dims(int64_t token_run, int64_t K, int64_t N);
// Which GEMMs of a block stay in the compute precision under the layout's
// FP8 recipe, and why, as one clause ("gate, up and down stay in bf16 on
// every rank: block scaling needs K,
// N and the run of tokens multiples of 128 (gate: K 128, N 176)"); empty
// when FP8 is off or every GEMM runs in FP8.
std::string fp8_bf16_gemms_text(const ModelSpec& m, const RunSpec& run, const Layout& l);
// Whether any GEMM of the model runs in FP8 under the layout: a GEMM shape
// that qualifies, in a block the layout does not keep in bf16 (fp8@N).
bool fp8_any_gemm(const ModelSpec& m, const RunSpec& run, const Layout& l);
// "no GEMM runs in FP8 under fp8:blockwise (...)" for a layout with FP8 on
// and no GEMM in FP8; empty otherwise.
std::string fp8_runs_none(const ModelSpec& m, const RunSpec& run, const Layout& l);
// The stage's blocks that run FP8 GEMMs (Layout::fp8_layer of their global index).
int64_t fp8_stage_blocks(const ModelSpec& m, const Layout& l, const StagePlan& plan);
// Of those, the ones whose FFN is dense (the rest are MoE blocks).
int64_t fp8_stage_dense_blocks(const ModelSpec& m, const Layout& l, const StagePlan& plan);
// FP8 in an MoE block's FFN. The routed experts' GEMMs run in FP8 where C
// and this rank's share of an expert's width are multiples of 16 (of 128
// under block scaling), the shared expert's where C and its tp share are;
// an expert's rows are any number (an FP8 kernel would pad them to 16, as
// Megatron pads them for FP8). The router's GEMM stays in the compute
// precision. (The CPU trainer computes them under fp8:tensorwise and
// fp8:delayed; the models price every recipe, for the dry-run.)
bool moe_fp8_experts(const ModelSpec& m, const Layout& l);
bool moe_fp8_shared(const ModelSpec& m, const Layout& l);
// Under LoRA on the FFN's gate, up or down, the adapters read the
// compute-type rows while the base's GEMMs read their FP8 values, so the
// experts' rows, SwiGLU outputs and output gradients (the routed experts'
// and the shared one's) are quantised into scratch.moe_fp8_rows, not in
// place. The base is frozen there: no weight gradient reads the quantised
// values after their GEMM.
bool moe_fp8_row_copies(const ModelSpec& m, const LoraSpec& lora, const Layout& l);
// Block scaling (fp8:blockwise) quantises each of those operands twice:
// along its rows (1 x 128 tiles) into scratch.moe_fp8_rows for the forward
// and the input gradients, and for the weight gradients down the tokens
// (128 x 1 tiles) into scratch.moe_fp8_wgrad, two operands at a time (not
// under LoRA, whose base has no weight gradients). So under blockwise
// moe_fp8_row_copies always holds, and moe_fp8_wgrad_tiles without LoRA.
bool moe_fp8_wgrad_tiles(const ModelSpec& m, const LoraSpec& lora, const Layout& l);
// Delayed FP8 scaling's slots per block on the CPU trainer, each an
// operand's amax history, step amax and scale: the dense GEMMs' kFp8Gemms x
// 3 operands (input, weight, output gradient), then in an MoE model each
// routed expert's gate, up and down, 3 operands each. Every block has the
// same (a dense block's expert slots stay empty), and they count the
// model's experts, not a rank's share, so that a checkpoint's history per
// layer has one shape whatever the layout (ep, etp, pp).
inline int64_t fp8_delayed_slots_per_block(const ModelSpec& m) {
  return int64_t{kFp8Gemms} * 3 + (m.moe.enabled() ? m.moe.experts * 3 * 3 : 0);
}
// The global index of block `layer` of model chunk `chunk` on `stage`.
int64_t global_layer(const ModelSpec& m, const Layout& l, int64_t stage, int64_t chunk, int64_t layer);
// The token rows an MoE block routes on each rank of a layout (its own,
// B x T / (cp tp) under sp; with an expert tp degree under sp all the tp
// group's): the rows its expert-parallel dispatch sends.
int64_t moe_routed_rows(const ModelSpec& m, const RunSpec& run, const Layout& l);

// FP8 inputs kept for the backward, as Transformer Engine keeps them: where
// every block of a stage runs FP8 GEMMs with per-tensor scales (tensorwise,
// delayed), a GEMM input that only the weight gradient reads again is kept
// as the forward's E4M3 codes (one byte an element) and their scale_inv,
// instead of in the compute type: the attention norm's output (the input of
// q, k and v), the MLP norm's output (gate and up) and the SwiGLU output
// (down), each where all the GEMMs reading it run in FP8. Under sequence
// parallelism a norm output is this rank's rows, gathered again in the
// backward. The weight gradient multiplies the codes the forward did, as
// quantising the compute-type copy again with the same scale would. Not
// under LoRA (the adapters read the inputs in the compute type), nor block
// scaling (its weight gradient quantises the inputs afresh, in tiles down
// the tokens), nor on a stage holding compute-precision edge blocks (@N).
// A layer that recomputes the input in its backward keeps nothing and
// quantises the rebuilt copy, as before.
struct Fp8SavedInputs {
  bool qkv = false;      // layer.attn_norm.output_fp8
  bool gate_up = false;  // layer.mlp_norm.output_fp8
  bool down = false;     // layer.mlp.act_fp8
  bool any() const { return qkv || gate_up || down; }
};
Fp8SavedInputs fp8_saved_inputs(const ModelSpec& m, const RunSpec& run, const Layout& l, const StagePlan& plan);
// Bytes of one kept FP8 input of `elements` codes: the codes, padded to 16
// bytes, then the scale_inv (fp32) and padding to the next 16.
inline int64_t fp8_saved_bytes(int64_t elements) { return (elements + 15) / 16 * 16 + 16; }
// The GPU's FP8 scaling table (fp8.scaling), floats: per slot (block, GEMM,
// operand) the amax history, the amax and the scale, then from a 16-byte
// boundary each slot's scale_inv on a 16-byte boundary of its own
// (kFp8ScaleInvStride floats apart), as cuBLASLt takes FP8 scales in place.
inline constexpr int64_t kFp8ScaleInvStride = 4;
inline int64_t fp8_scale_inv_offset(int64_t slots, int64_t history) {
  return (slots * (history + 2) + kFp8ScaleInvStride - 1) / kFp8ScaleInvStride * kFp8ScaleInvStride;
}
inline int64_t fp8_scaling_elements(int64_t slots, int64_t history) {
  return fp8_scale_inv_offset(slots, history) + kFp8ScaleInvStride * slots;
}
// Whether a saved tensor of block_saved_shapes is a kept FP8 input (its
// name ends in "_fp8"): no rebuilt instance, a layer recomputing it writes
// the compute-type scratch instead.
bool fp8_saved_name(const char* name);

// Refuses (InputError) a layout whose tensors a 64-bit count cannot hold:
// what stage_shapes checks first, on its own (the search asks it of every
// shape before bounding its step, and builds tables only for the shapes it
// visits).
void check_sizes(const ModelSpec& m, const RunSpec& run, const Layout& l);

// The whole table for one rank of `stage`, counts filled in.
std::vector<TensorShape> stage_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l,
                                      const DeviceSpec& device, const StagePlan& plan);
// The same table into `out` (cleared first), reusing its storage: the
// memory model builds one per stage of hundreds of thousands of layouts.
void stage_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                  const StagePlan& plan, std::vector<TensorShape>& out);

// The table's two parts, for bounds that need one alone (the tuner's
// search asks them of hundreds of thousands of layouts): the entries after
// the state (weights, gradients and optimizer state, which it lists first),
// into `out` (cleared first); and the bytes of every weights, grads and
// optimizer entry of the whole table.
void stage_other_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                        const StagePlan& plan, std::vector<TensorShape>& out);
int64_t stage_state_bytes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                          const StagePlan& plan);

// Bytes per category of a table.
std::array<int64_t, kCategories> sum_by_category(const std::vector<TensorShape>& shapes);

}  // namespace weft::memory
