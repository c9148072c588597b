// The MPI backend of Comm, on host memory: the CPU trainer's transport and the
// one every multi-rank test in CI runs on. mpi.h stays out of this header so
// that code choosing a backend needs no MPI include path.
//
// MPI is initialised on first use with MPI_Init_thread(MPI_THREAD_FUNNELED):
// only the thread that made the first call may communicate (the CommWatchdog
// thread never calls MPI). If weft initialised MPI, MPI_Finalize runs at
// process exit, after the communicators still alive have been freed; if the
// program initialised MPI itself, finalising stays its job.
//
// Every communicator has MPI_ERRORS_RETURN, and every MPI call goes through
// WEFT_MPI_CHECK, so an MPI error becomes a CommError naming the rank, call,
// file and line instead of an abort (where the MPI library lets it return).
//
// Cancelling. Every operation starts a non-blocking MPI operation (MPI_Iallreduce,
// MPI_Isend, MPI_Ibarrier, ...) and waits for it by polling MPI_Test, so that
// a trial whose ranks no longer meet (one never arrives at a collective) can
// be abandoned without ending the process: a communicator made with a cancel
// flag checks it between polls, and once another thread sets it the waiting
// call throws CommAbandoned (comm.h) and so does every later call on that
// communicator. The wait spins for 50 us, then yields the core between polls,
// and after 1 ms sleeps about 100 us per poll, so that ranks oversubscribing
// their cores (CI runs 8 ranks on 2) leave the cores to the peers they wait
// for.
//
// MPI cannot cancel a started collective: an abandoned operation stays pending
// inside MPI, which may still complete it. MPI_Comm_free on a communicator with
// a pending collective is erroneous, so the caller must leak every abandoned
// communicator (release() its unique_ptr, or the owned ones of its
// ProcessGroups) together with the buffers of its pending operations, and the
// flag must outlive them. Making communicators is itself collective and
// blocking, and does not watch the flag.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "trainer/parallel/process_groups.h"
#include "trainer/parallel/rank_grid.h"

namespace weft {
struct Layout;
}

namespace weft::parallel {

// Initialises MPI if nobody has; records this process's world rank for error
// messages (process_rank()). Safe to call more than once.
void mpi_init();
int64_t mpi_world_size();
int64_t mpi_world_rank();

// This rank's world, tp, pp, dp and cp groups (and dpcp, dp x cp) for a
// grid of tp * cp * pp * dp ranks, each an MPI communicator split from a
// duplicate of MPI_COMM_WORLD along RankGrid, ranked by the rank's coordinate
// on the group's axis. Collective over the world. InputError ("layout
// tp2-pp2-dp1 needs 4 ranks, mpirun started 3") when the grid does not match
// the MPI world size; every rank throws it. With `cancel`, every
// communicator of the groups can be abandoned through it.
ProcessGroups mpi_process_groups(int64_t tp, int64_t pp, int64_t dp, RankOrder order = {},
                                 const std::atomic<bool>* cancel = nullptr, int64_t cp = 1);
ProcessGroups mpi_process_groups(const Layout& layout, RankOrder order = {},
                                 const std::atomic<bool>* cancel = nullptr);

// A group split from `base` (an MPI group of this file's): the ranks of
// `base` with equal `color`, ranked by `key`, named `name` in messages.
// Collective over `base`; InternalError if it is not an MPI group.
std::unique_ptr<Comm> mpi_split(Comm& base, int64_t color, int64_t key, const std::string& name,
                                const std::atomic<bool>* cancel = nullptr);

// A new duplicate of MPI_COMM_WORLD named `name` in messages: a channel of its
// own, e.g. the tuner's control channel, which stays usable when the groups of
// an abandoned trial are not. Collective over the world.
std::unique_ptr<Comm> mpi_world_dup(const std::string& name,
                                    const std::atomic<bool>* cancel = nullptr);

}  // namespace weft::parallel
