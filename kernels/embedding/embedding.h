// embedding: token-id row gather, vocab-parallel.
//
// A rank holds rows [vocab_start, vocab_start + V_local) of the (V, C) table,
// or of a padded (Vp, C) one (rows past V: no valid id looks them up).
// The forward writes the table row of tokens in its shard and a zero row for
// the others, so summing the outputs over the tp ranks gives the full lookup.
// The backward scatter-adds dout rows into the shard's table gradient. Token
// ids outside [0, V) throw weft::InputError naming the id, its position and V,
// before anything is written, unless ids_checked says the caller already
// checked them (the trainer scans its token files when it opens them): the
// CUDA backend then skips its check and the stream synchronisation the check
// needs, and reads an id outside [0, V) as outside the shard (a zero row, no
// gradient); the CPU checks either way, at no such cost. The table gradient
// is in G: by default Acc, the main-gradient type (fp32 under bf16 compute);
// with bf16 gradients (grad:bf16, the CUDA backend only) each entry's rows
// are added in fp32 to its value and the sum rounded once per launch.
//
// rows = B * T tokens.
#pragma once

#include <cstdint>

#include "kernels/kernel.h"

namespace weft::kernels {

template <typename Elem>
struct EmbeddingForwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  int64_t V = 0;  // full vocabulary
  int64_t vocab_start = 0;
  int64_t V_local = 0;               // V on one rank
  const int32_t* tokens = nullptr;   // (rows)
  const Elem* table = nullptr;       // (V_local, C)
  Elem* out = nullptr;               // (rows, C)
  bool ids_checked = false;
};

template <typename Elem, typename G = Acc<Elem>>
struct EmbeddingBackwardParams {
  int64_t rows = 0;
  int64_t C = 0;
  int64_t V = 0;
  int64_t vocab_start = 0;
  int64_t V_local = 0;
  const int32_t* tokens = nullptr;  // (rows)
  const Elem* dout = nullptr;       // (rows, C)
  G* dtable = nullptr;              // (V_local, C) accumulated
  bool ids_checked = false;
};

template <typename Elem>
bool supports(const EmbeddingForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const EmbeddingForwardParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const EmbeddingForwardParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem, typename G>
bool supports(const EmbeddingBackwardParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
int64_t workspace_bytes(const EmbeddingBackwardParams<Elem, G>& p, Backend backend = Backend::cpu);
template <typename Elem, typename G>
Status launch(const EmbeddingBackwardParams<Elem, G>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
