// device_comm's choice where the ranks' GPUs can be asked (CUDA and MPI
// builds).
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/layout.h"
#include "trainer/parallel/comm_mpi.h"
#include "trainer/parallel/comm_mpi_device.h"
#include "trainer/parallel/device_comm.h"
#ifdef WEFT_HAVE_NCCL
#include "trainer/parallel/comm_nccl.h"
#endif

namespace weft::parallel {

namespace {

#ifdef WEFT_HAVE_NCCL
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

const char* compute_mode_name(int mode) {
  switch (mode) {
    case cudaComputeModeDefault: return "Default";
    case cudaComputeModeProhibited: return "Prohibited";
    case cudaComputeModeExclusiveProcess: return "Exclusive_Process";
  }
  return "unknown";
}

}  // namespace

DeviceCommChoice device_comm_choose(const std::string& request) {
  device_comm_check_request(request);
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    throw CommError(fmt::format("rank {}: cannot read which GPU this rank uses: {}", process_rank(),
                                cudaGetErrorString(e)));
  }
  static_assert(sizeof(prop.uuid.bytes) == 16);
  auto world = mpi_world_dup("device-comm");
  std::vector<uint8_t> mine(prop.uuid.bytes, prop.uuid.bytes + 16), all(size_t(16 * world->size()));
  world->all_gather(mine.data(), all.data(), 16);
  std::vector<std::string> uuids;
  for (int64_t r = 0; r < world->size(); ++r)
    uuids.emplace_back(reinterpret_cast<const char*>(all.data() + 16 * r), 16);
  DeviceCommChoice c = device_comm_decide(request, uuids, kHaveNccl);
  int mode = cudaComputeModeDefault;
  if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device) != cudaSuccess) {
    cudaGetLastError();
    mode = cudaComputeModeDefault;  // not told: the first shared use will say
  }
  if (c.ranks_per_device > 1 && mode != cudaComputeModeDefault)
    throw InputError(fmt::format("{} ranks share GPU {} ({}), whose compute mode is {}: only the Default mode lets "
                                 "several processes use one GPU (nvidia-smi --query-gpu=compute_mode --format=csv "
                                 "shows it); start one rank per GPU",
                                 c.ranks_per_device, device, prop.name, compute_mode_name(mode)));
  return c;
}

ProcessGroups device_process_groups(DeviceCommKind kind, const Layout& layout, const std::atomic<bool>* cancel) {
  if (kind == DeviceCommKind::mpi) return mpi_device_groups(layout, cancel);
#ifdef WEFT_HAVE_NCCL
  return nccl_device_groups(layout, cancel);
#else
  throw InputError("this build has no NCCL; use --comm mpi");
#endif
}

}  // namespace weft::parallel
