// One pipeline stage of a Llama decoder on one rank: its blocks (RMSNorm,
// attention with RoPE and GQA, SwiGLU MLP), and on the first stage the
// embedding, on the last the final norm, LM head and loss. Forward and
// backward are written out per block, in Hugging Face LlamaForCausalLM
// semantics, over the kernels' launch protocol.
//
// Tensor parallelism follows Megatron: q/k/v, gate and up are column-parallel
// (heads and F split over tp), o and down row-parallel; the embedding, head
// and loss are vocab-parallel. The conjugate collectives sit where the math
// puts them: identity forward / all-reduce backward at a column-parallel
// input, all-reduce forward / identity backward at a row-parallel output. On
// one rank they are the identity.
//
// Every tensor comes from the shape table (memory::stage_shapes) through the
// arena. Saved activations live in per-slot instances: micro-batch activations
// stay in their in-flight slot until its backward. A checkpointed block keeps
// only what its mode keeps and rebuilds the rest, in the one recompute
// instance, right before its backward; the rebuild runs the same kernels on
// the same inputs, so gradients equal those without checkpointing bit for bit.
//
// Backends: LlamaStage<float> (and <double>, for gradient checks) runs on the
// CPU; LlamaStage<bf16> runs on a CUDA stream, with bf16 weights and
// activations and fp32 main gradients (Acc<Elem>): weight gradients
// accumulate in fp32 straight from the GEMMs and kernels, and the optimizer
// keeps fp32 master weights. The second parameter G is the gradients' type,
// the layout's grad knob: LlamaStage<bf16, bf16> (grad:bf16) keeps them in
// bf16, as Megatron's bf16-gradient mode does: each GEMM and kernel adds its
// fp32 result to them with one rounding, and they are reduced over dp, and
// exchanged between tied copies, in bf16. Every launch and copy is queued on
// the stage's stream; the host waits only in take_loss() and where a caller
// reads device memory back.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/device_spec.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_ops.h"
#include "kernels/kernel.h"
#include "kernels/rope/rope.h"
#include "memory/arena.h"
#include "memory/dense_split.h"
#include "memory/device.h"
#include "memory/shapes.h"
#include "trainer/model/llama_moe_rows.h"
#include "trainer/model/params.h"
#include "trainer/model/tensor_table.h"
#include "trainer/parallel/process_groups.h"

namespace weft::trainer {

template <typename Elem, typename G = kernels::Acc<Elem>>
class LlamaStage {
 public:
  using A = kernels::Acc<Elem>;  // saved statistics, the loss, full weights on the host

  // stream: where every launch goes (the CPU's by default; a CUDA stream for
  // bf16, whose tensors the arena must hand out in device memory).
  LlamaStage(const ModelSpec& m, const RunSpec& run, const Layout& l, int64_t stage,
             const DeviceSpec& device, memory::Arena& arena, parallel::ProcessGroups& groups,
             kernels::Stream stream = {});
  ~LlamaStage();

  const ModelSpec& model() const { return m_; }
  const Layout& layout() const { return l_; }
  const memory::StagePlan& plan() const { return plan_; }
  const StageParams& params() const { return params_; }
  parallel::ProcessGroups& groups() { return groups_; }
  TensorTable& tensors() { return *table_; }
  kernels::Stream stream() const { return stream_; }
  bool on_device() const { return stream_.backend != kernels::Backend::cpu; }
  // The flat weights; under ZeRO-3 (dp > 1) only this rank's shard,
  // [dp_shard_begin(), dp_shard_begin() + its count) of the flat parameters.
  Elem* weights() { return weights_; }
  G* grads() { return grads_; }
  int64_t param_elements() const { return params_.elements; }
  // Under ZeRO-3 a parameter's weights exist only while its group is
  // gathered (null elsewhere).
  // A frozen parameter (LoRA's base model) is in the frozen buffer and has
  // no gradient (null).
  Elem* weight(const ParamSpec& p) { return p.frozen ? frozen_ + p.offset : weight_at(p.offset); }
  bool weights_sharded() const { return zero3_; }
  // Under ZeRO-2 a parameter's gradient exists only while its group is in the
  // bucket (during that group's backward); grads() is then this rank's shard.
  G* grad(const ParamSpec& p) { return p.frozen ? nullptr : grad_at(p.offset); }
  bool grads_sharded() const { return zero2_; }
  // ZeRO-1, -2 and -3 over dp > 1: every dp rank's shard size, rank r owning
  // the r-th cut of the flat parameters (memory::zero_shard_counts); this
  // rank's starts at dp_shard_begin(). Empty otherwise.
  const std::vector<int64_t>& dp_shard_counts() const { return shard_counts_; }
  int64_t dp_shard_begin() const { return shard_lo_; }
  // Expert parallelism under ZeRO (memory::dense_split): this replica's part
  // of its shard (the whole stage where the shard group is one rank), whose
  // dense elements the replicas reduce-scatter and all-gather; null
  // otherwise.
  const memory::DenseSplit* dense_split() const { return split_ ? &*split_ : nullptr; }

  // Layout-independent initialisation from the seed (params.h), computed on
  // the host and rounded once to Elem. `progress` runs after each parameter
  // (a rank's watchdog: a billion-element stage takes a while).
  // `what`: all of them, or only the trainable ones or only the frozen ones
  // (LoRA: adapters from the seed on a pretrained base; a random base
  // rebuilt from its seed on resume).
  enum class InitWhat { all, trainable, frozen };
  void init_weights(uint64_t seed, const std::function<void()>& progress = {}, InitWhat what = InitWhat::all);
  // The weights from full Acc values on the host (this rank's slices, in the
  // flat layout; under ZeRO-3 it keeps its shard of them), rounded once to Elem.
  void set_weights(const std::vector<A>& full);
  // LoRA's frozen base weights (StageParams::frozen, this rank's slices in
  // the frozen layout), rounded once to Elem.
  void set_frozen_weights(const std::vector<A>& full);
  Elem* frozen_weights() { return frozen_; }
  int64_t frozen_elements() const { return params_.frozen_elements; }
  // The weights changed (an optimizer step): under ZeRO-3 the gathered
  // copies are stale and the next use gathers again.
  void weights_updated();
  void zero_grads();

  // Forward of one micro-batch of B sequences into in-flight slot `slot`.
  // Token and target ids must lie in [0, V): on a device the kernels do not
  // check them again (a check would synchronise the stream every
  // micro-batch); the trainer checks its token files when it opens them.
  // The first stage embeds tokens (B*T, host memory); the last computes the
  // loss against targets (B*T, host memory), leaves the gradient of
  // loss * grad_scale over its logits, and adds this rank's per-token losses
  // to the loss sum (summed over tp it is the micro-batch's total loss),
  // which take_loss() reads.
  // With interleaved pipelining (vpp > 1) a stage runs one model chunk at a
  // time: chunk c holds the stage's blocks of virtual stage c * pp + stage;
  // the first chunk of stage 0 embeds, the last chunk of the last stage ends
  // in the loss. Slots then hold chunk-micro-batches.
  void forward(int64_t slot, const int32_t* tokens, const int32_t* targets, double grad_scale,
               int64_t chunk = 0);
  // The sum of the per-token losses of the forwards since the last call (0
  // on a stage without the head), and a fresh sum. On a device this waits
  // for the stream.
  double take_loss();
  // MoE models: the load-balancing loss of this stage's MoE layers (its
  // coefficient included) times each training micro-batch's tokens, summed
  // over the training forwards since the last call (validation's, with a
  // grad_scale of 0, add nothing), on the first tp and cp rank (0
  // elsewhere: their statistics are the micro-batch's alike), and
  // a fresh sum: summed over the ranks and scaled as the losses are, it is
  // the step's mean balancing loss. The objective trained is the mean
  // token loss plus the mean over micro-batches of the balancing loss
  // (transformers' loss + coef * aux_loss per forward, averaged as
  // gradient accumulation averages the losses).
  double take_aux_loss();
  // MoE models: the tokens each expert took in each MoE layer of this stage
  // (all k choices; over the training forwards since the last call, on the
  // first tp and cp rank), added into `into` ((model layers) x E, row =
  // the global layer), and a fresh count.
  void take_expert_load(std::vector<int64_t>& into);
  // MoE models: the most uneven dispatches since the last call (and fresh
  // peaks), over this rank's forwards (evaluation's too, which fill the
  // same buffers) and MoE layers: at index d, for each d >= 2 dividing E
  // (0 elsewhere), the most choices of the rows this rank routed that a
  // block of E / d experts in a row took (an ep rank's under ep d), over the
  // balanced rows x k / d. Under ep d a rank receives at most rows x k times
  // the largest of its sources' peaks at d (MoeSpec::received_rows): what
  // the tuner sizes the receive buffers from. Empty for a dense model.
  std::vector<double> take_dispatch_peaks();
  // MoE models with a capacity: the choices each MoE layer of this stage
  // dropped (over the training forwards since the last call, on the ranks
  // that route distinct rows: every tp rank under sp, else the first),
  // added into `into` ((model layers), the global layer), and a fresh count.
  void take_dropped(std::vector<int64_t>& into);
  // MoE models under expert parallelism: a micro-batch routed past the
  // receive buffers (MoeSpec::received_rows). The ep group (and tp under
  // etp with sp) agrees on it, the most rows any of its ranks received, and
  // instead of receiving them routes that layer of the micro-batch with
  // every choice dropped: nothing is sent, every stage finishes the step,
  // and the loop leaves it without its update (RunState::step_loss). The
  // first overflow since the last call (its model layer and the rows an ep
  // rank received), nullopt where none.
  struct MoeOverflow {
    int64_t layer = -1, rows = 0;
  };
  std::optional<MoeOverflow> take_moe_overflow();
  // Its error text, the same on every rank: what was received, what the
  // buffers hold, the factor that would have held it, and the flags.
  std::string moe_overflow_text(const MoeOverflow& o) const;
  // The most rows an ep rank's experts received in one micro-batch since
  // the last call, over the balanced rows x k (what --moe-imbalance holds;
  // at most the largest source's dispatch peak at ep); 0 without ep.
  double take_received_peak();
  // The global balancing loss across pipeline stages (an MoE model with the
  // global scope under pp or vpp > 1): each layer's gradient needs the
  // router statistics of every MoE layer of the micro-batch, so they travel
  // with it, 2 E doubles (the per-expert counts, then the score sums): in
  // the forward, summed over the virtual stages so far, after the
  // activations (recv into moe_stats_in(slot) before a training forward of
  // a chunk that does not embed; send moe_stats_out() after one that does
  // not end in the head); in the backward, the totals the last virtual
  // stage found, after the gradient (recv into moe_totals(slot) before the
  // backward of a chunk that does not end in the head; send
  // moe_totals_out() after one that does not embed).
  bool moe_stats_travel() const;
  int64_t moe_stats_count() const { return 2 * m_.moe.experts; }
  double* moe_stats_in(int64_t slot) { return moe_in_.data() + slot * moe_stats_count(); }
  double* moe_stats_out() { return moe_out_.data(); }
  double* moe_totals(int64_t slot) { return moe_totals_.data() + slot * moe_stats_count(); }
  double* moe_totals_out() { return moe_totals_out_.data(); }
  // Backward of the micro-batch (chunk) in `slot`, accumulating parameter gradients.
  // final: no later backward of this step touches the chunk's parameters.
  // Without ZeRO and with dp > 1, each parameter group's (a block's, the
  // head's, the embedding's) gradient is then complete when its backward
  // ends, and its all-reduce over dp starts right there, running beside the
  // backward of the groups below it (on NCCL; MPI runs it at once).
  void backward(int64_t slot, int64_t chunk = 0, bool final = false);
  // Under ZeRO-1 the final backwards reduce-scatter each group instead, in
  // place: the sum over dp of this rank's shard lands in its own range of
  // the flat gradients (where the optimizer reads it), as Megatron's
  // distributed optimizer does, so no second buffer holds the shard.
  // Under ZeRO-2 every backward reduce-scatters each group of its
  // micro-batch, beside the backward of the next.
  // Waits for the reductions the backwards started; call after the step's
  // last backward. grads_reduced(): they summed the gradients over dp.
  void finish_dp_reduction();
  bool grads_reduced() const { return reduced_; }
  // Hybrid sharding: the backwards also all-reduced each final shard piece
  // over the replica group (one group behind the reduce-scatters, beside
  // the backward of the groups below).
  bool replicas_reduced() const { return replicas_reduced_; }
  // Sums `data`, the flat gradients [flat, flat + n) (or this rank's shard
  // of them), over the replica group: under expert parallelism (the ep
  // group) all but the routed experts' ranges, which hold other experts on
  // each replica and sum over the expert data-parallel group only. Under
  // dense_split() a reduce-scatter: each replica's own dense part gets the
  // sum.
  void reduce_replicas(G* data, int64_t flat, int64_t n);

  // Sums the gradients of tp-replicated parameters (the norms) over the tp
  // group where sequence parallelism split their rows; call after the last
  // backward of a step.
  void reduce_replicated_grads();
  // Tied embeddings across pipeline stages: the first stage's embedding and
  // the last stage's head copy get the sum of both gradients, so the two
  // copies take identical updates. Where the gradients were already reduced
  // over dp into shards (ZeRO-1 and -2), each stage gathers its copy's
  // over dp first and keeps its shard of the sum. Call after
  // finish_dp_reduction().
  void sync_tied_grads();

  // Pipeline boundaries: a non-first stage's input activations, and a
  // non-last stage's output activations and their gradient, (B, T_sp, C)
  // with T_sp = T / tp under sequence parallelism.
  int64_t boundary_elements() const { return Msp_ * m_.hidden; }
  // The input of chunk `chunk` in activation slot `slot`: its first block's,
  // or for a last virtual stage without blocks the final norm's.
  Elem* stage_input(int64_t slot, int64_t chunk);
  Elem* stage_output();
  Elem* output_grad();
  Elem* input_grad();

  // FP8 GEMMs (Layout::fp8; on the CPU emulated: the fp32 GEMMs multiply
  // quantised-dequantised operands, kernels/fp8/fp8.h; on a GPU the FP8
  // codes go to cuBLASLt's FP8 GEMMs, kernels/fp8/fp8_ops.h, with the scales
  // in device memory). fp8_step_begin()
  // before a step's first forward: the weights changed, so their quantised
  // copies are stale, and delayed scaling takes this step's scales from the
  // amax history. fp8_step_end() after the step's last backward, on every
  // rank: delayed scaling reduces the step's amaxes over the ranks that hold
  // this stage (tp x cp x dp) and appends them to the history. It returns
  // this rank's quantisation counts since fp8_step_begin() (validation
  // forwards in between included); on a GPU it reads them back from the
  // device, waiting for the stream (FP8's one host synchronisation a step).
  struct Fp8Counts {
    int64_t values = 0, overflow = 0, underflow = 0;
  };
  void fp8_step_begin();
  // commit false: a step left without its update (an MoE overflow) leaves
  // the amax history as it was.
  Fp8Counts fp8_step_end(bool commit = true);
  // Delayed scaling's amax history for checkpoints (checkpoint::kFp8HistoryTensor):
  // per block of the stage, in the stage's order, 7 GEMMs x 3 operands x
  // kFp8DelayedHistory values, oldest first; empty without delayed scaling.
  // fp8_history_len(): how many entries are filled.
  std::vector<float> fp8_history() const;
  int64_t fp8_history_len() const { return fp8_history_len_; }
  void fp8_history_set(const std::vector<float>& history, int64_t len);

  // LoRA dropout (RunSpec::lora.dropout > 0): on for a training step's
  // forwards and backwards (a key drawn from the run's seed and the step),
  // off otherwise (validation, eval). The mask of an element depends on the
  // key, its layer and linear layer and its global position alone (the
  // sample, the token, the feature), so every layout drops the same
  // elements: set_samples tells the stage the global index of the first
  // sample of the micro-batch in `slot` before its forward.
  void lora_dropout(bool on, uint64_t step_key = 0) {
    dropout_on_ = on;
    dropout_key_ = step_key;
  }
  void set_samples(int64_t slot, int64_t first_sample);

  // Copies the logits (B*T, V/tp) of each forward to the host, before the
  // loss overwrites them with their gradient (reference tests, eval dumps).
  void capture_logits(std::vector<Elem>* out) { capture_ = out; }

 private:
  // A GEMM input kept as FP8 codes (memory::fp8_saved_inputs): this rank's
  // rows [row0, row0 + rows) of the input (all of them, or under sequence
  // parallelism its own), E4M3 under the forward's scale, whose inverse
  // follows the codes. On the CPU the codes are row-major (rows, K); on a GPU
  // they are the transposed codes' columns of those rows (K, rows), the
  // weight gradient's operand layout.
  struct Fp8Kept {
    uint8_t* codes = nullptr;
    float* scale_inv = nullptr;
    int64_t row0 = 0, rows = 0;
  };
  struct Block;  // pointers to one block's tensors for one slot
  Block block(int64_t slot, int64_t chunk, int64_t layer);
  Checkpointing mode(int64_t layer) const;
  void block_forward(const Block& b, Elem* x_out, bool recompute);
  void block_recompute(const Block& b);
  void block_backward(const Block& b, Elem* dx);
  void norm_forward(const Elem* x, const Elem* residual, Elem* sum, const Elem* w, Elem* y, A* rstd,
                    A* x_hat);
  void norm_backward(const Elem* x, const A* x_hat, const A* rstd, const Elem* w, const Elem* dy,
                     Elem* dx, kernels::Write write, G* dw);
  // RoPE on this rank's q and k rows at their positions, and attention over
  // the whole sequence; under context parallelism (cp > 1) the rows are two
  // chunks of each sequence and the keys and values come through the
  // layout's transport (llama_context.cpp). dq, dk and dv are overwritten.
  void rope(Elem* q, Elem* k, kernels::RopeDirection direction);
  // Llama 4's attention variants (core/moe_spec.h): whether block b's
  // layer rotates q and k (not its NoPE layers), and a NoPE layer's
  // temperature: q's rows scaled by their positions' factors, in place
  // (its backward scales dq alike). On the CPU.
  bool rope_layer(const Block& b) const;
  void temperature(Elem* q);
  // The positions per attention chunk of block b's layer for the attention
  // kernels: the model's attention_chunk in its RoPE layers, 0 (the whole
  // causal range) in its NoPE layers and in models without chunks.
  int64_t attention_chunk(const Block& b) const;
  void attention_forward(const Block& b);
  void attention_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv);
  // The sequence position of chunk k (0 or 1) of cp rank `rank`.
  int64_t chunk_offset(int64_t rank, int64_t k) const;
  std::vector<std::unique_ptr<parallel::CommRequest>> ring_pass_kv(int64_t s, const Elem* k, const Elem* v,
                                                                   Elem* into);
  void ring_forward(const Block& b);
  void ring_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv);
  void allgather_kv(const Elem* k, const Elem* v, Elem* full);
  void allgather_forward(const Block& b);
  void allgather_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv);
  void a2a_exchange(Elem* blocks_out, Elem* blocks_in, int64_t block);
  void a2a_to_heads(const Elem* x, int64_t heads, Elem* y);
  void a2a_to_sequence(const Elem* y, int64_t heads, Elem* x);
  Elem* a2a_head_tensor(int which);
  void a2a_forward(const Block& b);
  void a2a_backward(const Block& b, const Elem* dout, Elem* dq, Elem* dk, Elem* dv);
  template <typename T>
  void fill(T* x, int64_t n, double value);
  // The block's linear layers, y = x W^T and its two gradients, with (K, N)
  // from memory::fp8_gemm_shapes: in FP8 where the block and the GEMM's
  // shape allow, else in the compute type. A *_same flag says the operand
  // holds the values of the previous call's (q, k and v share their input,
  // dgrad and wgrad the output gradient), whose quantisation is reused.
  // keep (forward): where the block keeps this input as FP8 codes, they and
  // their scale_inv go there; kept (wgrad): the weight gradient reads them
  // instead of quantising x (which may then be null).
  // x_rows: x holds this rank's rows only (sequence parallelism, where
  // fp8_gathers_codes says so): the FP8 cast takes them with the whole
  // tensor's scale and the codes are gathered over tp, one byte an element
  // (Transformer Engine's FP8 all-gather), the same codes as casting the
  // gathered input.
  void linear_forward(const Block& b, memory::Fp8Gemm g, const Elem* x, bool x_same, const Elem* w, Elem* y,
                      const char* op, const Fp8Kept* keep = nullptr, bool x_rows = false);
  // Whether block b's forward gathers the FP8 codes of the input that GEMM
  // `first` and the ones after it share (q, k, v; gate, up) instead of the
  // input: under sp, tensorwise or delayed scaling, no LoRA (its adapters
  // read the gathered input), every GEMM reading it in FP8.
  bool fp8_gathers_codes(const Block& b, memory::Fp8Gemm first) const;
  void linear_dgrad(const Block& b, memory::Fp8Gemm g, const Elem* dy, bool dy_same, const Elem* w, Elem* dx,
                    kernels::Write write, const char* op);
  void linear_wgrad(const Block& b, memory::Fp8Gemm g, const Elem* dy, bool dy_same, const Elem* x, bool x_same,
                    G* dw, const char* op, const Fp8Kept* kept = nullptr);
  // The kept codes of an input back as the weight gradient's operand: on the
  // CPU decoded into fp8_input_ (and gathered over tp under sp); on a GPU
  // as fp8_in_t_ and fp8_in_scale_inv_ (gathered into fp8_in_[1]).
  // fp8_restore_begin starts the gather on tp_beside() (null: nothing to
  // gather); fp8_restore_end waits for `pending` and makes the operand.
  void fp8_restore(const Fp8Kept& kept, int64_t K);
  std::unique_ptr<parallel::CommRequest> fp8_restore_begin(const Fp8Kept& kept, int64_t K);
  void fp8_restore_end(const Fp8Kept& kept, int64_t K, parallel::CommRequest* pending);
  // The block's kept FP8 inputs of `slot` (Block::in_*), and ln1 and ln2 in
  // their scratch where it keeps them so (block(), llama_fp8.cpp).
  void fp8_kept_inputs(Block& b, int64_t slot, int64_t layer) const;
  bool fp8_gemm(const Block& b, memory::Fp8Gemm g) const;
  // LoRA (llama_lora.cpp): after linear g of block b computed y from x,
  // y += s (x A^T) B^T (row-parallel layers add their partial sum before
  // the reduction over tp, as the base GEMM does). The backward, after g's
  // own: dx += s (dY B) A, dA += s (dY B)^T x, dB += s dY^T (x A^T), with
  // x A^T rebuilt; dy and x as g's backward has them (gathered under sp).
  // (K and N: the layer's local input and output widths where they are not
  // the dense block's, an MoE block's shared expert's.)
  void lora_forward(const Block& b, Linear g, const Elem* x, Elem* y, int64_t K = 0, int64_t N = 0);
  void lora_backward(const Block& b, Linear g, const Elem* dy, const Elem* x, Elem* dx, int64_t K = 0,
                     int64_t N = 0);
  void fp8_setup();  // the FP8 buffers and scaling state from the table (constructor)
  void fp8_weight_offsets();  // fp8_weight_at_ and fp8_weight_ready_ from fp8.weights
  // Quantises (dequantised, in Elem) one operand of GEMM g of block b:
  // role 0 the input (E4M3), 1 the weight (E4M3), 2 the output gradient (E5M2).
  // Quantises x (rows x cols) for its role (0 input, 1 weight, 2 output
  // gradient); under block scaling over_tokens takes tiles down the rows
  // (the weight gradient's reduction) instead of along them. Returns the
  // per-tensor scale it quantised with (block scaling: 0).
  float fp8_quantize(const Block& b, memory::Fp8Gemm g, int role, const Elem* x, int64_t rows, int64_t cols,
                    bool over_tokens, Elem* out);
  const Elem* fp8_weight(const Block& b, memory::Fp8Gemm g, const Elem* w);
  // The GPU's FP8 path (bf16): x (rows, cols) cast to FP8 codes `out` and
  // their transpose `out_t` with the scale of operand `role` of GEMM g of
  // block b (tensorwise: its amax, reduced over tp and cp, first). The
  // scaling slot of (block, gemm, role), and its scale_inv in device memory.
  int64_t fp8_slot(const Block& b, memory::Fp8Gemm g, int role) const;
  float* fp8_scale_inv(int64_t slot) const { return fp8_dev_scale_inv_ + memory::kFp8ScaleInvStride * slot; }
  void fp8_cast(int64_t slot, const Elem* x, int64_t rows, int64_t cols, kernels::Fp8* out, kernels::Fp8* out_t);
  // The weight's codes ([0]: (N, K), [1]: (K, N)), cast once per step
  // (ZeRO-3: at each use), and under block scaling their 128 x 128 blocks'
  // scale_invs laid out for each (null otherwise).
  struct Fp8WeightCodes {
    std::array<const kernels::Fp8*, 2> codes;
    std::array<const float*, 2> scales;
  };
  Fp8WeightCodes fp8_weight_codes(const Block& b, memory::Fp8Gemm g, const Elem* w);
  // Block scaling's cast (GPU): x (rows, cols) to codes out[0] and their
  // transpose out[1], each with its tiles' scale_invs (kernels::Fp8Tiles:
  // 1 x 128 along the rows and down the columns, or 128 x 128 blocks), E4M3
  // as the CPU's block scaling.
  void fp8_block_cast(const Elem* x, int64_t rows, int64_t cols, kernels::Fp8Tiles tiles,
                      const std::array<kernels::Fp8*, 2>& out, const std::array<float*, 2>& scales);
  // The input (fp8_in_, its slot fp8_in_slot_ set) and the output gradient
  // (fp8_gr_) cast under the run's recipe, with the weight gradient's input
  // operand (fp8_in_t_, fp8_in_scale_inv_, fp8_in_ld_) set from the cast;
  // and the output gradient's format (E5M2; E4M3 under block scaling, as
  // the CPU's).
  void fp8_cast_input(const Elem* x, int64_t K);
  void fp8_cast_grad(const Block& b, memory::Fp8Gemm g, const Elem* dy, int64_t N);
  kernels::Fp8Format format_of_grad() const {
    return l_.fp8 == Fp8Recipe::blockwise ? kernels::Fp8Format::e4m3 : kernels::Fp8Format::e5m2;
  }
  // An MoE block's FFN (llama_moe.cpp) on its FFN norm's output (the rows
  // of its norm region, Msp_): the router, the routing, the experts over
  // their tokens and the shared expert, their sum into y, whole (this
  // rank's rows first under sp: no reduction over tp follows). A rebuild
  // (recompute) refills the block's dropped tensors and stops before y; its
  // router statistics go to scratch (the saved ones stay). The backward
  // takes dy (the norm region's rows) and writes the norm output's gradient
  // dx (its rows, whole), accumulating the weight gradients, the router's
  // with the balancing loss's part.
  void moe_forward(const Block& b, Elem* y, bool recompute);
  void moe_backward(const Block& b, const Elem* dy, Elem* dx);
  // A run of rows in the experts' buffers that one of this rank's experts
  // (`expert`, counted from its first) computes.
  // (`source`: which of the rows' senders they came from, in the order the
  // experts' buffers hold them; 0 without expert parallelism.)
  struct ExpertRun {
    int64_t expert = 0, offset = 0, rows = 0, source = 0;
  };
  // Block scaling's tiles down the tokens, as one rank computing the
  // micro-batch takes them, where a tile's rows lie apart: each row's tile
  // and the groups whose ranks hold its other rows. The routed experts'
  // rows (moe_token_tiles: empty without sp and cp, where each run is all
  // of a micro-batch's rows for its expert and takes its own tiles): a tile
  // is 128 of an expert's rows of one micro-batch in sequence order, from
  // the per-expert counts of every sender's runs of consecutive tokens. The
  // shared expert's M_ rows under cp (shared_token_tiles): 128 positions of
  // the micro-batch's sequences. fp8_token_tiles quantises x's rows
  // (`width` wide) into out under them: the column maxima of each tile's
  // rows over those groups, then each value under its tile's column scale.
  struct TokenTiles {
    bool apart = false;  // (false: each run's own tiles; the same on every rank)
    std::vector<int64_t> of_row;
    int64_t count = 0;
    std::vector<parallel::Comm*> over;
  };
  TokenTiles moe_token_tiles(const Block& b, std::span<const ExpertRun> runs, int64_t rows_in, bool etp_sp);
  TokenTiles shared_token_tiles() const;
  void fp8_token_tiles(const Elem* x, Elem* out, int64_t width, const TokenTiles& t);
  moe_rows::TokenGeometry token_geometry() const;
  // The senders of the runs: the ep ranks, and under etp with sp each tp
  // rank's again (tp x ep; moe_rows::expert_rows), gathered over ep once.
  const std::vector<moe_rows::TokenSender>& moe_senders(bool etp_sp);
  // FP8 in an MoE block's FFN (llama_moe_fp8.cpp, tensorwise and delayed,
  // on the CPU): every local expert's gate, up and down weight, then the
  // shared expert's, quantised each with its own scale into `out`
  // (scratch.moe_fp8_weight), the ones memory::moe_fp8_experts and
  // moe_fp8_shared put in FP8; and the rows of `x` (`width` wide) that the
  // runs name, quantised into the same rows of `out` (x itself, or under
  // LoRA on the FFN scratch.moe_fp8_rows: memory::moe_fp8_row_copies) with
  // a scale per expert (and micro-batch, tensorwise), as the operand `role`
  // (0 an input, 2 an output gradient) of the experts' GEMM `gemm` (0 gate,
  // 1 up, 2 down); it returns `out`.
  void moe_fp8_weights(const Block& b, Elem* out);
  // Under fp8:blockwise a scale per tile, 1 x 128 along a row, or
  // (`over_tokens`, a weight gradient's operand) 128 x 1 down the tokens:
  // within each run, or where the tiles say each row's (TokenTiles).
  Elem* moe_fp8_rows(const Block& b, int gemm, const Elem* x, Elem* out, int64_t width,
                     std::span<const ExpertRun> runs, bool etp_sp, int role, const TokenTiles* over_tokens = nullptr);
  // scratch.moe_fp8_rows where a block quantising (`fp8`) does so into
  // copies (memory::moe_fp8_row_copies), else null: quantised in place; and
  // scratch.moe_fp8_wgrad where the weight gradients quantise their
  // operands again, down the tokens (memory::moe_fp8_wgrad_tiles), else null.
  Elem* moe_fp8_copies(bool fp8) const;
  Elem* moe_fp8_wgrad_scratch(bool fp8) const;
  // Delayed scaling's state of one slot (fp8_scaling_): the dense GEMM g's
  // operand `role` in block b, or the model's expert e's GEMM `gemm`
  // (memory::fp8_delayed_slots_per_block); null without that state.
  float* fp8_state(const Block& b, memory::Fp8Gemm g, int role) const;
  float* fp8_expert_state(const Block& b, int64_t e, int gemm, int role) const;
  // The shared expert's input (all rows, C wide) and output gradient,
  // quantised as the dense FFN's into scratch.fp8_input and fp8_grad.
  const Elem* moe_fp8_shared_input(const Block& b, const Elem* x);
  const Elem* moe_fp8_shared_grad(const Block& b, const Elem* dy);
  // LoRA on an MoE block's routed experts (llama_moe_lora.cpp), each local
  // expert's adapters over its runs of rows (Block::lora_experts): forward,
  // the gate's and the up's s (x A^T) B^T added to the experts' gate and up
  // (x the permuted input), the down's to `out` from the SwiGLU output;
  // backward, after the base's input gradients: the down's part of d_act
  // from the experts' output gradient d_out, the gate_up's of d_in from
  // d_gate and d_up, and the adapters' gradients.
  void moe_lora_gate_up(const Block& b, std::span<const ExpertRun> runs);
  void moe_lora_down(const Block& b, std::span<const ExpertRun> runs, Elem* out);
  void moe_lora_down_backward(const Block& b, std::span<const ExpertRun> runs, const Elem* d_out, Elem* d_act);
  void moe_lora_gate_up_backward(const Block& b, std::span<const ExpertRun> runs, const Elem* d_gate,
                                 const Elem* d_up, Elem* d_in);
  // Expert parallelism: rows of `width` elements in expert order move
  // between the ep ranks by the layout's dispatcher. `sent` (E): the rows
  // this rank routed to each expert; `counts`: what the dispatcher
  // exchanged, under a2a the rows each ep rank routed to each of this
  // rank's experts (ep, E / ep), under allgather every rank's `sent` (ep,
  // E). Forward (`back` false): from `in` in this rank's expert order to
  // `out` in received order (source rank by source rank, expert by
  // expert); back: the reverse. Returns the rows that land.
  template <typename T>
  int64_t moe_exchange(const int64_t* sent, const int64_t* counts, const T* in, T* out, int64_t width,
                       bool back);
  // `n` of the MoE metadata the host reads (the routing's offsets and
  // exchanged counts, the router's statistics), read back from the device
  // (the stream waited for) where the stage runs on one.
  std::vector<int64_t> moe_host(const int64_t* src, int64_t n);
  // The balancing loss of the micro-batch in `slot` over chunk `chunk`'s
  // MoE blocks (global scope: every MoE block of the model, on this one
  // chunk), from their saved statistics: coef times the loss, and per
  // block its derivative with respect to each expert's score at any row
  // (into dscore, (MoE blocks, E), in block order), or null.
  double moe_balance(int64_t slot, int64_t chunk, std::vector<double>* dscore);
  // After a forward of chunk `chunk` into `slot`: the experts' loads, the
  // balancing loss's value (training forwards) and, for the global scope,
  // the micro-batch's statistics so far (moe_stats_travel).
  void moe_forward_end(int64_t slot, int64_t chunk, double grad_scale);
  // The global balancing loss from a micro-batch's totals (2 E: counts, then
  // score sums, over all its MoE layers): coef times the loss, and the
  // derivative at each expert's score (E), when dscore is not null.
  double global_balance(const double* totals, double* dscore) const;
  void head_forward(int64_t slot, const int32_t* targets, double grad_scale);
  void head_backward(Elem* dx);
  // Launches an op on the stage's stream, with the kernel workspace it needs
  // (on the CPU the table's `cpu_scratch` entry, on a GPU the shared
  // scratch.kernels; GEMMs get scratch.gemm there).
  template <typename P>
  void run(const P& p, const char* op, const char* cpu_scratch = nullptr);
  void copy(void* dst, const void* src, int64_t bytes);
  // Host ids to the device: through pinned staging on a GPU, so the copy
  // never makes the host wait for the stream (memory::HostStaging).
  void upload(void* dst, const void* src, int64_t bytes);
  // Sequence parallelism: norm regions hold a contiguous 1/tp of the B*T rows.
  // gathered: this rank's rows -> all rows in `all` (the rows themselves
  // without sp). reduce_rows: a row-parallel output summed over tp, in place:
  // all-reduced, or reduce-scattered so this rank's rows come first.
  const Elem* gathered(const Elem* rows, Elem* all);
  void reduce_rows(Elem* buf);
  // The backward's tensor-parallel collectives that run beside its GEMMs,
  // on tp_beside() (Megatron's order): a column-parallel layer's input,
  // re-gathered for its weight gradients (or its kept FP8 codes restored)
  // while the GEMMs before them run, and the input gradient's reduce_rows
  // begun before the weight gradients and waited for after them.
  struct InputGather {
    std::unique_ptr<parallel::CommRequest> pending;
    const Elem* x = nullptr;        // the input, once end_input returns
    const Fp8Kept* kept = nullptr;  // or the kept codes the weight gradients read
    int64_t K = 0;
  };
  InputGather begin_input(const Elem* rows, Elem* all, const Fp8Kept& kept);
  const Elem* end_input(InputGather& g);  // null where the kept codes serve
  std::unique_ptr<parallel::CommRequest> begin_reduce_rows(Elem* buf);
  // Instance of saved tensor `name` for (slot, layer), or its recompute instance.
  int64_t instance(const char* name, int64_t slot, int64_t layer) const;

  ModelSpec m_;
  RunSpec run_;
  Layout l_;
  memory::StagePlan plan_;
  StageParams params_;
  parallel::ProcessGroups& groups_;
  std::unique_ptr<TensorTable> table_;
  kernels::Stream stream_;
  std::unique_ptr<memory::HostStaging> staging_;  // GPU only
  Elem* weights_ = nullptr;
  G* grads_ = nullptr;
  Elem* frozen_ = nullptr;  // LoRA's base weights (weights.frozen)
  bool dropout_on_ = false;
  uint64_t dropout_key_ = 0;
  std::vector<int64_t> slot_first_sample_;  // per activation slot (set_samples)
  // drop(x) of linear g of block b into scratch.lora_dropped, or into
  // `out` (write: accumulate adds it).
  void lora_drop(const Block& b, Linear g, const Elem* x, int64_t cols, Elem* out, kernels::Write write);
  double loss_host_ = 0;      // CPU: the loss sum since take_loss()
  double aux_host_ = 0;       // the balancing loss sum since take_aux_loss()
  std::vector<int64_t> load_;  // (model layers) x E: tokens per expert since take_expert_load()
  std::vector<double> dispatch_peaks_;  // (E + 1), since take_dispatch_peaks()
  std::vector<int64_t> dropped_;  // (model layers): choices a capacity dropped since take_dropped()
  std::optional<MoeOverflow> moe_overflow_;  // since take_moe_overflow()
  double received_peak_ = 0;                 // since take_received_peak()
  // The chunk's forward's drops, counted in dropped_ at its end if it trains.
  std::vector<int64_t> dropped_pending_;
  // The global balancing loss's statistics (2 E per slot; moe_stats_travel).
  std::vector<double> moe_in_, moe_out_, moe_totals_, moe_totals_out_;
  std::vector<double> slot_scale_;  // the grad_scale of each slot's forward (MoE: the balancing loss's)
  A* loss_device_ = nullptr;  // GPU: per-token losses summed since take_loss()
  // ZeRO-2: each parameter group's gradient of a micro-batch is built in the
  // bucket, reduce-scattered over dp and added into this rank's shard
  // [shard_lo_, shard_hi_) of the flat gradients.
  bool zero2_ = false;
  // ZeRO-0 over dp > 1: gradients all-reduced group by group in the final backwards.
  bool overlap_dp_ = false;
  // ZeRO-1 over dp > 1: each group's gradient reduce-scattered in the final
  // backwards into this rank's shard, dp_shard_ (its range of grads_).
  bool scatter_dp_ = false;
  G* dp_shard_ = nullptr;
  bool final_ = false;
  bool reduced_ = false;  // this step's gradients were reduced over dp (see grads_reduced())
  bool replicas_reduced_ = false;
  // Hybrid sharding under ZeRO-1: the last group's reduce-scatter, whose
  // piece of the shard (scatter_piece_, scatter_count_ elements) is
  // all-reduced over the replicas once it lands (settle_scatter()).
  std::unique_ptr<parallel::CommRequest> scatter_pending_;
  G* scatter_piece_ = nullptr;
  int64_t scatter_flat_ = 0, scatter_count_ = 0;  // the piece's place in the flat gradients, and size
  void settle_scatter();
  // reduce_replicas, started (dp_pending_ waits for it).
  void reduce_over_replicas(G* piece, int64_t flat, int64_t n);
  std::vector<std::unique_ptr<parallel::CommRequest>> dp_pending_;
  // ZeRO-2's two buckets: the first holds the largest group, the second a
  // block's. A group is built in the bucket the group before did not use,
  // where it fits, while that one's reduce-scatter runs beside its backward;
  // the result is added to the shard when the bucket is next needed.
  struct Bucket {
    G* data = nullptr;
    int64_t elements = 0;
    std::unique_ptr<parallel::CommRequest> pending;  // its reduce-scatter in flight
    G* own = nullptr;  // where this rank's part of the sum lands
    // Where the consecutive pieces of that part go in the shard: (offset, size).
    std::vector<std::pair<int64_t, int64_t>> pieces;
    bool last = false;  // built in the step's final backward of its chunk: the pieces are then final
  };
  std::array<Bucket, 2> buckets_;
  int building_ = -1, built_ = -1;  // the bucket of the group being built, and of the last one
  void drain(Bucket& b);           // waits for its reduce-scatter and adds the sum to the shard
  // The group being back-propagated: ascending ranges of the flat
  // parameters, one except under ZeRO-2 with the head tied to the embedding
  // on this stage (the table, then the final norm: one reduction).
  struct Range {
    int64_t begin = 0, end = 0;
    bool operator==(const Range&) const = default;
  };
  std::vector<Range> group_;
  // Expert parallelism: the flat ranges of each MoE block's routed experts
  // (the ones this rank holds), ascending.
  std::vector<Range> expert_ranges_;
  // f(offset, count) for each part of [flat, flat + n) outside
  // expert_ranges_, offsets from flat.
  template <typename F>
  void for_each_non_expert(int64_t flat, int64_t n, F f) const;
  // ZeRO-3: the weights live in shards; a group's are all-gathered over dp
  // into one of two buffers before it computes, in the forward and again in
  // the backward of every micro-batch, and the next block's are gathered
  // into the other buffer while this one computes (on NCCL's stream beside
  // the compute stream; MPI completes it at once).
  bool zero3_ = false;
  struct Gathered {
    Elem* data = nullptr;
    int64_t elements = 0;
    std::vector<Range> ranges;  // the group it holds (empty: none)
    // A prefetch in flight into it: waited for before the group computes or
    // the buffer is gathered into again.
    std::vector<std::unique_ptr<parallel::CommRequest>> pending;
  };
  std::array<Gathered, 2> gathered_;
  int in_use_ = -1;  // the buffer of the group computing now
  Elem* weight_at(int64_t flat);
  // Makes the weights of `ranges` (a group) available; `next`: into the
  // buffer not in use, without making it the one in use (a prefetch).
  void gather(std::initializer_list<Range> ranges, bool next = false);
  void gather_block(int64_t chunk, int64_t layer, bool next = false);
  void gather_head();
  Range block_range(int64_t chunk, int64_t layer) const;
  int64_t shard_lo_ = 0, shard_hi_ = 0;  // ZeRO-1, -2 and -3: this rank's shard
  std::optional<memory::DenseSplit> split_;
  std::vector<int64_t> shard_counts_;     // every dp rank's shard size
  G* grad_at(int64_t flat);
  // The part of `ranges` (ascending) in each dp rank's shard, and (the
  // current group of one range) where this rank's part starts in a
  // shard-sized buffer.
  std::vector<int64_t> shard_parts(std::span<const Range> ranges) const;
  int64_t group_shard_offset() const;
  void group_begin(std::initializer_list<Range> ranges);
  void group_end();
  // FP8 state (Layout::fp8; all empty when off).
  std::array<memory::Fp8GemmShape, memory::kFp8Gemms> fp8_shapes_{};
  Elem* fp8_weights_ = nullptr;  // quantised weights of the stage's FP8 GEMMs, kept for the step
  std::vector<int64_t> fp8_weight_at_;  // per (block, gemm): offset in fp8_weights_ (-1: none)
  std::vector<char> fp8_weight_ready_;  // per (block, gemm): quantised since fp8_step_begin()
  Elem* fp8_weight_scratch_ = nullptr;  // ZeRO-3: quantised at each use
  Elem* fp8_input_ = nullptr;
  Elem* fp8_grad_ = nullptr;
  // The operands fp8_input_ and fp8_grad_ hold the quantisation of (the
  // input's: x, or the kept codes it was restored from).
  const void* fp8_input_of_ = nullptr;
  // The kept codes fp8_restore_end just restored, for the next weight
  // gradient that reads them.
  const void* fp8_restored_ = nullptr;
  const Elem* fp8_grad_of_ = nullptr;
  bool fp8_input_over_tokens_ = false, fp8_grad_over_tokens_ = false;  // their tiles (block scaling)
  // Delayed scaling, per (block, gemm, role) and in an MoE model per (block,
  // expert, gemm, role) after them: the amax history (a ring of
  // kFp8DelayedHistory, filled `fp8_history_len_` deep), the step's amax and
  // the step's scale, in the arena's fp8.scaling (on the CPU).
  float* fp8_scaling_ = nullptr;
  int64_t fp8_slots_per_block_ = 0;  // memory::fp8_delayed_slots_per_block
  int64_t fp8_history_len_ = 0, fp8_history_next_ = 0;
  // GPU (bf16): FP8 codes, [0] as cast and [1] transposed (the TN GEMMs'
  // layouts, kernels/fp8/fp8_ops.h), of the cached weights, ZeRO-3's weight
  // scratch, the input and the output gradient.
  std::array<kernels::Fp8*, 2> fp8_wcodes_{}, fp8_wscratch_{}, fp8_in_{}, fp8_gr_{};
  // The scaling slots the input's and output gradient's codes were cast with.
  int64_t fp8_in_slot_ = -1, fp8_gr_slot_ = -1;
  // The weight gradient's input operand: the transposed codes (K, M) with
  // row stride fp8_in_ld_, and their scale_inv (device memory): fp8_in_[1]
  // and the slot's as cast, or kept codes restored.
  const kernels::Fp8* fp8_in_t_ = nullptr;
  const float* fp8_in_scale_inv_ = nullptr;
  int64_t fp8_in_ld_ = 0;
  // Block scaling on a GPU: the tile scale_invs beside fp8_in_ and fp8_gr_
  // ([0] the operand's, [1] its transpose's), the cached weights' (their two
  // arrays at fp8_wscale_at_ per (block, gemm) in fp8_wscales_) and ZeRO-3's
  // scratch's.
  std::array<float*, 2> fp8_in_scales_{}, fp8_gr_scales_{}, fp8_wscratch_scales_{};
  float* fp8_wscales_ = nullptr;
  std::vector<int64_t> fp8_wscale_at_;
  // GPU scaling state in fp8.scaling, per slot s = role * (blocks * 7) +
  // block * 7 + gemm (so each format's slots are contiguous for one scale
  // update): the amax history (newest first, fp8_dev_history_ deep: 1 for
  // tensorwise), the amax, the scale and, 16-byte aligned, its inverse
  // (fp8_scale_inv); and the step's health counts (fp8.health).
  float *fp8_dev_hist_ = nullptr, *fp8_dev_amax_ = nullptr, *fp8_dev_scale_ = nullptr, *fp8_dev_scale_inv_ = nullptr;
  int64_t fp8_dev_history_ = 0;
  kernels::Fp8Health* fp8_dev_health_ = nullptr;
  float* fp8_dev_first_ = nullptr;  // delayed scaling's first step: a tensor's amax and a one-deep history
  Fp8Counts fp8_counts_;
  // Each sender of an MoE block's rows (ExpertRun::source): its dp rank
  // (the micro-batch: moe_fp8_rows' scales), cp rank and tp rank, 0 without
  // sp (moe_token_tiles); learnt on first use (moe_senders).
  std::vector<moe_rows::TokenSender> moe_senders_;
  std::vector<Elem>* capture_ = nullptr;
  // Per saved tensor name: the instance of each layer (-1: rebuilt), and how
  // many layers keep it.
  struct SavedIndex {
    std::vector<int64_t> of_layer;
    int64_t saving = 0;
    bool rebuilt = false;  // its last instance is the copy a recomputing layer rebuilds
  };
  std::vector<std::pair<std::string, SavedIndex>> saved_;
  int64_t M_ = 0;    // rows of a micro-batch: B * T
  int64_t Msp_ = 0;  // rows of the norm regions on this rank: M_ / tp under sp
  // The stage's block index of each chunk's first block (vpp + 1 entries):
  // chunk c holds blocks [chunk_begin_[c], chunk_begin_[c + 1]).
  std::vector<int64_t> chunk_begin_;
  int64_t chunk_layers(int64_t chunk) const { return chunk_begin_[size_t(chunk + 1)] - chunk_begin_[size_t(chunk)]; }
  // The chunk of the stage's block `local`.
  int64_t chunk_of(int64_t local) const;
};

// InputError naming what an MoE model's training does not compute yet under
// the layout and run (nothing for a dense model), on either device:
// llama_moe.cpp.
void require_moe_layout(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device);

extern template class LlamaStage<float>;
extern template class LlamaStage<double>;
extern template class LlamaStage<kernels::bf16>;
extern template class LlamaStage<kernels::bf16, kernels::bf16>;

}  // namespace weft::trainer
