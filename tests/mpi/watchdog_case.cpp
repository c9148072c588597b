// Run by run_expect_exit.cmake under `mpirun -np 2`; never exits 0 on purpose.
//   hang: rank 0 waits in a recv its peer never sends, under a 1 s watchdog
//         that must end the job with CommWatchdog::kExitCode and its message.
//   die:  rank 1 kills itself while rank 0 waits in the same recv; the job
//         must end, not hang. OpenMPI's mpirun tears it down within about a
//         second (exit 137); rank 0's 20 s watchdog is the backstop where an
//         MPI launcher does not.
#include <csignal>
#include <cstdio>
#include <string>

#include "trainer/parallel/comm_mpi.h"
#include "trainer/parallel/comm_watchdog.h"

using namespace weft::parallel;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "hang" && mode != "die") {
    std::fprintf(stderr, "usage: watchdog_case hang|die\n");
    return 2;
  }
  ProcessGroups g = mpi_process_groups(1, 1, mpi_world_size());
  if (g.world->size() != 2) {
    std::fprintf(stderr, "watchdog_case needs 2 ranks\n");
    return 2;
  }
  // Rank 1's watchdog is only a safety net for a broken test.
  CommWatchdog w(g.world->rank() == 0 ? (mode == "hang" ? 1.0 : 20.0) : 30.0);
  w.watch(g);
  CommWatchdog::Scope armed(w, "step 1");
  g.world->barrier();
  if (g.world->rank() == 0) {
    int32_t x = 0;
    g.world->recv(&x, 1, 1, 7);
  } else if (mode == "die") {
    std::raise(SIGKILL);
  } else {
    g.dp->barrier();  // rank 0 never joins
  }
  std::fprintf(stderr, "watchdog_case: rank %lld got past the hang\n", (long long)g.world->rank());
  return 3;
}
