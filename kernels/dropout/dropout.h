// dropout: y (=|+=) mask * x / (1 - p), with the mask drawn per element from
// a counter-based hash of (key, the element's global index), so that every
// layout of a run drops the same elements: LoRA's dropout on an adapter's
// input (trainer/model/llama_lora.cpp), applied again with the same mask to
// the input gradient in the backward.
//
// x holds `rows` tokens of a micro-batch on one rank: token r is position
// r % local_seq of sample first_sample + r / local_seq; under context
// parallelism (cp > 1) the local positions are two chunks of T / (2 cp),
// chunks cp_rank and 2 cp - 1 - cp_rank of the sequence (the trainer's
// split). Column c is column col_offset + c of full_cols (a row-parallel
// layer's inputs split over tp). The element's index is
// (sample * seq + position) * full_cols + column.
#pragma once

#include <cstdint>

#include "kernels/kernel.h"

#if defined(__CUDACC__)
#define WEFT_DROPOUT_HD __host__ __device__
#else
#define WEFT_DROPOUT_HD
#endif

namespace weft::kernels {

template <typename Elem>
struct DropoutParams {
  int64_t rows = 0;
  int64_t cols = 0;
  double p = 0;      // the probability of dropping an element, in [0, 1)
  uint64_t key = 0;  // the mask's key
  int64_t first_sample = 0, seq = 0, local_seq = 0, cp = 1, cp_rank = 0;
  int64_t col_offset = 0, full_cols = 0;
  const Elem* x = nullptr;  // (rows, cols)
  Elem* y = nullptr;        // (rows, cols); may be x when overwriting
  Write write = Write::overwrite;
};

// The global index of element (r, c) of p's x.
template <typename Elem>
WEFT_DROPOUT_HD inline uint64_t dropout_index(const DropoutParams<Elem>& p, int64_t r, int64_t c) {
  const int64_t sample = p.first_sample + r / p.local_seq, t = r % p.local_seq;
  int64_t pos = t;
  if (p.cp > 1) {
    const int64_t piece = p.seq / (2 * p.cp), k = t / piece;
    pos = (k == 0 ? p.cp_rank : 2 * p.cp - 1 - p.cp_rank) * piece + t % piece;
  }
  return uint64_t((sample * p.seq + pos) * p.full_cols + p.col_offset + c);
}

// Whether the element of global index i is kept: a uniform draw in [0, 1)
// from splitmix64 of (key, i) at least p.
WEFT_DROPOUT_HD inline bool dropout_keep(uint64_t key, uint64_t i, double p) {
  uint64_t x = key ^ (i * 0x9e3779b97f4a7c15ull);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return double(x >> 11) * 0x1.0p-53 >= p;
}

template <typename Elem>
bool supports(const DropoutParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const DropoutParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const DropoutParams<Elem>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
