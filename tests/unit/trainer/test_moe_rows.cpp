// The bookkeeping of an MoE block's rows (trainer/model/llama_moe_rows.h)
// that block scaling's tiles down the tokens rest on: each row an expert
// receives, from whichever sender under sp and cp, placed at its index
// among the micro-batch's rows for that expert in sequence order, as one
// rank computing the micro-batch takes them. Checked against a direct
// count over every sender's tokens, on random layouts and routings.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "trainer/model/llama_moe_rows.h"

namespace weft::trainer {
namespace {

using moe_rows::TokenGeometry;
using moe_rows::TokenSender;

struct ExpertRun {
  int64_t expert = 0, offset = 0, rows = 0, source = 0;
};

// cp's zigzag, as the data loader hands each cp rank its rows
// (trainer/run_state.h): every position of a micro-batch exactly once.
TEST(MoeRows, PositionsUndoTheZigzag) {
  for (int64_t cp : {1, 2, 4})
    for (int64_t mb : {1, 3}) {
      const int64_t T = 48;
      const TokenGeometry g{.seq = T, .cp = cp, .mb = mb, .local = mb * T / cp, .sender = mb * T / cp};
      std::vector<int> seen(size_t(mb * T), 0);
      for (int64_t c = 0; c < cp; ++c)
        for (int64_t L = 0; L < g.local; ++L) {
          const int64_t at = g.position(L, c);
          ASSERT_GE(at, 0);
          ASSERT_LT(at, mb * T);
          ++seen[size_t(at)];
          if (cp > 1) {  // the loader's: sequence s, piece k of rank c
            const int64_t piece = T / (2 * cp), s = L / (T / cp), k = (L % (T / cp)) / piece;
            EXPECT_EQ(at, s * T + (k == 0 ? c : 2 * cp - 1 - c) * piece + L % piece);
          }
        }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), mb * T) << "cp " << cp << " mb " << mb;
    }
}

TEST(MoeRows, TokenTilesPlaceEveryRowAsOneRankOrdersThem) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + rng() % v.size()); };
  int64_t checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t cp = pick({1, 2, 4}), mb = pick({1, 2, 3}), tp = pick({1, 2, 4}), D = pick({1, 2});
    const int64_t T = 2 * cp * pick({4, 12, 64}), E = pick({2, 4, 8}), k = std::min(E, pick({1, 2, 3}));
    const int64_t local = mb * T / cp;
    const bool sp = tp > 1 && local % tp == 0 && rng() % 4 != 0;
    const TokenGeometry g{.seq = T, .cp = cp, .mb = mb, .local = local, .sender = sp ? local / tp : local};
    const int64_t tile = pick({8, 128});
    SCOPED_TRACE(::testing::Message() << "T " << T << " cp " << cp << " mb " << mb << " sp tp " << (sp ? tp : 0)
                                      << " D " << D << " E " << E << " k " << k << " tile " << tile);
    // Every sender's routing: k distinct experts a row, some choices dropped
    // (a capacity's, in any pattern); each kept choice's position its place
    // among the sender's rows for its expert.
    std::vector<TokenSender> senders;
    for (int64_t d = 0; d < D; ++d)
      for (int64_t c = 0; c < cp; ++c)
        for (int64_t p = 0; p < (sp ? tp : 1); ++p) senders.push_back({d, c, p});
    std::vector<int64_t> n(size_t(D * E * g.units()), 0);
    // Each sender's kept rows per expert, in its order, with their positions.
    std::vector<std::vector<std::vector<int64_t>>> sent(senders.size(), std::vector<std::vector<int64_t>>(size_t(E)));
    for (size_t s = 0; s < senders.size(); ++s) {
      std::vector<int32_t> experts(size_t(g.sender * k));
      std::vector<int64_t> position(experts.size(), -1);
      std::vector<int32_t> all(static_cast<size_t>(E));
      for (int32_t e = 0; e < E; ++e) all[size_t(e)] = e;
      for (int64_t i = 0; i < g.sender; ++i) {
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = all[size_t(j)];
          experts[size_t(i * k + j)] = e;
          if (rng() % 10 == 0) continue;  // dropped
          position[size_t(i * k + j)] = int64_t(sent[s][size_t(e)].size());
          sent[s][size_t(e)].push_back(g.position(senders[s][2] * g.sender + i, senders[s][1]));
        }
      }
      moe_rows::count_token_units(g, senders[s], position.data(), experts.data(), k, E, n);
    }
    // One receiver holding experts [first, first + El), its sources the
    // senders in a shuffled order (a dispatcher's), each run one source's
    // rows for one expert.
    const int64_t parts = std::min(E, pick({1, 2})), El = E / parts, first = (parts - 1) * El;
    std::vector<size_t> order(senders.size());
    for (size_t s = 0; s < order.size(); ++s) order[s] = s;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<TokenSender> sources;
    std::vector<ExpertRun> runs;
    std::vector<std::pair<int64_t, int64_t>> row_of;  // each received row's (micro-batch x E + expert, position)
    for (size_t s : order) {
      sources.push_back(senders[s]);
      for (int64_t j = 0; j < El; ++j) {
        const auto& rows = sent[s][size_t(first + j)];
        if (!rows.empty())
          runs.push_back({j, int64_t(row_of.size()), int64_t(rows.size()), int64_t(sources.size()) - 1});
        for (int64_t at : rows) row_of.emplace_back(senders[s][0] * E + first + j, at);
      }
    }
    std::vector<int64_t> of_row(row_of.size(), -1);
    const int64_t tiles =
        moe_rows::token_tiles(g, n, D, E, tile, std::span<const ExpertRun>(runs), sources, first, of_row);
    // Directly: every (micro-batch, expert)'s positions over all senders,
    // sorted; tiles numbered (micro-batch, expert) by (micro-batch, expert).
    std::map<int64_t, std::vector<int64_t>> by;
    for (size_t s = 0; s < senders.size(); ++s)
      for (int64_t e = 0; e < E; ++e)
        for (int64_t at : sent[s][size_t(e)]) by[senders[s][0] * E + e].push_back(at);
    std::vector<int64_t> first_tile(size_t(D * E + 1), 0);
    for (int64_t de = 0; de < D * E; ++de) {
      auto& v = by[de];
      std::sort(v.begin(), v.end());
      first_tile[size_t(de + 1)] = first_tile[size_t(de)] + (int64_t(v.size()) + tile - 1) / tile;
    }
    EXPECT_EQ(tiles, first_tile.back());
    for (size_t r = 0; r < row_of.size(); ++r) {
      const auto& [de, at] = row_of[r];
      const auto& v = by[de];
      const int64_t index = std::lower_bound(v.begin(), v.end(), at) - v.begin();
      ASSERT_EQ(of_row[r], first_tile[size_t(de)] + index / tile) << "row " << r << " at position " << at;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace weft::trainer
