// The MPI device backend of Comm: collectives and point-to-point on device
// buffers for ranks that share a GPU, where NCCL refuses to run ("Duplicate
// GPU detected": it needs a device per rank). Each call stages the buffers
// through pinned host memory and runs the MPI host backend's operation on
// them. It exists to run every multi-rank path of the GPU trainer on a
// machine with one GPU, not for speed: its transfers cost two host copies and
// a stream synchronisation each, and the cost model never prices it.
//
// Stream order, as the NCCL backend keeps it: before a transfer the host
// waits for the compute stream given at construction (every kernel that may
// still write a buffer is done); the copy back to the device is queued on that
// stream, so a kernel launched after the call sees the result. A staging
// buffer is reused only after the copy that reads it has run.
//
// Arithmetic: bf16 buffers are summed in fp32 on the host and rounded to bf16
// once (NCCL rounds at every step of its ring; the tests' bf16 rule holds
// either way); max is exact. Non-reducing operations move bf16 as bytes.
//
// The non-blocking collectives run at once (Comm's defaults): every member
// of a group runs the same schedule, so blocking where NCCL would queue keeps
// the order and loses only the overlap. isend and irecv stay non-blocking, as
// the pipeline's and the cp ring's exchanges need.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "trainer/parallel/process_groups.h"

namespace weft {
struct Layout;
}

namespace weft::parallel {

// A device communicator over `host` (an MPI communicator of the same ranks,
// kept alive by `keep`), ordered after `compute_stream` (a cudaStream_t).
// With `cancel`, a staging buffer an abandoned operation may still be written
// by is leaked rather than freed.
std::unique_ptr<Comm> mpi_device_comm(std::shared_ptr<void> keep, Comm& host, void* compute_stream,
                                      const std::atomic<bool>* cancel = nullptr);

// This rank's world, tp, pp, dp, cp (and dpcp, tp-side) groups on device
// buffers over MPI, each over an MPI communicator of its own, with a second
// set of MPI groups beside them for the host's scalars (ProcessGroups::host),
// ordered after `compute_stream` (a cudaStream_t; null: the legacy default
// stream), as nccl_process_groups. Each rank must have selected its device
// first. Collective over the MPI world.
ProcessGroups mpi_device_process_groups(const Layout& layout, void* compute_stream,
                                        const std::atomic<bool>* cancel = nullptr);
// The same with a compute stream of their own that the run computes on, as
// nccl_device_groups makes.
ProcessGroups mpi_device_groups(const Layout& layout, const std::atomic<bool>* cancel);

// Device groups on a new non-blocking CUDA stream: `make(stream)` builds
// them ordered after it, and the groups keep the stream (destroyed after
// their communicators).
ProcessGroups device_groups_on_own_stream(const std::function<ProcessGroups(void* stream)>& make);

}  // namespace weft::parallel
