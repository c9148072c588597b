// The cudnn attention kind: cuDNN's fused scaled-dot-product attention
// through the cuDNN frontend's C++ graph API, forward and backward, bf16 in
// and out with fp32 softmax and accumulation, causal, scale 1 / sqrt(D), GQA.
// attention.cu routes AttentionKind::cudnn here in builds that found the
// frontend (WEFT_HAVE_CUDNN_FRONTEND); elsewhere the kind is unsupported.
//
// Why a third kind: cuDNN ships tuned SDPA engines per architecture, and
// whichever of it and weft's own flash kernels is faster depends on the
// device, T and D, so the tuner times both instead of weft guessing.
//
// The graphs read weft's (B, T, H, D) tensors in place as cuDNN's
// (B, H, T, D) dims with strides (T H D, D, H D, 1); K and V the same with
// H_kv heads, which cuDNN maps to query heads h / (H / H_kv) as weft does.
// The forward's softmax stats go into the params' lse, (B, H, T) fp32 as
// dims (B, H, T, 1): cuDNN's stats are max + log(sum exp(s - max)) over each
// row's scaled scores s, the natural-log log-sum-exp, which is what lse
// means for flash too; only the cudnn backward reads them.
//
// Blocks of the sequence (context parallelism, attention.h): the graphs
// take the two kinds of block weft's transports call, inside larger tensors
// (the batch row strides: dims as above, batch strides of the larger
// tensors' rows):
//   causal: the queries' last position is the keys' last (q_offset + T ==
//     k_offset + Tk, T <= Tk): the whole call, the ring's diagonal blocks
//     and the all-gather's query chunk against its key prefix. The band's
//     right edge on the diagonal from the bottom right (from the top left
//     where T == Tk: the same mask).
//   visible: every key at or before every query (k_offset + Tk <= q_offset
//     + 1): the ring's blocks of earlier keys, no mask.
// Other blocks (some rows seeing no key) are not taken. cuDNN writes its
// outputs; a backward accumulating into dq or dk and dv (Write::accumulate)
// has cuDNN write them to the workspace and adds them in (attention.cu).
//
// Building a graph (heuristics, plan compilation) takes milliseconds to
// seconds, so each is built once per shape and kept for the process, keyed
// by its shape, strides, mask, direction and device. Each device has one cuDNN handle,
// pointed at the launch's stream before each execute, and one lock around
// building and enqueuing, so threads sharing a device take turns.
//
// This header is plain C++ (attention.cu includes it through nvcc); only
// attention_cudnn.cpp sees the frontend's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/cpu_common.h"

namespace weft::kernels::attention_cudnn {

// ---------------------------------------------------------------- workspace
//
// workspace_bytes() must be cheap and free of side effects (the memory model
// and the tuner ask it for thousands of layouts, without a device), so it
// cannot build a graph and ask cuDNN. It returns this bound instead:
//
//   frontend part: what the frontend's SDPA backward lays out in the
//     workspace for dense (non-ragged) tensors on cuDNN 9: the fp32
//     rowsum(dO * O) per row, (B, H, T), and the fp32 dQ accumulator,
//     (B, H, T, D). The forward has none.
//   engine part: each graph is built with deselect_workspace_greater_than()
//     at kEngineAllowance (backward: plus fp32 dK and dV at the kv heads, in
//     case an engine accumulates the group's heads there), so heuristics only
//     pick plans whose own scratch fits. The 16 MiB is an allowance, not a
//     measurement (no GPU has checked it yet): small beside the activations
//     of any real layout, and large for a fused kernel's own scratch.
//
// Each part is a 64-byte piece, as in the other CUDA workspaces. After a
// graph is built, launch compares its get_workspace_size() with the bound
// and throws InternalError with both numbers when it is larger, rather than
// returning Status::unsupported: the caller gave all the bound promised, so
// a larger need is weft's bug (a newer frontend laying out more), and an
// unsupported status would let the tuner quietly drop the kind while the
// memory model kept the wrong number.
constexpr int64_t kEngineAllowance = int64_t{16} << 20;

inline int64_t piece(int64_t bytes) { return cpu::align_up(bytes); }

inline int64_t forward_workspace_bound(int64_t /*B*/, int64_t /*T*/, int64_t /*H*/, int64_t /*H_kv*/,
                                       int64_t /*D*/) {
  return kEngineAllowance;
}

// The backward's engine part also holds fp32 dK and dV at the kv heads or,
// with grouped queries, 4 bytes a query head's element (an H200 with cuDNN 9
// picked a plan needing B T H D 4 at GQA 4:1), whichever is larger; over Tk
// keys (0: T) for a block.
inline int64_t backward_engine_allowance(int64_t B, int64_t T, int64_t H, int64_t H_kv, int64_t D,
                                         int64_t Tk = 0) {
  const int64_t keys = Tk > 0 ? Tk : T;
  return kEngineAllowance + std::max(2 * piece(B * keys * H_kv * D * 4), piece(B * keys * H * D * 4));
}

// cuDNN's part of the backward's workspace; then, for a backward that
// accumulates (dq_temp: into dq, dkv_temp: into dk and dv), the bf16
// gradients cuDNN writes there before they are added in, dense: dQ
// (B, T, H, D), dK and dV (B, Tk, H_kv, D) each; and for a block whose lse
// lies inside a larger tensor (lse_temp), its rows packed, (B, H, T) fp32:
// cuDNN before 9.26 takes the backward's stats packed only.
inline int64_t backward_workspace_bound(int64_t B, int64_t T, int64_t H, int64_t H_kv, int64_t D,
                                        int64_t Tk = 0, bool dq_temp = false, bool dkv_temp = false,
                                        bool lse_temp = false) {
  const int64_t keys = Tk > 0 ? Tk : T;
  return piece(B * H * T * 4) + piece(B * H * T * D * 4) + backward_engine_allowance(B, T, H, H_kv, D, keys) +
         (dq_temp ? piece(B * T * H * D * 2) : 0) + (dkv_temp ? 2 * piece(B * keys * H_kv * D * 2) : 0) +
         (lse_temp ? piece(B * H * T * 4) : 0);
}

// ---------------------------------------------------------------- shapes
//
// What the graphs take on both sm80 and sm90 with cuDNN 9: D a multiple of 8
// (16-byte rows) up to 128 (the Ampere engines' limit), T of at least 2 (the
// frontend refuses a backward with one query and one key), and 16-byte
// aligned tensors, lse included. Whether cuDNN has a plan for a shape on the
// device at hand is known only once its graph is built (see launches).
inline bool shape_handled(int64_t T, int64_t D) { return T >= 2 && D % 8 == 0 && D <= 128; }

// The masks of the blocks the graphs take (above).
enum class Mask { causal, visible };
// Which one a block of T queries at q_offset and Tk keys (0: T) at
// k_offset takes, if either.
inline bool block_mask(int64_t T, int64_t Tk, int64_t q_offset, int64_t k_offset, Mask* mask) {
  const int64_t keys = Tk > 0 ? Tk : T;
  if (q_offset + T == k_offset + keys && T <= keys) {
    if (mask) *mask = Mask::causal;
    return true;
  }
  if (k_offset + keys <= q_offset + 1) {
    if (mask) *mask = Mask::visible;
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- launches
//
// Enqueue on `stream` (params already checked, workspace at least the bound).
// A shape cuDNN has no plan for on this device, a cuDNN older than 9 at run
// time, and cuDNN and frontend failures throw gpu::CudaError with the shape
// and cuDNN's own reason (remembered per shape, so a refused shape is not
// rebuilt at every launch); nothing here answers Status::unsupported, which
// would reach the user without the reason.
Status forward(const AttentionForwardParams<bf16>& p, Workspace ws, cudaStream_t stream);
Status backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream);

// Enqueue a backward whose dq, dk and dv cuDNN writes as they are (each
// with its own batch row stride, dq_rows and dkv_rows: 0 as the params'),
// whatever the params' Write says, its lse packed (lse_batch_rows 0 or T;
// attention.cu packs a block's and handles accumulation).
Status backward_to(const AttentionBackwardParams<bf16>& p, int64_t dq_rows, int64_t dkv_rows, Workspace ws,
                   cudaStream_t stream);

// The workspace the graph built for the params on the current device asked
// for (-1: none built yet).
int64_t graph_workspace(const AttentionForwardParams<bf16>& p);
int64_t graph_workspace(const AttentionBackwardParams<bf16>& p);

// ---------------------------------------------------------------- without a device
//
// The graph launch would build for a shape, described and validated by the
// frontend for compute capability `sm` (80, 90) against the cuDNN library
// loaded, without a device or a handle: empty when the frontend accepts it,
// otherwise its reason. Plans are not built (that needs the device).
std::string validate_graph(int64_t B, int64_t T, int64_t H, int64_t H_kv, int64_t D, bool backward, int sm);
// The same for a block: T queries at q_offset against Tk keys at k_offset
// in tensors of q_rows and kv_rows rows a sequence (as the params' batch
// rows; 0: dense); a block neither mask takes is refused with a reason.
std::string validate_block_graph(int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t H_kv, int64_t D,
                                 int64_t q_offset, int64_t k_offset, int64_t q_rows, int64_t kv_rows, bool backward,
                                 int sm);

}  // namespace weft::kernels::attention_cudnn
