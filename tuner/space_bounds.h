// The bounds the space's search (space.h, search) rules layouts out by,
// beside cost.h's step_bounds: internal to the tuner, and tested on their
// own (a bound above a layout's own value would drop it from the rows).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "tuner/space.h"

namespace weft::tuner {

// A layout of a subspace as (checkpointing, attention, norm, ZeRO, gradient
// type) indices into its lists; Subspace::at's i-th layout is member_of(i).
struct Member {
  size_t c = 0, a = 0, n = 0, z = 0, g = 0;
};
Member member_of(const Subspace& s, int64_t i);

// A lower bound on memory::estimate(...).peak() of every valid layout of a
// subspace (space_bounds.cpp says how), over its valid attention kinds
// (indices into its list). Throws InputError for sizes past 64 bits.
// With `past` given it answers only whether the bound lies past it, for
// less work: a result past `past` is past it and at most the bound; a
// result at most `past` means the bound is too, and is not the bound.
int64_t memory_lower_bound(const SpaceContext& ctx, const Subspace& s, const std::vector<size_t>& valid_attentions,
                           int64_t past = std::numeric_limits<int64_t>::max());

// Lower bounds on memory::estimate(...).peak() of a subspace's layouts, a
// term per (checkpointing, attention, norm) and one per (ZeRO, gradient
// type), on the first and the last stage (the worst holds at least either):
// a stage's table (memory/shapes) is weights, gradients and optimizer state,
// which only ZeRO and the gradient type set, beside everything else, which
// they do not set but for ZeRO's and the tied embedding's data-parallel
// buffers (left out: the bound only drops bytes). Each term is built when
// first asked for; `ctx` and `s` must outlive the bounds.
class MemoryBounds {
 public:
  MemoryBounds(const SpaceContext& ctx, const Subspace& s);
  // With `past` given, the first stage end past it ends the walk: the
  // result is then past `past` and at most the bound.
  int64_t of(const Member& x, int64_t past = std::numeric_limits<int64_t>::max());

 private:
  int64_t part(int stage_end, const Member& x, bool params);

  const SpaceContext& ctx_;
  const Subspace& s_;
  Layout work_;
  std::vector<int64_t> rest_[2], params_[2];
};

}  // namespace weft::tuner
