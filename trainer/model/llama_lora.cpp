// LoRA adapters of the blocks' linear layers (RunSpec::lora). Layer g's
// output gains s (x A^T) B^T with s = alpha / r, A (r, K) and B (N, r) in the
// layer's local shapes (params.cpp shards them with the base layer). Two
// GEMMs forward (h = x A^T, then y += s h B^T) and four backward:
//   g  = s dY B          (M, r)
//   dx += g A            the adapters' part of the input gradient
//   dA += g^T x
//   h  = x A^T           rebuilt rather than saved: an r-th of the base GEMM
//   dB += s dY^T h
// With dropout (training only) the adapters read drop(x) instead of x,
// drop(x) = mask * x / (1 - p) with a mask every layout draws alike
// (kernels/dropout), rebuilt in the backward, where the adapters' part of
// the input gradient goes back through the same mask.
// Under tensor parallelism every product stays local: a column-parallel
// layer's dY holds this rank's outputs, so g, dx and dA are partial sums
// over tp (dx is reduced with the base layer's, dA in
// reduce_replicated_grads); a row-parallel layer's x holds this rank's
// inputs, so h and the output are partial sums (the output is reduced with
// the base layer's, dB in reduce_replicated_grads) while dY is whole.
#include "core/hash.h"
#include "kernels/dropout/dropout.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using kernels::Write;

template <typename Elem, typename G>
void LlamaStage<Elem, G>::set_samples(int64_t slot, int64_t first_sample) {
  if (slot_first_sample_.size() <= size_t(slot)) slot_first_sample_.resize(size_t(slot) + 1, 0);
  slot_first_sample_[size_t(slot)] = first_sample;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::lora_drop(const Block& b, Linear g, const Elem* x, int64_t cols, Elem* out, Write write) {
  const bool column = column_parallel(g);
  const int64_t layer = memory::global_layer(m_, l_, plan_.stage, chunk_of(b.index), b.index - chunk_begin_[size_t(chunk_of(b.index))]);
  const int64_t cp = std::max<int64_t>(l_.cp, 1);
  // The slot's first sample (set_samples): what makes every layout draw the same mask.
  WEFT_ASSERT(size_t(b.slot) < slot_first_sample_.size());
  run(kernels::DropoutParams<Elem>{
          .rows = M_, .cols = cols, .p = params_.lora.dropout,
          .key = splitmix64(dropout_key_ + uint64_t(layer) * kLinears + uint64_t(g)),
          .first_sample = slot_first_sample_[size_t(b.slot)],
          .seq = run_.seq, .local_seq = run_.seq / cp, .cp = cp, .cp_rank = groups_.cp ? groups_.cp->rank() : 0,
          .col_offset = column ? 0 : groups_.tp_rank() * cols, .full_cols = column ? cols : cols * l_.tp,
          .x = x, .y = out, .write = write},
      "lora dropout");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::lora_forward(const Block& b, Linear g, const Elem* x, Elem* y, int64_t K, int64_t N) {
  const Elem* a = b.lora_a[size_t(g)];
  if (!a) return;
  if (K == 0) K = fp8_shapes_[size_t(g)].K;
  if (N == 0) N = fp8_shapes_[size_t(g)].N;
  const int64_t r = params_.lora.rank;
  Elem* h = table_->get<Elem>("scratch.lora", 0);
  if (dropout_on_ && params_.lora.dropout > 0) {
    Elem* dropped = table_->get<Elem>("scratch.lora_dropped");
    lora_drop(b, g, x, K, dropped, Write::overwrite);
    x = dropped;
  }
  run(kernels::linear_forward_gemm(M_, K, r, x, a, h), "gemm lora_a");
  auto up = kernels::linear_forward_gemm(M_, r, N, static_cast<const Elem*>(h), b.lora_b[size_t(g)], y,
                                         Write::accumulate);
  up.alpha = A(params_.lora.scale());
  run(up, "gemm lora_b");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::lora_backward(const Block& b, Linear g, const Elem* dy, const Elem* x, Elem* dx, int64_t K,
                                        int64_t N) {
  const Elem* a = b.lora_a[size_t(g)];
  if (!a) return;
  const Elem* bw = b.lora_b[size_t(g)];
  if (K == 0) K = fp8_shapes_[size_t(g)].K;
  if (N == 0) N = fp8_shapes_[size_t(g)].N;
  const int64_t r = params_.lora.rank;
  const A s = A(params_.lora.scale());
  Elem* h = table_->get<Elem>("scratch.lora", 0);
  Elem* gr = table_->get<Elem>("scratch.lora", 1);
  auto down = kernels::linear_dgrad_gemm(M_, r, N, dy, bw, gr);
  down.alpha = s;
  run(down, "gemm lora_b dgrad");
  // With dropout the adapters saw drop(x): rebuilt with the forward's mask,
  // and the input gradient goes back through the same mask.
  const bool drop = dropout_on_ && params_.lora.dropout > 0;
  Elem* dropped = drop ? table_->get<Elem>("scratch.lora_dropped") : nullptr;
  if (drop) {
    lora_drop(b, g, x, K, dropped, Write::overwrite);
    x = dropped;
  } else {
    run(kernels::linear_dgrad_gemm(M_, K, r, static_cast<const Elem*>(gr), a, dx, Write::accumulate),
        "gemm lora_a dgrad");
  }
  run(kernels::linear_wgrad_gemm(M_, K, r, static_cast<const Elem*>(gr), x, b.lora_ga[size_t(g)]),
      "gemm lora_a wgrad");
  run(kernels::linear_forward_gemm(M_, K, r, x, a, h), "gemm lora_a");
  auto wb = kernels::linear_wgrad_gemm(M_, r, N, dy, static_cast<const Elem*>(h), b.lora_gb[size_t(g)]);
  wb.alpha = s;
  run(wb, "gemm lora_b wgrad");
  if (drop) {
    run(kernels::linear_dgrad_gemm(M_, K, r, static_cast<const Elem*>(gr), a, dropped), "gemm lora_a dgrad");
    lora_drop(b, g, dropped, K, dx, Write::accumulate);
  }
}

#define WEFT_LLAMA_LORA(E, G)                                                               \
  template void LlamaStage<E, G>::lora_forward(const Block&, Linear, const E*, E*, int64_t, int64_t);            \
  template void LlamaStage<E, G>::lora_backward(const Block&, Linear, const E*, const E*, E*, int64_t, int64_t); \
  template void LlamaStage<E, G>::set_samples(int64_t, int64_t);                                    \
  template void LlamaStage<E, G>::lora_drop(const Block&, Linear, const E*, int64_t, E*, Write);
WEFT_LLAMA_LORA(float, float)
WEFT_LLAMA_LORA(double, double)
WEFT_LLAMA_LORA(kernels::bf16, float)
WEFT_LLAMA_LORA(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_LORA

}  // namespace weft::trainer
