// The process groups one rank takes part in, passed explicitly to everything
// that communicates. Ranks are laid out tp fastest, then cp, then dp, then pp
// (trainer/parallel/rank_grid.h).
#pragma once

#include <memory>
#include <vector>

#include "trainer/parallel/comm.h"

namespace weft::parallel {

struct ProcessGroups {
  Comm* world = nullptr;
  Comm* tp = nullptr;
  Comm* pp = nullptr;
  Comm* dp = nullptr;
  // The context-parallel ranks that split each sequence; and the ranks a
  // gradient sums over and ZeRO shards over, dp x cp (cp fastest): the dp
  // group itself when cp is 1.
  Comm* cp = nullptr;
  Comm* dpcp = nullptr;
  // Hybrid sharding (Layout::zero_group): ZeRO's shard group, zero_group
  // consecutive ranks of dpcp, and the replica group, the dpcp ranks that
  // hold the same shard (equal dpcp rank mod zero_group), which all-reduce
  // it. Null without: ZeRO shards over dpcp.
  Comm* shard = nullptr;
  Comm* replica = nullptr;
  // Expert parallelism (Layout::ep): the ep group, ep consecutive ranks of
  // dpcp, whose ranks hold the routed experts between them and exchange the
  // rows routed to them; and the expert data-parallel group, the dpcp ranks
  // of equal dpcp rank mod ep, which hold the same experts. ZeRO shards over
  // the second (shard points at it) and the other parameters then sum over
  // the first (replica points at it; the experts' ranges are left out).
  // Folded over tp (Layout::ep_fold) ep is the tp ranks of ep / tp
  // consecutive ranks of dpcp (tp fastest), replica those dpcp ranks (null
  // at ep = tp) and edp the dpcp ranks of equal dpcp rank mod ep / tp (all
  // of dpcp at ep = tp). Null without.
  Comm* ep = nullptr;
  Comm* edp = nullptr;
  // The tensor-parallel ranks again, on a communicator of their own: the
  // backward's collectives that run beside its GEMMs (the re-gathered inputs
  // of the weight gradients, the input gradients' reduce), so that the tp
  // collectives a GEMM waits on (the output gradient's gather, FP8 amaxes)
  // do not queue behind them on a device. Null: tp serves (one rank, or
  // groups made by hand).
  Comm* tp_side = nullptr;
  // Keeps the CUDA stream of device groups that made their own (declared
  // before the communicators, so it outlives them).
  std::shared_ptr<void> stream_owner;
  // Owns the communicators the pointers refer to.
  std::vector<std::unique_ptr<Comm>> owned;
  // The same groups over host memory, for the scalars a step reduces on the
  // host (the logged loss, the gradient norm) and the checkpoint's gathers,
  // where these communicate device buffers (NCCL); null: these groups take
  // host memory.
  std::shared_ptr<ProcessGroups> host;
  const ProcessGroups& host_groups() const { return host ? *host : *this; }
  // Device groups: the CUDA stream (a cudaStream_t) they order their work
  // after, which the run computes on; null: the legacy default stream, or
  // host groups.
  void* cuda_stream = nullptr;

  Comm& tp_beside() const { return tp_side ? *tp_side : *tp; }
  Comm& zero_shard() const { return shard ? *shard : *dpcp; }
  int64_t tp_rank() const { return tp->rank(); }
  int64_t pp_rank() const { return pp->rank(); }
  int64_t dp_rank() const { return dp->rank(); }
  int64_t cp_rank() const { return cp ? cp->rank() : 0; }
  int64_t cp_size() const { return cp ? cp->size() : 1; }
  int64_t ep_rank() const { return ep ? ep->rank() : 0; }
};

// One process: every group is the single-rank group.
ProcessGroups single_process_groups();

}  // namespace weft::parallel
