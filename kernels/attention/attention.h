// attention: causal scaled-dot-product attention with grouped-query heads.
//
// Head h reads kv head h / (H / H_kv); the softmax scale is 1 / sqrt(D).
//
// Context parallelism splits the sequence, so a call may cover one block of
// queries against another block of keys: T queries starting at sequence
// position q_offset, Tk keys (0: T) starting at k_offset, and a query sees
// the keys at or before its own position. A query that sees no key gets an
// output of 0 and an lse of -inf, so that partial results over key blocks
// merge exactly through the lse (attention_merge below); the backward of a
// block, given the merged out and lse, gives that block's share of dq, dk and
// dv (accumulated where dq_write or dkv_write say so). The row strides let a
// block live inside a larger tensor: q_batch_rows between the sequences of
// q, out, dout and dq (0: T), kv_batch_rows for k, v, dk and dv (0: Tk),
// lse_batch_rows for lse (0: T).
//
// Chunked local attention (Llama 4's RoPE layers): with chunk > 0 a query
// at position p sees only the keys of its own chunk, those at positions
// floor(p / chunk) * chunk to p; chunk 0 sees the whole causal range. The
// bound comes from the absolute positions (q_offset + i), so it holds for
// any block of the sequence, and a row whose chunk starts past the block's
// keys sees none of them (out 0, lse -inf, merged as above). The CPU
// computes it with flash and materialized; the CUDA kinds refuse a chunk
// that masks a key of the call (attention_chunk_masks) as
// Status::unsupported. Three
// variants compute the same function and differ in what they keep and whose
// kernels run, chosen by the layout's attention knob (weft::AttentionKind):
//   flash        keeps the log-sum-exp per query row, lse (B, H, T) in Acc;
//                the backward recomputes the probabilities from it.
//   materialized keeps the probabilities P (B, H, T, T); its backward reads
//                them instead of recomputing.
//   cudnn        cuDNN's fused SDPA (kernels/attention/attention_cudnn.h),
//                CUDA only; keeps what flash keeps, lse being cuDNN's own
//                softmax stats, which only the cudnn backward reads.
#pragma once

#include <cstdint>

#include "core/layout.h"
#include "kernels/kernel.h"

namespace weft::kernels {

template <typename Elem>
struct AttentionForwardParams {
  AttentionKind kind = AttentionKind::flash;
  int64_t B = 0;
  int64_t T = 0;
  int64_t H = 0;
  int64_t H_kv = 0;  // divides H
  int64_t D = 0;
  const Elem* q = nullptr;  // (B, T, H, D), after RoPE
  const Elem* k = nullptr;  // (B, Tk, H_kv, D), after RoPE
  const Elem* v = nullptr;  // (B, Tk, H_kv, D)
  Elem* out = nullptr;      // (B, T, H, D)
  // (B, H, T) log-sum-exp of the scaled scores per query row: required by
  // flash and cudnn, written by materialized too when given.
  Acc<Elem>* lse = nullptr;
  Elem* probs = nullptr;  // (B, H, T, Tk) materialized only; zero past each row's keys
  // A block of the sequence (context parallelism; see above).
  int64_t Tk = 0;  // 0: T
  int64_t q_offset = 0, k_offset = 0;
  int64_t q_batch_rows = 0, kv_batch_rows = 0, lse_batch_rows = 0;  // 0: dense
  int64_t chunk = 0;  // positions per attention chunk (see above); 0: the whole causal range
};

// dq, dk and dv are overwritten. dk and dv of a kv head sum over the H / H_kv
// query heads that share it.
template <typename Elem>
struct AttentionBackwardParams {
  AttentionKind kind = AttentionKind::flash;
  int64_t B = 0;
  int64_t T = 0;
  int64_t H = 0;
  int64_t H_kv = 0;
  int64_t D = 0;
  const Elem* q = nullptr;          // (B, T, H, D)
  const Elem* k = nullptr;          // (B, Tk, H_kv, D)
  const Elem* v = nullptr;          // (B, Tk, H_kv, D)
  const Elem* out = nullptr;        // (B, T, H, D) flash and cudnn (delta = rowsum(dO * O))
  const Acc<Elem>* lse = nullptr;   // (B, H, T) flash and cudnn, from the same kind's forward
  const Elem* probs = nullptr;      // (B, H, T, Tk) materialized only
  const Elem* dout = nullptr;       // (B, T, H, D)
  Elem* dq = nullptr;               // (B, T, H, D)
  Elem* dk = nullptr;               // (B, Tk, H_kv, D)
  Elem* dv = nullptr;               // (B, Tk, H_kv, D)
  // A block of the sequence (context parallelism; see above): out and lse
  // are the merged ones over every key block, and the gradients add to what
  // dq, dk and dv hold when their Write says accumulate.
  int64_t Tk = 0;  // 0: T
  int64_t q_offset = 0, k_offset = 0;
  int64_t q_batch_rows = 0, kv_batch_rows = 0, lse_batch_rows = 0;  // 0: dense
  int64_t chunk = 0;  // as the forward's
  Write dq_write = Write::overwrite;
  Write dkv_write = Write::overwrite;
};

// Whether the params describe a block of the sequence rather than the whole
// causal attention of dense tensors. The CPU computes blocks with flash and
// materialized; CUDA with flash, and with cudnn those causal to their end or
// fully visible (the ring's and the all-gather's; attention_cudnn.h): its
// materialized kind computes only the whole and refuses blocks as
// Status::unsupported.
template <typename P>
bool attention_is_block(const P& p) {
  bool block = (p.Tk != 0 && p.Tk != p.T) || p.q_offset != p.k_offset || (p.q_batch_rows != 0 && p.q_batch_rows != p.T) ||
               (p.kv_batch_rows != 0 && p.kv_batch_rows != (p.Tk ? p.Tk : p.T)) ||
               (p.lse_batch_rows != 0 && p.lse_batch_rows != p.T);
  if constexpr (requires { p.dq_write; })
    block = block || p.dq_write != Write::overwrite || p.dkv_write != Write::overwrite;
  return block;
}

// Whether the chunk hides from some query of the call a key that the causal
// rule alone would show it. The last query's chunk starts latest, so it is
// the one to ask: it loses keys when its chunk starts after the call's first
// key and that key is at or before it. False for chunk 0 and for a call
// whose positions lie in one chunk.
template <typename P>
bool attention_chunk_masks(const P& p) {
  if (p.chunk <= 0 || p.T == 0) return false;
  const int64_t last_q = p.q_offset + p.T - 1;
  return p.k_offset <= last_q && (last_q / p.chunk) * p.chunk > p.k_offset;
}

// Merges a partial result of the same queries over another block of keys
// into a running one, exactly through their lse (context parallelism's
// ring): lse = log(e^lse + e^part_lse), out = out e^(old lse - lse) +
// part_out e^(part_lse - lse), computed in fp64 on the CPU and fp32 on CUDA.
// A row whose part saw no key (lse -inf) keeps the running result; one whose
// running result saw none takes the part as it is.
template <typename Elem>
struct AttentionMergeParams {
  int64_t B = 0;
  int64_t T = 0;
  int64_t H = 0;
  int64_t D = 0;
  Elem* out = nullptr;                 // (B, T, H, D), q_batch_rows rows apart per sequence (0: T)
  Acc<Elem>* lse = nullptr;            // (B, H, T), lse_batch_rows apart per (sequence, head) (0: T)
  const Elem* part_out = nullptr;      // as out
  const Acc<Elem>* part_lse = nullptr; // as lse
  int64_t q_batch_rows = 0, lse_batch_rows = 0;
};

template <typename Elem>
bool supports(const AttentionMergeParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const AttentionMergeParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const AttentionMergeParams<Elem>& p, Workspace ws, Stream stream = {});

// Workspaces, forward and backward, depend on the backend. The CPU's holds
// Acc score tiles per (batch, kv head) item (kernels/attention/attention_cpu.cpp):
// B * H_kv items of n tiles of (min(32, T) x T) elements, each tile a 64-byte
// aligned piece; n is 1 for the flash forward, 2 for the flash backward (P
// and dP), 0 for the materialized forward and 1 for its backward (dP). The
// CPU has no cuDNN: cudnn params are Status::unsupported there. The CUDA
// workspaces are described in attention.cu and attention_cudnn.h.
template <typename Elem>
bool supports(const AttentionForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const AttentionForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const AttentionForwardParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const AttentionBackwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const AttentionBackwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const AttentionBackwardParams<Elem>& p, Workspace ws, Stream stream = {});

// Whether this build runs `kind` on `backend` at all, whatever the shapes:
// the CPU runs flash and materialized; a CUDA build runs those and, when it
// was built with cuDNN's frontend, cudnn. Needs no device. The trainer asks it
// to reject a layout with a message instead of failing at the first launch.
bool attention_available(AttentionKind kind, Backend backend);

// cudnn on CUDA: the workspace cuDNN asked for the graph of these params on
// the current device, built by an earlier launch (-1: none built, or no
// cuDNN in this build), to set beside workspace_bytes()'s bound, which the
// build cannot measure without a device (benchmarks/bench_gpu_attention).
int64_t cudnn_graph_workspace(const AttentionForwardParams<bf16>& p);
int64_t cudnn_graph_workspace(const AttentionBackwardParams<bf16>& p);

}  // namespace weft::kernels
