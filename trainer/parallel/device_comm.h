// Which communicator carries a GPU run's tensors, chosen in one place by
// what the ranks share: NCCL where every rank has a GPU of its own, the MPI
// device communicator (comm_mpi_device.h) where ranks share one, which NCCL
// refuses. The choice and its reason go into the run header.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/parallel/process_groups.h"

namespace weft {
struct Layout;
}

namespace weft::parallel {

enum class DeviceCommKind { nccl, mpi };
const char* to_string(DeviceCommKind k);

struct DeviceCommChoice {
  DeviceCommKind kind = DeviceCommKind::nccl;
  // The most ranks that share one GPU, over the world (1: a GPU each). A
  // rank's memory is its GPU's memory over this.
  int64_t ranks_per_device = 1;
  std::string why;  // for the run header: "ranks 0-1 share one GPU (...)"
};

// Reads `request` (nccl, mpi or auto; InputError naming it otherwise) and,
// collective over the MPI world, which GPU every rank selected (by its UUID):
// auto takes NCCL when no two ranks share one and the build has NCCL, else the
// MPI device communicator. nccl where ranks share a GPU, or in a build
// without NCCL, is refused with the reason. Each rank must have selected its
// device. Ranks that share a GPU need it in the Default compute mode: any
// other is refused, naming the mode.
DeviceCommChoice device_comm_choose(const std::string& request);

// The rule for a request without asking the ranks: throws InputError for a
// value other than nccl, mpi or auto.
void device_comm_check_request(const std::string& request);

// The same choice from already-gathered facts, for tests: uuids[r] is rank r's
// GPU (16 bytes each, as text), have_nccl whether the build has NCCL.
DeviceCommChoice device_comm_decide(const std::string& request, const std::vector<std::string>& uuids,
                                    bool have_nccl);

// The pinned host memory the MPI device communicators of this process hold
// (bytes): now, and the most at once. Process state, like process_rank: the
// staging pools report each allocation and release; the run's memory table
// sets the peak beside memory::host_staging_bytes.
int64_t device_comm_staging_bytes();
int64_t device_comm_staging_peak();
void device_comm_staging_add(int64_t bytes);

// This rank's device groups on the chosen communicator (nccl_device_groups or
// mpi_device_groups). Collective over the MPI world.
ProcessGroups device_process_groups(DeviceCommKind kind, const Layout& layout, const std::atomic<bool>* cancel);

}  // namespace weft::parallel
