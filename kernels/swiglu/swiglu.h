// swiglu: the Llama MLP activation act = silu(gate) * up, silu(g) = g * sigmoid(g).
//
// rows = B * T tokens; F is the (tensor-parallel local) intermediate size.
//
// With a row scale w (an MoE expert's rows, each with its token's combine
// weight: Megatron-Core's weighted SwiGLU) act = w_r * silu(gate) * up, so
// the weight multiplies the expert's output through the down projection and
// the combine is a plain sum; nothing of the output needs keeping for the
// weight's gradient, which the backward takes from the activation:
// dw_r = sum_f dact * silu(gate) * up.
#pragma once

#include <cstdint>

#include "kernels/kernel.h"

namespace weft::kernels {

template <typename Elem>
struct SwigluForwardParams {
  int64_t rows = 0;
  int64_t F = 0;
  const Elem* gate = nullptr;  // (rows, F)
  const Elem* up = nullptr;    // (rows, F)
  Elem* act = nullptr;         // (rows, F)
  const Acc<Elem>* row_scale = nullptr;  // (rows), or null: no scale
};

// dgate and dup are overwritten; they may alias gate and up (each element is
// read before it is written), so the backward can run in the forward's buffers.
template <typename Elem>
struct SwigluBackwardParams {
  int64_t rows = 0;
  int64_t F = 0;
  const Elem* gate = nullptr;  // (rows, F)
  const Elem* up = nullptr;    // (rows, F)
  const Elem* dact = nullptr;  // (rows, F)
  Elem* dgate = nullptr;       // (rows, F)
  Elem* dup = nullptr;         // (rows, F)
  const Acc<Elem>* row_scale = nullptr;  // (rows) the forward's, or null
  // (rows) overwritten with each row's dw; only with row_scale, may be null.
  // Each row's sum runs over F in order, whatever the thread count.
  Acc<Elem>* drow_scale = nullptr;
};

template <typename Elem>
bool supports(const SwigluForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const SwigluForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const SwigluForwardParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const SwigluBackwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const SwigluBackwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const SwigluBackwardParams<Elem>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
