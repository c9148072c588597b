// RankGrid: where each rank of a world sits in the (tp, cp, pp, dp)
// decomposition, as one pure function of (world size, degrees, order). No MPI,
// no GPU: the communicator backends build their groups from it, and the unit
// tests check it for worlds of thousands of ranks.
//
// Ranks are numbered with the axes of `order` nested fastest first. The default
// "tp-cp-dp-pp" is Megatron's: tp fastest, so the ranks of one tp group are
// consecutive and sit inside one node (tp traffic is the heaviest and the most
// latency-bound), then cp (its K/V exchange every layer is next), then dp,
// then pp slowest. With coordinates (t, c, d, p):
//   rank = t + tp * (c + cp * (d + dp * p)).
// A gradient sums over the ranks that differ only in cp and dp (each holds a
// part of every sequence, or other sequences): the dpcp group, ordered cp
// fastest.
// A group of kind `a` is the set of ranks that agree on every coordinate but a;
// its members are listed by their coordinate along a, which is also their rank
// inside the group (and, because the map is monotone, ascending world rank).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace weft {
struct Layout;
}

namespace weft::parallel {

enum class Axis { tp, cp, pp, dp };
const char* to_string(Axis a);

// The nesting of the axes in the rank numbering, fastest first.
struct RankOrder {
  std::array<Axis, 4> fastest_first = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};

  // A permutation of tp, cp, dp and pp, e.g. "tp-cp-dp-pp", or of tp, dp and
  // pp, cp then sitting right after tp; InputError otherwise.
  static RankOrder parse(const std::string& text);
  std::string to_string() const;
  bool operator==(const RankOrder&) const = default;
};

// A rank's position along each axis (its rank inside its tp, cp, pp and dp group).
struct RankCoords {
  int64_t tp = 0;
  int64_t pp = 0;
  int64_t dp = 0;
  int64_t cp = 0;

  int64_t operator[](Axis a) const { return a == Axis::tp ? tp : a == Axis::pp ? pp : a == Axis::dp ? dp : cp; }
  bool operator==(const RankCoords&) const = default;
};

// Everything one rank needs to build its communicators.
struct RankGroups {
  int64_t rank = 0;
  RankCoords coords;
  // World ranks of the members of this rank's groups, in group-rank order;
  // dpcp: the ranks that differ only in cp and dp, cp fastest.
  std::vector<int64_t> tp, pp, dp, cp, dpcp;
  // Which group of each kind this rank is in, 0 .. world / size(kind) - 1: the
  // "color" of an MPI_Comm_split.
  int64_t tp_group = 0, pp_group = 0, dp_group = 0, cp_group = 0, dpcp_group = 0;

  const std::vector<int64_t>& members(Axis a) const;
  int64_t group_index(Axis a) const;
};

class RankGrid {
 public:
  // Throws InputError unless every degree is >= 1 and tp * cp * pp * dp == world.
  RankGrid(int64_t world, int64_t tp, int64_t pp, int64_t dp, RankOrder order = {}, int64_t cp = 1);
  // The (tp, cp, pp, dp) of a layout over `world` ranks.
  static RankGrid of_layout(const Layout& layout, int64_t world, RankOrder order = {});

  int64_t world() const { return world_; }
  int64_t size(Axis a) const;
  const RankOrder& order() const { return order_; }

  // InternalError for a rank outside [0, world) or coordinates outside the grid.
  RankCoords coords(int64_t rank) const;
  int64_t rank_of(const RankCoords& c) const;

  // The world ranks of `rank`'s group along `a`, in group-rank order.
  std::vector<int64_t> group(Axis a, int64_t rank) const;
  // The index of `rank`'s group among all groups along `a`.
  int64_t group_index(Axis a, int64_t rank) const;
  // The ranks that agree with `rank` on every coordinate but cp and dp,
  // ordered cp fastest (the gradient sum and ZeRO shards), and the index of
  // that group among all of them.
  std::vector<int64_t> dpcp_group(int64_t rank) const;
  int64_t dpcp_group_index(int64_t rank) const;
  // Every group along `a`, indexed by group_index.
  std::vector<std::vector<int64_t>> all_groups(Axis a) const;

  // The rank `delta` steps along `a` from `rank`, wrapping around the group
  // (a pipeline ring: pp_rank + 1 is the next stage, the last wraps to the first).
  int64_t shift(Axis a, int64_t rank, int64_t delta) const;

  RankGroups groups_of(int64_t rank) const;

 private:
  int64_t stride(Axis a) const;

  int64_t world_;
  std::array<int64_t, 4> sizes_;  // indexed by Axis
  RankOrder order_;
};

// The pure function the backends call: this rank's coordinates and groups.
RankGroups rank_groups(int64_t world, int64_t tp, int64_t pp, int64_t dp, int64_t rank,
                       RankOrder order = {}, int64_t cp = 1);

// A one-way point-to-point channel between two ranks of a group.
struct RingChannel {
  int64_t from = 0, to = 0;
  bool operator==(const RingChannel&) const = default;
};

// The channels between ring neighbours (r and r + 1 mod size, both ways)
// that `rank` of a group of `size` takes part in, in the order it must make
// them when making one blocks until its other rank makes it too: edge e
// joins e and e + 1, each rank makes its edges in increasing e, and each
// edge's two channels in a fixed order, so every creation finds its peer
// (the NCCL backend's point-to-point communicators). Empty for one rank; a
// group of two has one edge.
std::vector<RingChannel> ring_channels(int64_t size, int64_t rank);

}  // namespace weft::parallel
