// The bookkeeping of an MoE block's rows (llama_moe.cpp says the block):
// the per-expert counts each rank sent and received, the experts' runs of
// contiguous rows, and each tp rank's block of the rows gathered over tp.
// Internal to trainer/model, shared by the forward and the backward.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/layout.h"

namespace weft::trainer::moe_rows {

// The rows this rank routed to each of the E experts, from the expert
// offsets of the permutation.
inline std::vector<int64_t> expert_counts(const int64_t* offsets, int64_t E) {
  std::vector<int64_t> n(static_cast<size_t>(E));
  for (int64_t j = 0; j < E; ++j) n[size_t(j)] = offsets[j + 1] - offsets[j];
  return n;
}

// The rows each ep rank routed to each of this rank's E / ep experts (ep,
// E / ep), from the counts the dispatcher exchanged: those very counts
// under a2a, this rank's columns of every rank's (ep, E) under allgather.
inline std::vector<int64_t> received_counts(const int64_t* counts, int64_t E, int64_t ep, int64_t me, MoeDispatch d) {
  const int64_t El = E / ep;
  if (d == MoeDispatch::a2a) return std::vector<int64_t>(counts, counts + E);
  std::vector<int64_t> out(static_cast<size_t>(E));
  for (int64_t s = 0; s < ep; ++s)
    for (int64_t j = 0; j < El; ++j) out[size_t(s * El + j)] = counts[s * E + me * El + j];
  return out;
}

// The experts' runs: without expert parallelism or an expert tp degree
// under sp, each expert's rows in expert order (`offsets`); with them, the
// rows received (`received`: `sources` blocks of E / ep counts), source by
// source and within each by expert. A source is an ep rank, and under etp
// with sp a tp rank's received rows after the ep ranks' (tp x ep sources).
template <typename Run>
std::vector<Run> expert_rows(const int64_t* offsets, const std::vector<int64_t>& received, int64_t E, int64_t ep) {
  std::vector<Run> out;
  if (received.empty()) {
    for (int64_t j = 0; j < E; ++j)
      if (offsets[j + 1] > offsets[j]) out.push_back({j, offsets[j], offsets[j + 1] - offsets[j], 0});
    return out;
  }
  const int64_t El = E / ep, sources = int64_t(received.size()) / El;
  int64_t at = 0;
  for (int64_t s = 0; s < sources; ++s)
    for (int64_t j = 0; j < El; ++j) {
      const int64_t n = received[size_t(s * El + j)];
      if (n > 0) out.push_back({j, at, n, s});
      at += n;
    }
  return out;
}

// Each tp rank's rows in the received order (elements of `width`), from
// the counts gathered over tp (tp blocks of E).
inline std::vector<int64_t> tp_blocks(const std::vector<int64_t>& gathered, int64_t tp, int64_t E, int64_t width) {
  std::vector<int64_t> out(size_t(tp), 0);
  for (int64_t p = 0; p < tp; ++p)
    out[size_t(p)] = std::accumulate(gathered.begin() + p * E, gathered.begin() + (p + 1) * E, int64_t{0}) * width;
  return out;
}

}  // namespace weft::trainer::moe_rows
