// elementwise and reduce: the small memory-bound ops around the big kernels.
//
//   AddParams         out = a + b            residual adds (backward: both inputs get dout)
//   ScaleParams       out = alpha * x        clipping, loss scaling (backward: alpha * dout)
//   AxpyParams        y += alpha * x         gradient accumulation
//   FillParams        x = value              zeroing gradients and accumulators
//   SumSquaresParams  *sum += sum of x^2     the global gradient norm, in double
//   WidenParams       out (+)= x, Elem->Acc  bf16 gradients into fp32 main gradients
//   NarrowParams      out = x, Acc->Elem     fp32 master weights to the bf16 compute copy
//
// n counts elements of flat tensors; outputs may alias inputs of the same
// type. Fill, axpy, scale and the sum of squares run on CUDA in fp32 as well
// as bf16: bf16 training keeps its main gradients in fp32 (on CUDA, *sum is
// in device memory). Widen and Narrow are the casts of mixed precision; for fp32 and fp64,
// where Acc is the element type, they are copies (Widen: or adds).
#pragma once

#include <cstdint>

#include "kernels/kernel.h"

namespace weft::kernels {

template <typename Elem>
struct AddParams {
  int64_t n = 0;
  const Elem* a = nullptr;  // (n)
  const Elem* b = nullptr;  // (n)
  Elem* out = nullptr;      // (n)
};

template <typename Elem>
struct ScaleParams {
  int64_t n = 0;
  double alpha = 1.0;
  const Elem* x = nullptr;  // (n)
  Elem* out = nullptr;      // (n)
};

template <typename Elem>
struct AxpyParams {
  int64_t n = 0;
  double alpha = 1.0;
  const Elem* x = nullptr;  // (n)
  Elem* y = nullptr;        // (n)
};

template <typename Elem>
struct FillParams {
  int64_t n = 0;
  double value = 0.0;
  Elem* x = nullptr;  // (n)
};

// Adds to *sum so that one accumulator collects every tensor of a model (and,
// after an all-reduce, every rank). Summed in fixed chunks of kSumChunk
// elements whose partial sums land in the workspace and are added in order, so
// the result is bit-identical for any thread count.
template <typename Elem>
struct SumSquaresParams {
  int64_t n = 0;
  const Elem* x = nullptr;  // (n)
  double* sum = nullptr;    // one value, accumulated
};
constexpr int64_t kSumChunk = 1 << 14;

template <typename Elem>
struct WidenParams {
  int64_t n = 0;
  const Elem* x = nullptr;   // (n)
  Acc<Elem>* out = nullptr;  // (n) overwritten or, with Write::accumulate, added to
  Write write = Write::overwrite;
};

// Rounds to nearest even; NaN stays NaN and values past Elem's range become inf.
template <typename Elem>
struct NarrowParams {
  int64_t n = 0;
  const Acc<Elem>* x = nullptr;  // (n)
  Elem* out = nullptr;           // (n)
};

template <typename Elem>
bool supports(const AddParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const AddParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const AddParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const ScaleParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const ScaleParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const ScaleParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const AxpyParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const AxpyParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const AxpyParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const FillParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const FillParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const FillParams<Elem>& p, Workspace ws, Stream stream = {});

// Workspace: one double per chunk of kSumChunk elements.
template <typename Elem>
bool supports(const SumSquaresParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const SumSquaresParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const SumSquaresParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const WidenParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const WidenParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const WidenParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const NarrowParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const NarrowParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const NarrowParams<Elem>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
