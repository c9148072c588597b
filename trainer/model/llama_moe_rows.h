// The bookkeeping of an MoE block's rows (llama_moe.cpp says the block):
// the per-expert counts each rank sent and received, the experts' runs of
// contiguous rows, and each tp rank's block of the rows gathered over tp.
// Internal to trainer/model, shared by the forward and the backward.
#pragma once

#include <array>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "core/error.h"

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

// Block scaling's tiles down an expert's tokens, where a micro-batch's
// rows for an expert lie apart (each tp rank routes its own rows under sp,
// each cp rank holds two pieces of every sequence). One rank computing the
// micro-batch takes its rows for expert e in sequence order, 128 to a
// tile; so each row needs its index among them. A sender (its dp, cp and
// tp ranks: its micro-batch, and which of the micro-batch's rows it routed)
// sends each expert its rows in its own order, which is sequence order
// within each unit: `unit` rows consecutive both among its rows and in the
// sequence. The per-(micro-batch, expert, unit) counts of every sender then
// place every row.
struct TokenGeometry {
  int64_t seq = 0;     // T
  int64_t cp = 1;      // context-parallel ranks (zigzag: rank c holds pieces c and 2 cp - 1 - c of each sequence)
  int64_t mb = 1;      // sequences in a micro-batch
  int64_t local = 0;   // rows of a cp rank: mb T / cp
  int64_t sender = 0;  // rows one sender routes: local, or local / tp under sp (tp rank p's from p sender)
  // The sequence position within its micro-batch of local row L of cp rank c.
  int64_t position(int64_t L, int64_t c) const {
    if (cp == 1) return L;
    const int64_t per = seq / cp, piece = seq / (2 * cp), s = L / per, at = L % per, k = at / piece;
    return s * seq + (k == 0 ? c : 2 * cp - 1 - c) * piece + at % piece;
  }
  int64_t unit() const { return std::gcd(cp > 1 ? seq / (2 * cp) : local, sender); }
  int64_t units() const { return mb * seq / unit(); }
};

// A sender: its dp rank (the micro-batch), cp rank and tp rank (0 without sp).
using TokenSender = std::array<int64_t, 3>;

// Adds a sender's kept choices (position >= 0; `experts` the choices'
// experts, both rows x k) to n, the counts of (D micro-batches, E experts,
// units).
inline void count_token_units(const TokenGeometry& g, const TokenSender& s, const int64_t* position,
                              const int32_t* experts, int64_t k, int64_t E, std::vector<int64_t>& n) {
  const int64_t u = g.unit(), U = g.units();
  for (int64_t i = 0; i < g.sender; ++i) {
    const int64_t at = g.position(s[2] * g.sender + i, s[1]) / u;
    for (int64_t j = 0; j < k; ++j)
      if (position[i * k + j] >= 0) ++n[size_t((s[0] * E + experts[i * k + j]) * U + at)];
  }
}

// Each received row's tile (`of_row`, rows_in of them) from every sender's
// counts n (D, E, units), the runs (Run: expert, offset, rows, source: an
// index into `senders`; each run all its sender's rows for its expert,
// whose global index is first_expert + expert), numbered (micro-batch,
// expert) by (micro-batch, expert); returns the number of tiles.
template <typename Run>
int64_t token_tiles(const TokenGeometry& g, const std::vector<int64_t>& n, int64_t D, int64_t E, int64_t tile,
                    std::span<const Run> runs, const std::vector<TokenSender>& senders, int64_t first_expert,
                    std::vector<int64_t>& of_row) {
  const int64_t u = g.unit(), U = g.units();
  // Each (micro-batch, expert)'s first tile, and each unit's first row
  // among its expert's rows (the units before it in the sequence).
  std::vector<int64_t> first_tile(size_t(D * E + 1), 0), before(n.size(), 0);
  for (int64_t de = 0; de < D * E; ++de) {
    int64_t rows = 0;
    for (int64_t v = 0; v < U; ++v) {
      before[size_t(de * U + v)] = rows;
      rows += n[size_t(de * U + v)];
    }
    first_tile[size_t(de + 1)] = first_tile[size_t(de)] + (rows + tile - 1) / tile;
  }
  for (const Run& r : runs) {
    WEFT_ASSERT(r.source < int64_t(senders.size()) && r.offset + r.rows <= int64_t(of_row.size()));
    const auto& [d, c, p] = senders[size_t(r.source)];
    const int64_t de = d * E + first_expert + r.expert;
    int64_t row = r.offset;
    for (int64_t L = p * g.sender; L < (p + 1) * g.sender; L += u) {
      const int64_t v = de * U + g.position(L, c) / u;
      for (int64_t j = 0; j < n[size_t(v)]; ++j)
        of_row[size_t(row + j)] = first_tile[size_t(de)] + (before[size_t(v)] + j) / tile;
      row += n[size_t(v)];
    }
    WEFT_ASSERT(row == r.offset + r.rows);
  }
  return first_tile.back();
}

}  // namespace weft::trainer::moe_rows
