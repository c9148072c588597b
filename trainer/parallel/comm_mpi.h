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
#pragma once

#include <cstdint>

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

// This rank's world, tp, pp and dp groups for a grid of tp * pp * dp ranks,
// each an MPI communicator split from a duplicate of MPI_COMM_WORLD along
// RankGrid, ranked by the rank's coordinate on the group's axis. Collective
// over the world. InputError ("layout tp2-pp2-dp1 needs 4 ranks, mpirun started
// 3") when the grid does not match the MPI world size; every rank throws it.
ProcessGroups mpi_process_groups(int64_t tp, int64_t pp, int64_t dp, RankOrder order = {});
ProcessGroups mpi_process_groups(const Layout& layout, RankOrder order = {});

}  // namespace weft::parallel
