// A layout's process groups over MPI (comm_mpi.h): the grid's groups, then
// hybrid sharding's and expert parallelism's, each split from one of them
// with mpi_split.
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/layout.h"
#include "trainer/parallel/comm_mpi.h"

namespace weft::parallel {

namespace {

// Cuts dpcp into blocks of `size` consecutive ranks (cp fastest) and the
// groups across them (the ranks of equal place in their block): hybrid
// sharding's shard and replica groups, expert parallelism's ep and expert
// data-parallel groups. InputError naming the layout where size does not
// divide dp x cp.
std::pair<Comm*, Comm*> split_dpcp(ProcessGroups& g, const Layout& layout, int64_t size, const char* what,
                                   std::pair<const char*, const char*> names, const std::atomic<bool>* cancel) {
  const int64_t ways = g.dpcp->size(), i = g.dpcp->rank();
  if (size < 2 || ways % size != 0)
    throw InputError(fmt::format("layout {}: {} of {} ranks must divide dp x cp = {}", layout.to_string(), what,
                                 size, ways));
  Comm* made[2] = {nullptr, nullptr};
  for (const bool block : {true, false}) {
    g.owned.push_back(mpi_split(*g.dpcp, block ? i / size : i % size, block ? i % size : i / size,
                                block ? names.first : names.second, cancel));
    made[block ? 0 : 1] = g.owned.back().get();
  }
  WEFT_ASSERT(made[0]->size() == size && made[0]->rank() == i % size && made[1]->size() == ways / size);
  return {made[0], made[1]};
}

}  // namespace

ProcessGroups mpi_process_groups(const Layout& layout, RankOrder order,
                                 const std::atomic<bool>* cancel) {
  ProcessGroups g = mpi_process_groups(layout.tp, layout.pp, layout.dp, order, cancel, layout.cp);
  if (layout.hybrid_sharding() && layout.ep > 1)
    throw InputError(fmt::format("layout {}: a ZeRO shard group and ep={} together are not supported",
                                 layout.to_string(), layout.ep));
  // Hybrid sharding: the shard group is zero_group consecutive ranks of
  // dpcp, the replica group every zero_group-th.
  if (layout.hybrid_sharding())
    std::tie(g.shard, g.replica) =
        split_dpcp(g, layout, layout.zero_group, "the ZeRO shard group", {"shard", "replica"}, cancel);
  // Expert parallelism: the ep group is ep consecutive ranks of dpcp, the
  // expert data-parallel group every ep-th; ZeRO shards over the second,
  // and the first sums the other parameters' shards. Folded over tp
  // (Layout::ep_fold) the ep group is the tp ranks of ep / tp consecutive
  // ranks of dpcp (tp fastest), and those dpcp ranks (the replicas) and the
  // expert data-parallel group are the unfolded ones of ep / tp; at ep = tp
  // the expert data-parallel group is all of dpcp and there are no replicas.
  if (layout.ep > 1) {
    const int64_t over = layout.ep_dpcp();
    if (!layout.ep_fold) {
      std::tie(g.ep, g.edp) = split_dpcp(g, layout, layout.ep, "the ep group", {"ep", "edp"}, cancel);
      g.replica = g.ep;
    } else {
      if (layout.tp <= 1 || layout.ep % layout.tp != 0)
        throw InputError(fmt::format("layout {}: epfold needs tp > 1 dividing ep={}", layout.to_string(), layout.ep));
      if (over > 1)
        std::tie(g.replica, g.edp) = split_dpcp(g, layout, over, "the ep group's part over dp x cp",
                                                {"ep-dpcp", "edp"}, cancel);
      else
        g.edp = g.dpcp;
      const int64_t i = g.dpcp->rank(), blocks = g.dpcp->size() / over;
      g.owned.push_back(
          mpi_split(*g.world, g.pp->rank() * blocks + i / over, g.tp->rank() + layout.tp * (i % over), "ep", cancel));
      g.ep = g.owned.back().get();
      WEFT_ASSERT(g.ep->size() == layout.ep && g.ep->rank() == g.tp->rank() + layout.tp * (i % over));
    }
    g.shard = g.edp;
  }
  return g;
}

}  // namespace weft::parallel
