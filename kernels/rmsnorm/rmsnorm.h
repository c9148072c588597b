// rmsnorm: Hugging Face LlamaRMSNorm, y = w * (x * rstd) with
// rstd = 1 / sqrt(mean(x^2) + eps) per row of C, computed in Acc.
//
// Two forms, chosen by the layout's norm knob (weft::NormKind):
//   fused    one pass per row; keeps x and rstd (rows) for the backward.
//            It can also add a residual first and write the sum (the next
//            residual stream), saving a separate add and a read.
//   unfused  a composition of separate simple ops, as an eager framework
//            runs it; keeps rstd and the normalised x_hat (rows, C) in Acc,
//            which the memory model counts.
// In both backwards dweight accumulates (over rows and micro-batches) in the
// gradient type G: by default Acc, the main-gradient type (fp32 under bf16
// compute, so a norm weight's gradient is not rounded to bf16 once per
// micro-batch); with bf16 gradients (grad:bf16, the CUDA backend only) the
// sum over rows is taken in fp32 and added to dweight with one rounding per
// launch. dx is overwritten or, with Write::accumulate, added to the
// residual stream's gradient.
//
// rows = B * T, or B * T / tp of a sequence-parallel shard.
#pragma once

#include <cstdint>

#include "kernels/kernel.h"

namespace weft::kernels {

template <typename Elem>
struct RmsnormForwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  double eps = 1e-6;
  const Elem* x = nullptr;         // (rows, C)
  const Elem* residual = nullptr;  // (rows, C) optional: normalise x + residual instead of x
  Elem* sum = nullptr;             // (rows, C) x + residual, required with residual; may alias either
  const Elem* weight = nullptr;    // (C)
  Elem* y = nullptr;               // (rows, C)
  Acc<Elem>* rstd = nullptr;       // (rows) saved for the backward
};

template <typename Elem, typename G = Acc<Elem>>
struct RmsnormBackwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  const Elem* x = nullptr;          // (rows, C) the forward's normalised input (the sum when fused)
  const Elem* weight = nullptr;     // (C)
  const Acc<Elem>* rstd = nullptr;  // (rows)
  const Elem* dy = nullptr;         // (rows, C)
  Elem* dx = nullptr;               // (rows, C)
  Write dx_write = Write::overwrite;
  G* dweight = nullptr;  // (C) accumulated; null: a frozen weight, none computed
};

template <typename Elem>
struct RmsnormUnfusedForwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  double eps = 1e-6;
  const Elem* x = nullptr;       // (rows, C)
  const Elem* weight = nullptr;  // (C)
  Elem* y = nullptr;             // (rows, C)
  Acc<Elem>* rstd = nullptr;     // (rows) kept
  Acc<Elem>* x_hat = nullptr;    // (rows, C) x * rstd, kept
};

template <typename Elem, typename G = Acc<Elem>>
struct RmsnormUnfusedBackwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  const Acc<Elem>* x_hat = nullptr;  // (rows, C)
  const Acc<Elem>* rstd = nullptr;   // (rows)
  const Elem* weight = nullptr;      // (C)
  const Elem* dy = nullptr;          // (rows, C)
  Elem* dx = nullptr;                // (rows, C)
  Write dx_write = Write::overwrite;
  G* dweight = nullptr;  // (C) accumulated; null: a frozen weight, none computed
};

template <typename Elem>
bool supports(const RmsnormForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const RmsnormForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const RmsnormForwardParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem, typename G>
bool supports(const RmsnormBackwardParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
int64_t workspace_bytes(const RmsnormBackwardParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
Status launch(const RmsnormBackwardParams<Elem, G>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const RmsnormUnfusedForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const RmsnormUnfusedForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const RmsnormUnfusedForwardParams<Elem>& p, Workspace ws, Stream stream = {});

// Workspace: the intermediates of its separate ops, g = dy * w (rows, C) and
// mean(g * x_hat) (rows), in Acc.
template <typename Elem, typename G>
bool supports(const RmsnormUnfusedBackwardParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
int64_t workspace_bytes(const RmsnormUnfusedBackwardParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
Status launch(const RmsnormUnfusedBackwardParams<Elem, G>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
