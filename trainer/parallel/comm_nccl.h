// The NCCL backend of Comm: collectives and point-to-point between GPUs, one
// NCCL communicator per process group, bootstrapped over the MPI groups of the
// same layout (the unique id travels by an MPI broadcast).
//
// Buffers are device memory. Operations are ordered on the compute stream
// given at construction, without blocking the host: each call makes the
// group's own communication stream wait for the work already queued on the
// compute stream, queues the NCCL operation there, and makes the compute
// stream wait for it. So a kernel launched after a call sees its result, and
// a step needs no host synchronisation for communication; a request's wait()
// orders the compute stream after a non-blocking send or receive in the same
// way. Collectives of different groups run on different streams and may
// overlap each other and compute that does not depend on them.
//
// NCCL has no uneven collectives: all_gather_v is a group of broadcasts and
// reduce_scatter_v a group of reduces, one rooted at each rank.
//
// Point-to-point goes over two-rank communicators per direction between ring
// neighbours (see nccl_comm), each on a stream of its own: NCCL runs one
// stream's calls in order, and a send holds its stream until the peer
// receives.
#pragma once

#include <atomic>
#include <memory>

#include "trainer/parallel/process_groups.h"

namespace weft {
struct Layout;
}

namespace weft::parallel {

// This rank's world, tp, pp and dp groups on NCCL for the layout, one per MPI
// group of mpi_process_groups(layout, {}, cancel), which stay beside them as
// the host groups: collective over the MPI world. Each rank must have
// selected its device (cudaSetDevice) before the call. `compute_stream` is a
// cudaStream_t (null: the legacy default stream); nccl_device_groups makes a
// stream of its own for them, which the run then computes on. `cancel` reaches the MPI host groups only: an
// NCCL operation whose peer is gone is not abandoned.
ProcessGroups nccl_process_groups(const Layout& layout, void* compute_stream,
                                  const std::atomic<bool>* cancel = nullptr);
ProcessGroups nccl_device_groups(const Layout& layout, const std::atomic<bool>* cancel);

// A NCCL communicator spanning the ranks of `bootstrap` (an MPI group, or any
// Comm whose broadcast and point-to-point reach them), named for messages.
// With ring_p2p, sends and receives to the ring neighbours (rank ± 1 mod
// size) go over two-rank communicators of their own, one per direction, so
// that they behave as MPI's non-blocking ones (the pp group has them);
// without, point-to-point is refused. all_to_all reaches every rank either
// way, as one group over the whole communicator. Collective over the
// bootstrap group.
std::unique_ptr<Comm> nccl_comm(Comm& bootstrap, const std::string& name, void* compute_stream,
                                bool ring_p2p = false);

}  // namespace weft::parallel
