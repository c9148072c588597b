#include "tuner/space_scan.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::tuner {

Layout SpaceScan::layout_at(int64_t i) const {
  // The subspace whose first index is the last at or before i.
  const auto it = std::upper_bound(subspaces.begin(), subspaces.end(), i,
                                   [](int64_t x, const Subspace& s) { return x < s.first; });
  WEFT_ASSERT(it != subspaces.begin());
  const Subspace& s = *std::prev(it);
  WEFT_ASSERT(i - s.first < s.size());
  return s.at(i - s.first);
}

Candidate SpaceScan::candidate(const SpaceContext& ctx, int64_t position) const {
  return evaluate_one(ctx.model, ctx.run, ctx.cluster, layout_at(int64_t(order[size_t(position)])), ctx.constants,
                      ctx.memory);
}

int64_t space_size(const SpaceContext& ctx, const SpaceLimits& limits, SpaceDevice device) {
  int64_t n = 0;
  for (const Subspace& s : enumerate_subspaces(ctx.model, ctx.run, ctx.cluster.gpus, limits, device)) n += s.size();
  return n;
}

SpaceScan space_scan(const SpaceContext& ctx, const SpaceLimits& limits, SpaceDevice device, bool points) {
  const auto t0 = std::chrono::steady_clock::now();
  SpaceScan scan;
  scan.subspaces = enumerate_subspaces(ctx.model, ctx.run, ctx.cluster.gpus, limits, device);
  int64_t n = 0;
  for (const Subspace& s : scan.subspaces) n += s.size();
  if (n > int64_t(UINT32_MAX))
    throw InputError(fmt::format("the space holds {} layouts, past the {} a dry-run ranks; pin some knobs", n,
                                 UINT32_MAX));
  // evaluate()'s key, 24 bytes a layout.
  struct Key {
    double step;
    int64_t peak;
    uint32_t index;
    uint8_t rank;  // fits, oom, invalid
  };
  std::vector<Key> keys(static_cast<size_t>(n));
  // The points by layout index; their classes first numbered by thread (a
  // thread's own list), renumbered after.
  std::vector<SpaceScan::Point> by_index(points ? static_cast<size_t>(n) : 0);
  std::vector<uint8_t> thread_of(points ? static_cast<size_t>(n) : 0);
  // Each thread counts the prune classes it meets; merged after.
  std::vector<std::map<std::string, int64_t>> pruned;
  std::vector<std::map<std::string, uint16_t>> local_class;
  std::vector<std::vector<std::string>> local_names;
  std::exception_ptr failed;
#pragma omp parallel
  {
#pragma omp single
    {
      pruned.resize(size_t(omp_get_num_threads()));
      local_class.resize(size_t(omp_get_num_threads()));
      local_names.resize(size_t(omp_get_num_threads()));
    }
#pragma omp for schedule(dynamic, 1)
    for (size_t si = 0; si < scan.subspaces.size(); ++si) try {
      const Subspace& s = scan.subspaces[si];
      const int t = omp_get_thread_num();
      auto& mine = pruned[size_t(t)];
      for (int64_t j = 0; j < s.size(); ++j) {
        const Candidate c = evaluate_one(ctx.model, ctx.run, ctx.cluster, s.at(j), ctx.constants, ctx.memory);
        const uint32_t index = uint32_t(s.first + j);
        const uint8_t rank = c.verdict == Verdict::fits ? 0 : c.verdict == Verdict::out_of_memory ? 1 : 2;
        keys[index] = rank == 2 ? Key{0, 0, index, 2} : Key{c.cost.step, c.memory.peak(), index, rank};
        if (rank != 0) ++mine[c.prune_class];
        if (!points) continue;
        SpaceScan::Point& p = by_index[index];
        p.verdict = uint8_t(c.verdict);
        thread_of[index] = uint8_t(t);
        if (rank != 2) {
          p.mfu = float(c.cost.mfu);
          p.step = float(c.cost.step);
          p.peak = c.memory.peak();
        }
        if (rank != 0) {
          const auto [it, added] = local_class[size_t(t)].emplace(c.prune_class, uint16_t(local_names[size_t(t)].size()));
          if (added) local_names[size_t(t)].push_back(c.prune_class);
          p.cls = it->second;
        }
      }
    } catch (...) {
#pragma omp critical(weft_scan_failed)
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  // The index breaks ties as a stable sort of the index order would, without
  // its buffer of n more keys.
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.step != b.step) return a.step < b.step;
    if (a.peak != b.peak) return a.peak < b.peak;
    return a.index < b.index;
  });
  // The tie rule: of the fitting layouts within `tie` of the fastest, the
  // one with the least memory comes first.
  if (!keys.empty() && keys.front().rank == 0) {
    const double limit = keys.front().step * (1.0 + ctx.tie);
    size_t best = 0;
    for (size_t i = 1; i < keys.size() && keys[i].rank == 0 && keys[i].step <= limit; ++i)
      if (keys[i].peak < keys[best].peak) best = i;
    std::rotate(keys.begin(), keys.begin() + long(best), keys.begin() + long(best) + 1);
  }
  scan.order.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    scan.order[i] = keys[i].index;
    if (keys[i].rank == 0) ++scan.summary.fitting;
  }
  keys = {};
  if (points) {
    // Classes in the order a reader meets them: "fits", then as ranked.
    scan.classes = {"fits"};
    std::map<std::string, uint16_t> global{{"fits", 0}};
    scan.points.resize(scan.order.size());
    for (size_t i = 0; i < scan.order.size(); ++i) {
      SpaceScan::Point p = by_index[scan.order[i]];
      if (p.verdict != uint8_t(Verdict::fits)) {
        const std::string& name = local_names[thread_of[scan.order[i]]][p.cls];
        const auto [it, added] = global.emplace(name, uint16_t(scan.classes.size()));
        if (added) scan.classes.push_back(name);
        p.cls = it->second;
      } else {
        p.cls = 0;
      }
      scan.points[i] = p;
    }
  }
  for (const auto& m : pruned)
    for (const auto& [cls, count] : m) scan.summary.pruned[cls] += count;
  scan.summary.evaluated = n;
  scan.summary.visited = n;
  scan.summary.exhaustive = true;
  scan.summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return scan;
}

}  // namespace weft::tuner
