// LlamaStage's last stage: the final norm, the vocab-parallel LM head and
// the fused loss (forward and backward), and the loss sum the host reads.
#include <utility>
#include <vector>

#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/gemm.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using kernels::Write;

template <typename Elem, typename G>
void LlamaStage<Elem, G>::head_forward(int64_t slot, const int32_t* targets, double grad_scale) {
  (void)slot;
  const int64_t C = m_.hidden, Vl = m_.padded_vocab(l_.tp) / l_.tp;
  parallel::Comm& tp = *groups_.tp;
  const auto& head = params_.model(ParamKind::lm_head);
  const auto& fnorm = params_.model(ParamKind::final_norm);
  Elem* x = table_->get<Elem>("final_norm.input");
  Elem* y = table_->get<Elem>("final_norm.output");
  A* rstd = table_->get<A>("final_norm.rstd");
  A* xhat = table_->has("final_norm.normed_fp32") ? table_->get<A>("final_norm.normed_fp32") : nullptr;
  norm_forward(x, nullptr, nullptr, weight(fnorm), y, rstd, xhat);
  Elem* logits = table_->get<Elem>("head.logits");
  const Elem* y_all = gathered(y, l_.sp ? table_->get<Elem>("comm.sp_gather") : nullptr);
  run(kernels::linear_forward_gemm(M_, C, Vl, y_all, weight(head), logits), "gemm head");
  if (capture_) {
    capture_->resize(size_t(M_ * Vl));
    copy(capture_->data(), logits, M_ * Vl * int64_t(sizeof(Elem)));
    memory::synchronize(stream_);
  }

  int32_t* tgt = table_->get<int32_t>("loss.targets");
  upload(tgt, targets, M_ * int64_t(sizeof(int32_t)));
  A* row_max = table_->get<A>("loss.row_max");
  A* sum_exp = table_->get<A>("loss.row_sumexp");
  A* loss = table_->get<A>("loss.per_token");
  // Columns past V pad the vocabulary for tp: no probability (cross_entropy.h).
  const int64_t vocab_start = groups_.tp_rank() * Vl, valid = kernels::valid_columns(m_.vocab, vocab_start, Vl);
  run(kernels::CrossEntropyMaxParams<Elem>{.rows = M_, .V_local = Vl, .logits = logits, .row_max = row_max,
                                           .valid = valid},
      "cross_entropy_max");
  tp.all_reduce(row_max, M_, parallel::ReduceOp::max);
  run(kernels::CrossEntropySumExpParams<Elem>{.rows = M_, .V_local = Vl, .logits = logits,
                                              .row_max = row_max, .sum_exp = sum_exp, .valid = valid},
      "cross_entropy_sumexp");
  tp.all_reduce(sum_exp, M_);
  run(kernels::CrossEntropyLossGradParams<Elem>{.rows = M_, .V = m_.vocab,
                                                .vocab_start = vocab_start,
                                                .V_local = Vl, .logits = logits, .targets = tgt,
                                                .row_max = row_max, .sum_exp = sum_exp,
                                                .loss = loss, .grad_scale = grad_scale,
                                                .ids_checked = on_device()},
      "cross_entropy_loss_grad");
  if (loss_device_) {  // summed on the device, read once per step
    run(kernels::AxpyParams<A>{.n = M_, .alpha = 1.0, .x = loss, .y = loss_device_}, "axpy");
    return;
  }
  double s = 0;
  for (int64_t i = 0; i < M_; ++i) s += double(loss[i]);
  loss_host_ += s;
}

template <typename Elem, typename G>
double LlamaStage<Elem, G>::take_loss() {
  if (!loss_device_) return std::exchange(loss_host_, 0.0);
  std::vector<A> host(static_cast<size_t>(M_));
  copy(host.data(), loss_device_, M_ * int64_t(sizeof(A)));
  memory::synchronize(stream_);
  run(kernels::FillParams<A>{.n = M_, .value = 0.0, .x = loss_device_}, "fill");
  double s = 0;
  for (A v : host) s += double(v);
  return s;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::head_backward(Elem* dx) {
  const int64_t C = m_.hidden, Vl = m_.padded_vocab(l_.tp) / l_.tp;
  const auto& head = params_.model(ParamKind::lm_head);
  const auto& fnorm = params_.model(ParamKind::final_norm);
  // The final norm and the head are the last parameters of the stage, one
  // gradient group; a head tied to the embedding on this stage is the first
  // parameter instead. Its gradient is complete only after the embedding's
  // backward, so it joins the embedding's group, except under ZeRO-2, where
  // each micro-batch's part is reduced on its own: there the group is the
  // table and the final norm.
  // Under LoRA both are frozen: no group, no weight gradients.
  const bool frozen = params_.lora.enabled();
  if (frozen)
    ;
  else if (zero2_ && params_.head_is_embedding)
    group_begin({{head.offset, head.offset + head.local_elements()}, {fnorm.offset, params_.elements}});
  else
    group_begin({{fnorm.offset, params_.elements}});
  Elem* dlogits = table_->get<Elem>("head.logits");
  Elem* y = table_->get<Elem>("final_norm.output");
  Elem* d_norm = table_->get<Elem>("scratch.d_norm");
  run(kernels::linear_dgrad_gemm(M_, C, Vl, dlogits, weight(head), d_norm), "gemm head dgrad");
  const Elem* y_all = gathered(y, l_.sp ? table_->get<Elem>("comm.sp_gather") : nullptr);
  if (!frozen) run(kernels::linear_wgrad_gemm(M_, C, Vl, dlogits, y_all, grad(head)), "gemm head wgrad");
  reduce_rows(d_norm);
  A* xhat = table_->has("final_norm.normed_fp32") ? table_->get<A>("final_norm.normed_fp32") : nullptr;
  norm_backward(table_->get<Elem>("final_norm.input"), xhat, table_->get<A>("final_norm.rstd"),
                weight(fnorm), d_norm, dx, Write::overwrite, grad(fnorm));
  if (!frozen) group_end();
}

#define WEFT_LLAMA_HEAD(E, G)                                                  \
  template void LlamaStage<E, G>::head_forward(int64_t, const int32_t*, double); \
  template double LlamaStage<E, G>::take_loss();                               \
  template void LlamaStage<E, G>::head_backward(E*);
WEFT_LLAMA_HEAD(float, float)
WEFT_LLAMA_HEAD(double, double)
WEFT_LLAMA_HEAD(kernels::bf16, float)
WEFT_LLAMA_HEAD(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_HEAD

}  // namespace weft::trainer
