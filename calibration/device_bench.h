// The timing harness behind `weft calibrate` (calibration/measure_device.h):
// buffers in an arena of the device, launches through the kernels' launch
// protocol on one stream, and times taken on every rank at once and reported
// as the slowest rank's. Internal to calibration/.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <type_traits>
#include <vector>

#include "calibration/measure_device.h"
// Every family's launch protocol, declared before Bench::run names it (a
// qualified call in a template sees only what precedes the template).
#include "kernels/adamw/adamw.h"
#include "kernels/attention/attention.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/kernel.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "memory/arena.h"
#include "memory/device.h"

namespace weft::calibration {

// The shard shapes of one tensor-parallel degree and micro-batch.
struct Shard {
  int64_t M, T, B, C, Hl, Kl, D, Fl, Vl, tp;
};

// Buffers, launches and timing on one device, in Elem (float on the CPU,
// bf16 on a GPU).
template <typename Elem>
class Bench {
 public:
  using A = kernels::Acc<Elem>;
  using Clock = std::chrono::steady_clock;

  Bench(const DeviceSpec& device, parallel::Comm& world, double min_seconds, int64_t flush_bytes)
      : flush_bytes_(flush_bytes),
        base_flush_(flush_bytes),
        gpu_(device.kind == DeviceKind::gpu),
        arena_(gpu_ ? memory::device_allocator() : memory::host_allocator()),
        stream_(gpu_ ? kernels::Backend::cuda : kernels::Backend::cpu),
        world_(world),
        min_seconds_(min_seconds) {}

  kernels::Stream stream() const { return stream_.get(); }
  // Measurements of a shard cycle through flush_for(shard) bytes of copies
  // (at least the cache-based default).
  void set_flush(std::function<int64_t(const Shard&)> flush_for) { flush_for_ = std::move(flush_for); }
  void use_shard(const Shard& s) {
    if (flush_for_) flush_bytes_ = std::max(base_flush_, flush_for_(s));
  }
  kernels::Backend backend() const { return stream().backend; }

  // How many copies of a measurement's buffers (set_bytes together) to
  // cycle through so that each call finds its data out of the cache, as in
  // a training step, where every kernel's operands were last touched a whole
  // layer or step ago: a kernel timed on the same hot buffers again and
  // again runs 10-20% faster than it does in training.
  int copies_for(int64_t set_bytes) const {
    return int(std::clamp<int64_t>((flush_bytes_ + set_bytes - 1) / std::max<int64_t>(set_bytes, 1), 1, 64));
  }
  // `copies` buffers of n elements each (see buffer()).
  template <typename T>
  std::vector<T*> buffers(int copies, int64_t n, double value = 0.01) {
    std::vector<T*> v;
    for (int i = 0; i < copies; ++i) v.push_back(buffer<T>(n, value));
    return v;
  }
  // A buffer of n elements filled with `value` (never zeros: some kernels
  // take other paths on them); freed by clear().
  template <typename T>
  T* buffer(int64_t n, double value = 0.01) {
    T* p = arena_.allocate_as<T>(memory::Category::workspace, std::max<int64_t>(n, 1), "calibration");
    held_.push_back(p);
    if constexpr (std::is_same_v<T, Elem> || std::is_same_v<T, A>)
      kernels::status_check(kernels::launch(kernels::FillParams<T>{.n = n, .value = value, .x = p}, {}, stream()), "fill");
    return p;
  }
  void clear() {
    memory::synchronize(stream());
    for (void* p : held_) arena_.release(p);
    held_.clear();
    if (workspace_) arena_.release(workspace_);
    workspace_ = nullptr;
    workspace_bytes_ = 0;
  }

  template <typename P>
  void run(const P& p, const char* op) {
    const int64_t need = kernels::workspace_bytes(p, backend());
    if (need > workspace_bytes_) {
      if (workspace_) arena_.release(workspace_);
      workspace_ = arena_.allocate(memory::Category::workspace, need, "calibration.workspace");
      workspace_bytes_ = need;
    }
    kernels::status_check(kernels::launch(p, kernels::Workspace{workspace_, workspace_bytes_}, stream()), op);
  }

  // Seconds per call of f(copy): repeated over the copies until
  // min_seconds passed (3 calls at least) after a warm-up round, on every
  // rank at once; the slowest rank's.
  double time(const std::function<void(int)>& f, int copies = 1) {
    world_.barrier();
    for (int i = 0; i < copies; ++i) f(i);
    memory::synchronize(stream());
    int64_t reps = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    int64_t batch = 1;
    while (reps < 3 || elapsed < min_seconds_) {
      for (int64_t i = 0; i < batch; ++i) f(int((reps + i) % copies));
      memory::synchronize(stream());
      reps += batch;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      batch = std::min<int64_t>(batch * 2, 64);
    }
    double per_call = elapsed / double(reps);
    world_.all_reduce(&per_call, 1, parallel::ReduceOp::max);
    return per_call;
  }

  // The same for a collective: every rank of its group must call it equally
  // often, so the count comes from the slowest rank's first call.
  double time_collective(const std::function<void()>& f) {
    world_.barrier();
    f();
    auto t0 = Clock::now();
    f();
    double first = std::chrono::duration<double>(Clock::now() - t0).count();
    world_.all_reduce(&first, 1, parallel::ReduceOp::max);
    const int64_t reps = std::clamp<int64_t>(int64_t(std::ceil(min_seconds_ / std::max(first, 1e-9))), 3, 200);
    world_.barrier();
    t0 = Clock::now();
    for (int64_t i = 0; i < reps; ++i) f();
    double per_call = std::chrono::duration<double>(Clock::now() - t0).count() / double(reps);
    world_.all_reduce(&per_call, 1, parallel::ReduceOp::max);
    return per_call;
  }

 private:
  int64_t flush_bytes_;
  int64_t base_flush_;
  std::function<int64_t(const Shard&)> flush_for_;
  bool gpu_;
  memory::Arena arena_;
  memory::OwnedStream stream_;
  parallel::Comm& world_;
  double min_seconds_;
  std::vector<void*> held_;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
};

inline std::vector<Shard> shards(const DeviceCalibration& c) {
  const auto& m = c.model;
  std::vector<Shard> out;
  for (int64_t tp : c.tps)
    for (int64_t mb : c.mbs) {
      if (tp < 1 || mb < 1 || m.heads % tp || m.kv_heads % tp || m.intermediate % tp) continue;
      out.push_back({mb * c.run.seq, c.run.seq, mb, m.hidden, m.heads / tp, m.kv_heads / tp, m.head_dim,
                     m.intermediate / tp, m.padded_vocab(tp) / tp, tp});
    }
  return out;
}

// The collectives and point-to-point transfers of every group size that
// divides the world (measure_comm.cpp), for Elem = float and bf16.
template <typename Elem>
void measure_comm(Bench<Elem>& b, const DeviceCalibration& c, parallel::Comm& world, const GroupsFor& groups_for,
                  MeasuredRates& r);

}  // namespace weft::calibration
