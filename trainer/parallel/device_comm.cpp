#include "trainer/parallel/device_comm.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::parallel {

namespace {
std::atomic<int64_t> g_staging{0}, g_staging_peak{0};
}  // namespace

int64_t device_comm_staging_bytes() { return g_staging.load(); }
int64_t device_comm_staging_peak() { return g_staging_peak.load(); }
void device_comm_staging_add(int64_t bytes) {
  const int64_t now = g_staging.fetch_add(bytes) + bytes;
  int64_t peak = g_staging_peak.load();
  while (now > peak && !g_staging_peak.compare_exchange_weak(peak, now)) {
  }
}

const char* to_string(DeviceCommKind k) { return k == DeviceCommKind::nccl ? "nccl" : "mpi"; }

void device_comm_check_request(const std::string& request) {
  if (request != "auto" && request != "nccl" && request != "mpi")
    throw InputError(fmt::format("--comm '{}' is not valid; use nccl (a GPU per rank), mpi (ranks may share a GPU: "
                                 "tensors staged through host memory, for checking rather than speed) or auto",
                                 request));
}

namespace {

// "ranks 0 and 1", "ranks 0, 2, 4 and 6", "ranks 0, 1, 2, ... (8 ranks)".
std::string rank_list(const std::vector<int64_t>& ranks) {
  if (ranks.size() > 4) return fmt::format("ranks {}, {}, {}, ... ({} ranks)", ranks[0], ranks[1], ranks[2], ranks.size());
  std::string s = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    s += fmt::format("{}{}", i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ", ranks[i]);
  return s;
}

}  // namespace

DeviceCommChoice device_comm_decide(const std::string& request, const std::vector<std::string>& uuids,
                                    bool have_nccl) {
  device_comm_check_request(request);
  std::map<std::string, std::vector<int64_t>> by_gpu;
  for (size_t r = 0; r < uuids.size(); ++r) by_gpu[uuids[r]].push_back(int64_t(r));
  DeviceCommChoice c;
  const std::vector<int64_t>* shared = nullptr;
  for (const auto& [gpu, ranks] : by_gpu) {
    if (int64_t(ranks.size()) > c.ranks_per_device) {
      c.ranks_per_device = int64_t(ranks.size());
      shared = &ranks;
    }
  }
  const std::string sharing =
      shared ? fmt::format("{} share one GPU{}", rank_list(*shared),
                           by_gpu.size() > 1 ? fmt::format(" ({} GPUs for {} ranks)", by_gpu.size(), uuids.size()) : "")
             : "";
  if (request == "nccl") {
    if (!have_nccl) throw InputError("--comm nccl: this build has no NCCL; use --comm mpi or auto");
    if (shared)
      throw InputError(fmt::format("--comm nccl: {}, and NCCL needs a GPU per rank (it refuses with \"Duplicate GPU "
                                   "detected\"); use --comm mpi or auto, or start one rank per GPU",
                                   sharing));
    c.kind = DeviceCommKind::nccl;
    c.why = "asked for (--comm nccl); every rank has a GPU of its own";
    return c;
  }
  if (request == "mpi") {
    c.kind = DeviceCommKind::mpi;
    c.why = fmt::format("asked for (--comm mpi){}; tensors are staged through pinned host memory, for checking, not "
                        "speed",
                        shared ? "; " + sharing : "");
    return c;
  }
  if (shared) {
    c.kind = DeviceCommKind::mpi;
    c.why = fmt::format("{}, which NCCL refuses: tensors travel over MPI through pinned host memory, for checking, "
                        "not speed (timings are not those of separate GPUs)",
                        sharing);
  } else if (!have_nccl) {
    c.kind = DeviceCommKind::mpi;
    c.why = "this build has no NCCL: tensors travel over MPI through pinned host memory, for checking, not speed";
  } else {
    c.kind = DeviceCommKind::nccl;
    c.why = fmt::format("each of the {} ranks has a GPU of its own", uuids.size());
  }
  return c;
}

}  // namespace weft::parallel
