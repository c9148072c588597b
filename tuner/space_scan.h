// The whole space of a dry-run ranked as evaluate() ranks it, in bounded
// memory: a few bytes a layout instead of a Candidate (a memory estimate by
// stage and a cost breakdown, hundreds of bytes), so that spaces of millions
// of layouts (Llama 3.1 70B on 64 GPUs: 4.1 million) are ranked in well
// under a GiB. A row is predicted again when it is written (candidate()),
// from its index in enumerate()'s order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tuner/space.h"

namespace weft::tuner {

struct SpaceScan {
  SpaceReport summary;              // the counts of evaluate()'s report; no candidates
  std::vector<Subspace> subspaces;  // the space, as enumerate_subspaces gives it
  std::vector<uint32_t> order;      // every layout's index, in rank order (fitting first, the tie rule applied)
  // With points asked for: each layout's plotted values, by rank position
  // (20 bytes a layout), and the prune classes they index ("fits" first).
  struct Point {
    float mfu = 0, step = 0;
    int64_t peak = 0;
    uint16_t cls = 0;
    uint8_t verdict = 0;  // Verdict
  };
  std::vector<Point> points;
  std::vector<std::string> classes;

  int64_t size() const { return int64_t(order.size()); }
  // The layout of index `i` in enumerate()'s order.
  Layout layout_at(int64_t i) const;
  // The candidate at rank position `position` (0 = first row), predicted again.
  Candidate candidate(const SpaceContext& ctx, int64_t position) const;
};

// The number of layouts of the space, counted without building them.
int64_t space_size(const SpaceContext& ctx, const SpaceLimits& limits, SpaceDevice device);

// Predicts every layout once (on every core) and ranks them as evaluate()
// does. InputError past 2^32 layouts.
SpaceScan space_scan(const SpaceContext& ctx, const SpaceLimits& limits, SpaceDevice device, bool points = false);

}  // namespace weft::tuner
