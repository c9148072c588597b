// adamw: torch.optim.AdamW over many tensors in one launch.
//
// For each element, with g = grad * grad_scale and t = step:
//   param *= 1 - lr * weight_decay          (decoupled; only tensors that decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2
//   param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// in PyTorch's order of operations, so fp32 runs track torch to rounding.
// grad_scale folds gradient clipping (and loss-scale division) into the
// update instead of a separate pass over the gradients.
//
// Mixed precision: moments and the master weights are in Acc, gradients in
// G: by default Acc too, or bf16 (grad:bf16, the CUDA backend only), each
// widened to fp32 as it is read. For fp32 and fp64 the weights are their own
// master (master is nullptr); for bf16 the update runs on the fp32 master and
// param receives its rounding (to nearest even) in the same pass, so the bf16
// compute copy never needs a separate cast over the parameters.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/kernel.h"

namespace weft::kernels {

enum class WeightDecay { skip, apply };  // norms and (by convention) embeddings skip

template <typename Elem, typename G = Acc<Elem>>
struct AdamwTensor {
  Elem* param = nullptr;            // (n) the weights the model computes with
  Acc<Elem>* master = nullptr;      // (n) required exactly when Elem is narrower than Acc
  const G* grad = nullptr;          // (n)
  Acc<Elem>* m = nullptr;           // (n) first moment
  Acc<Elem>* v = nullptr;           // (n) second moment
  int64_t n = 0;
  WeightDecay decay = WeightDecay::apply;
};

template <typename Elem, typename G = Acc<Elem>>
struct AdamwParams {
  std::span<const AdamwTensor<Elem, G>> tensors;
  int64_t step = 1;  // 1-based count of updates including this one (bias correction)
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double grad_scale = 1.0;
};

template <typename Elem, typename G>
bool supports(const AdamwParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
int64_t workspace_bytes(const AdamwParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
Status launch(const AdamwParams<Elem, G>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
