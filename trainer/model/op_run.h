// Launching one kernel from the model: checks its status, and with
// WEFT_PROFILE=1 times it and prints the time per op at exit: host time on
// the CPU; on a CUDA stream the device time between events recorded around
// the launch, read back in batches so the stream seldom waits for them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "memory/device.h"

namespace weft::trainer {

// WEFT_PROFILE=1 prints the time spent in each op at exit.
struct OpProfile {
  bool on = std::getenv("WEFT_PROFILE") != nullptr;
  std::map<std::string, std::pair<double, int64_t>> ops;
  struct Pending {
    const char* op;
    void* start;
    void* stop;
  };
  std::vector<Pending> pending;  // device launches not yet read back
  void settle() {
    for (const Pending& p : pending) {
      auto& e = ops[p.op];
      e.first += memory::seconds_between(p.start, p.stop);
      ++e.second;
      memory::release_event(p.start);
      memory::release_event(p.stop);
    }
    pending.clear();
  }
  ~OpProfile() {
    if (!on) return;
    settle();
    double total = 0;
    for (auto& [n, v] : ops) total += v.first;
    std::vector<std::pair<double, std::string>> by_time;
    for (auto& [n, v] : ops) by_time.push_back({v.first, n});
    std::sort(by_time.rbegin(), by_time.rend());
    for (auto& [t, n] : by_time)
      std::fprintf(stderr, "%-28s %9.3f s %5.1f%% %8lld calls\n", n.c_str(), t, 100 * t / total,
                   static_cast<long long>(ops[n].second));
  }
};
inline OpProfile& op_profile() {
  static OpProfile p;
  return p;
}

// On a CUDA stream the profile times the enqueue, not the kernel.
template <typename P>
void run(const P& p, kernels::Workspace ws, const char* op, kernels::Stream stream = {}) {
  using kernels::status_check;
  if (!op_profile().on) {
    status_check(kernels::launch(p, ws, stream), op);
    return;
  }
  if (stream.backend == kernels::Backend::cuda) {
    auto& prof = op_profile();
    void* start = memory::record_event(stream);
    status_check(kernels::launch(p, ws, stream), op);
    prof.pending.push_back({op, start, memory::record_event(stream)});
    if (prof.pending.size() >= 4096) prof.settle();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  status_check(kernels::launch(p, ws, stream), op);
  auto& e = op_profile().ops[op];
  e.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++e.second;
}
template <typename P>
void run(const P& p, const char* op) {
  run(p, {}, op);
}

}  // namespace weft::trainer
