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
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/device_spec.h"
#include "kernels/kernel.h"
#include "memory/arena.h"
#include "trainer/model/params.h"
#include "trainer/model/tensor_table.h"
#include "trainer/parallel/process_groups.h"

namespace weft::trainer {

template <typename Elem>
class LlamaStage {
 public:
  using A = kernels::Acc<Elem>;

  LlamaStage(const ModelSpec& m, const RunSpec& run, const Layout& l, int64_t stage,
             const DeviceSpec& device, memory::Arena& arena, parallel::ProcessGroups& groups);
  ~LlamaStage();

  const ModelSpec& model() const { return m_; }
  const Layout& layout() const { return l_; }
  const memory::StagePlan& plan() const { return plan_; }
  const StageParams& params() const { return params_; }
  parallel::ProcessGroups& groups() { return groups_; }
  TensorTable& tensors() { return *table_; }
  Elem* weights() { return weights_; }
  Elem* grads() { return grads_; }
  int64_t param_elements() const { return params_.elements; }
  Elem* weight(const ParamSpec& p) { return weights_ + p.offset; }
  // Under ZeRO-2 a parameter's gradient exists only while its group is in the
  // bucket (during that group's backward); grads() is then this rank's shard.
  Elem* grad(const ParamSpec& p) { return grad_at(p.offset); }
  bool grads_sharded() const { return zero2_; }

  // Layout-independent initialisation from the seed (params.h).
  void init_weights(uint64_t seed);
  void zero_grads();

  // Forward of one micro-batch of B sequences into in-flight slot `slot`.
  // The first stage embeds tokens (B*T); the last computes the loss against
  // targets (B*T), leaves the gradient of loss * grad_scale over its logits,
  // and returns the sum of this rank's per-token losses (summed over tp it
  // is the micro-batch's total loss). Other stages return 0.
  // With interleaved pipelining (vpp > 1) a stage runs one model chunk at a
  // time: chunk c holds the stage's blocks of virtual stage c * pp + stage;
  // the first chunk of stage 0 embeds, the last chunk of the last stage ends
  // in the loss. Slots then hold chunk-micro-batches.
  double forward(int64_t slot, const int32_t* tokens, const int32_t* targets, double grad_scale,
                 int64_t chunk = 0);
  // Backward of the micro-batch (chunk) in `slot`, accumulating parameter gradients.
  void backward(int64_t slot, int64_t chunk = 0);

  // Sums the gradients of tp-replicated parameters (the norms) over the tp
  // group where sequence parallelism split their rows; call after the last
  // backward of a step.
  void reduce_replicated_grads();
  // Tied embeddings across pipeline stages: the first stage's embedding and
  // the last stage's head copy get the sum of both gradients, so the two
  // copies take identical updates. Call after the last backward of a step.
  void sync_tied_grads();

  // Pipeline boundaries: a non-first stage's input activations, and a
  // non-last stage's output activations and their gradient, (B, T_sp, C)
  // with T_sp = T / tp under sequence parallelism.
  int64_t boundary_elements() const { return Msp_ * m_.hidden; }
  Elem* stage_input(int64_t slot);
  Elem* stage_output();
  Elem* output_grad();
  Elem* input_grad();

  // Copies the logits (B*T, V/tp) of each forward, before the loss overwrites
  // them with their gradient (reference tests).
  void capture_logits(std::vector<Elem>* out) { capture_ = out; }

 private:
  struct Block;  // pointers to one block's tensors for one slot
  Block block(int64_t slot, int64_t chunk, int64_t layer);
  Checkpointing mode(int64_t layer) const;
  void block_forward(const Block& b, Elem* x_out, bool recompute);
  void block_recompute(const Block& b);
  void block_backward(const Block& b, Elem* dx);
  void norm_forward(const Elem* x, const Elem* residual, Elem* sum, const Elem* w, Elem* y, A* rstd,
                    A* x_hat);
  void norm_backward(const Elem* x, const A* x_hat, const A* rstd, const Elem* w, const Elem* dy,
                     Elem* dx, kernels::Write write, Elem* dw);
  void head_forward(int64_t slot, const int32_t* targets, double grad_scale, double* loss_sum);
  void head_backward(Elem* dx);
  kernels::Workspace scratch(const char* name, int64_t need);
  // Sequence parallelism: norm regions hold a contiguous 1/tp of the B*T rows.
  // gathered: this rank's rows -> all rows in `all` (the rows themselves
  // without sp). reduce_rows: a row-parallel output summed over tp, in place:
  // all-reduced, or reduce-scattered so this rank's rows come first.
  const Elem* gathered(const Elem* rows, Elem* all);
  void reduce_rows(Elem* buf);
  // Instance of saved tensor `name` for (slot, layer), or its recompute instance.
  int64_t instance(const char* name, int64_t slot, int64_t layer) const;

  ModelSpec m_;
  RunSpec run_;
  Layout l_;
  memory::StagePlan plan_;
  StageParams params_;
  parallel::ProcessGroups& groups_;
  std::unique_ptr<TensorTable> table_;
  Elem* weights_ = nullptr;
  Elem* grads_ = nullptr;
  // ZeRO-2: each parameter group's gradient of a micro-batch is built in the
  // bucket, reduce-scattered over dp and added into this rank's shard
  // [shard_lo_, shard_hi_) of the flat gradients.
  bool zero2_ = false;
  Elem* bucket_ = nullptr;
  int64_t bucket_elements_ = 0;
  int64_t group_begin_ = 0, group_end_ = 0;
  int64_t shard_lo_ = 0, shard_hi_ = 0;
  std::vector<int64_t> shard_counts_;
  Elem* grad_at(int64_t flat);
  void group_begin(int64_t begin, int64_t end);
  void group_end();
  std::vector<Elem>* capture_ = nullptr;
  // Per saved tensor name: the instance of each layer (-1: rebuilt), and how
  // many layers keep it.
  struct SavedIndex {
    std::vector<int64_t> of_layer;
    int64_t saving = 0;
  };
  std::vector<std::pair<std::string, SavedIndex>> saved_;
  int64_t M_ = 0;    // rows of a micro-batch: B * T
  int64_t Msp_ = 0;  // rows of the norm regions on this rank: M_ / tp under sp
  int64_t Lc_ = 0;   // blocks per model chunk: the stage's blocks / vpp
};

extern template class LlamaStage<float>;
extern template class LlamaStage<double>;

}  // namespace weft::trainer
