// The ep replicas' collectives over a shard's dense elements
// (memory/dense_split.h): each dense run of a flat range is split between
// the replicas in order, so one reduce-scatter or all-gather per run moves
// every replica's part in place.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "memory/dense_split.h"
#include "trainer/parallel/comm.h"

namespace weft::trainer {

// Sums `data` (flat elements [flat, flat + n) of the shard) over the
// replicas into each one's own part of every dense run; the other dense
// elements are spent, the experts' untouched. Non-blocking: the requests go
// to `pending`.
template <typename T>
void reduce_scatter_dense(parallel::Comm& replicas, const memory::DenseSplit& split, T* data, int64_t flat, int64_t n,
                          std::vector<std::unique_ptr<parallel::CommRequest>>& pending) {
  std::vector<int64_t> counts;
  split.for_each_dense(flat, n, [&](int64_t offset, int64_t count) {
    int64_t mine_at = 0;
    split.run_counts(flat + offset, count, counts, mine_at);
    pending.push_back(replicas.ireduce_scatter_v(data + offset, data + offset + mine_at,
                                                 std::span<const int64_t>(counts)));
  });
}

// Each replica's part of the dense runs of [flat, flat + n) to all of them,
// in place in `data`.
template <typename T>
void all_gather_dense(parallel::Comm& replicas, const memory::DenseSplit& split, T* data, int64_t flat, int64_t n) {
  std::vector<int64_t> counts;
  split.for_each_dense(flat, n, [&](int64_t offset, int64_t count) {
    int64_t mine_at = 0;
    split.run_counts(flat + offset, count, counts, mine_at);
    replicas.all_gather_v(data + offset + mine_at, data + offset, std::span<const int64_t>(counts));
  });
}

}  // namespace weft::trainer
