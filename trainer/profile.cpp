#include "trainer/profile.h"

#include "core/stop.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>

#include <fmt/format.h>

#include "memory/estimate.h"
#include "data/corpus.h"
#include "kernels/gemm/gemm.h"
#include "trainer/parallel/comm_watchdog.h"
#include "trainer/parallel/rank_grid.h"
#include "trainer/run_state.h"

namespace weft::trainer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The machine's speed at this moment, for CPU trials: every rank times the
// same fixed GEMM (256 x 256 x 256, fp32, the trainer's own CPU kernel) at
// once; the slowest rank's median of 8, in seconds. A VM's cores slow down
// and speed up by a quarter over minutes as their host gets busy (measured:
// the same layouts' steps drift that much across a brute-force run), and a
// step measured in a slow minute would lose to one measured in a fast one;
// step / probe does not move with that drift.
double cpu_probe_seconds(parallel::Comm& control) {
  constexpr int64_t n = 256, reps = 8;
  static const std::vector<float> a = [] {
    std::vector<float> v(size_t(n * n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(int64_t(i * 2654435761u % 1000) - 500) / 500.0f;
    return v;
  }();
  std::vector<float> c(size_t(n * n));
  kernels::GemmParams<float> p;
  p.m = p.n = p.k = n;
  p.a = a.data();
  p.b = a.data();
  p.c = c.data();
  p.lda = p.ldb = p.ldc = n;
  int32_t token = 0;
  control.all_reduce(&token, 1, parallel::ReduceOp::max);  // start together: the ranks share the cores
  std::vector<double> t;
  bool ran = true;
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    ran = ran && kernels::launch(p, kernels::Workspace{}) == kernels::Status::ok;
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  // A GEMM that did not run times nothing: 0 on any rank means no probe,
  // and the trial's steps are compared as measured.
  double mine = t[t.size() / 2];
  int32_t failed = ran ? 0 : 1;
  control.all_reduce(&mine, 1, parallel::ReduceOp::max);
  control.all_reduce(&failed, 1, parallel::ReduceOp::max);
  return failed ? 0 : mine;
}

// What one rank saw; the ranks then agree on the trial's outcome.
struct Local {
  TrialStatus status = TrialStatus::ok;
  std::string reason;
};

// Every rank learns the most severe status any rank saw and the message of the
// lowest rank that saw it.
Local agree(parallel::Comm& control, const Local& mine) {
  const int64_t n = control.size(), r = control.rank();
  int64_t key = int64_t(mine.status) * n + (n - 1 - r);
  control.all_reduce(&key, 1, parallel::ReduceOp::max);
  Local all;
  all.status = TrialStatus(key / n);
  if (all.status == TrialStatus::ok) return all;
  const int64_t from = n - 1 - key % n;
  std::array<int64_t, 64> text{};  // the message, up to 511 bytes
  if (r == from) std::memcpy(text.data(), mine.reason.data(), std::min<size_t>(mine.reason.size(), 511));
  control.broadcast(text.data(), int64_t(text.size()), from);
  all.reason = reinterpret_cast<const char*>(text.data());
  if (all.reason.rfind("rank ", 0) != 0) all.reason = fmt::format("rank {}: {}", from, all.reason);
  return all;
}

// Everything one trial builds. Kept alive past the trial when its
// communicators were abandoned: MPI may still complete a pending operation
// into these buffers.
struct TrialState {
  std::atomic<bool> cancel{false};
  std::mutex mu;
  std::string silence;  // the watchdog's message, once it fired
  bool fired_twice = false;
  TrainConfig cfg;
  memory::Arena arena;
  std::unique_ptr<parallel::ProcessGroups> groups;
  std::unique_ptr<parallel::CommWatchdog> watchdog;
  // One of these: the trial on the CPU (fp32), or on the GPU (bf16) with
  // fp32 or bf16 gradients (the layout's grad knob).
  std::unique_ptr<Run<float>> cpu_run;
  std::unique_ptr<Run<kernels::bf16>> gpu_run;
  std::unique_ptr<Run<kernels::bf16, kernels::bf16>> gpu_run_bf16_grads;

  explicit TrialState(std::unique_ptr<memory::Allocator> a) : arena(std::move(a)) {}
};

// Abandoned trials' state, freed only at process exit.
std::vector<std::unique_ptr<TrialState>>& graveyard() {
  static auto* g = new std::vector<std::unique_ptr<TrialState>>();
  return *g;
}

}  // namespace

int64_t arena_reservation(const TrainConfig& t, int64_t world_rank, int64_t world, double slack) {
  memory::MemoryOptions all;
  all.all_stages = true;
  const auto mem = memory::estimate(t.model, t.run, t.layout, t.device, all);
  const auto grid = parallel::RankGrid::of_layout(t.layout, world);
  const auto& stage = mem.stages[size_t(grid.coords(world_rank).pp)];
  // The arena holds every category but the runtime overhead (the process and
  // its libraries).
  int64_t bytes = stage.total - stage.bytes[size_t(memory::Category::overhead)];
  return int64_t(std::ceil(double(bytes) * (1 + slack))) + (int64_t{1} << 20);
}

const char* to_string(TrialStatus s) {
  switch (s) {
    case TrialStatus::ok: return "ok";
    case TrialStatus::timeout: return "timeout";
    case TrialStatus::out_of_memory: return "oom";
    case TrialStatus::failed: return "failed";
    case TrialStatus::stopped: return "stopped";
  }
  return "?";
}

TrialStatus trial_status_parse(const std::string& s) {
  for (auto v : {TrialStatus::ok, TrialStatus::timeout, TrialStatus::out_of_memory, TrialStatus::failed,
                 TrialStatus::stopped})
    if (s == to_string(v)) return v;
  throw InputError(fmt::format("trial status '{}' is not one of ok, timeout, oom, failed", s));
}

TrialOutcome profile_layout(const ProfileConfig& pc, parallel::Comm& control, const GroupFactory& make_groups) {
  const auto t_start = Clock::now();
  const int64_t world = control.size(), rank = control.rank();
  if (pc.fault == TrialFault::die) {
    std::fprintf(stderr, "rank %lld: exiting in trial %s (test fault)\n", static_cast<long long>(rank),
                 pc.train.layout.to_string().c_str());
    std::fflush(stderr);
    // layering-ok: the test fault stands for a trial that kills its process
    std::_Exit(137);
  }
  // The refuse_memory fault makes the host refuse any block over 1 MiB, as a
  // full device would refuse the reservation.
  const bool gpu = pc.train.device.kind == DeviceKind::gpu;
  auto memory_from = [&] { return gpu ? memory::device_allocator() : memory::host_allocator(); };
  auto st = std::make_unique<TrialState>(pc.fault == TrialFault::refuse_memory
                                             ? memory::limited_allocator(int64_t{1} << 20, memory_from())
                                             : memory_from());
  st->cfg = pc.train;
  TrainConfig& cfg = st->cfg;
  TrialOutcome out;
  Local mine;

  // Up front and before any collective on the trial's groups: the memory.
  try {
    if (pc.reserve) st->arena.reserve(arena_reservation(pc.train, rank, world, pc.reserve_slack));
  } catch (const memory::OutOfMemory& e) {
    mine = {TrialStatus::out_of_memory, e.what()};
  }
  Local all = agree(control, mine);

  bool abandoned = false;
  std::vector<double> times;
  if (all.status == TrialStatus::ok) {
    try {
      if (make_groups) {
        st->groups = std::make_unique<parallel::ProcessGroups>(make_groups(cfg.layout, &st->cancel));
        TrialState* s = st.get();
        st->watchdog = std::make_unique<parallel::CommWatchdog>(pc.silence_s, [s](const std::string& m) {
          std::lock_guard lk(s->mu);
          if (s->silence.empty()) {
            // First silence: abandon the trial's waits, and give the rank
            // one more period to reach the agreement.
            s->silence = m;
            s->cancel.store(true);
            s->watchdog->arm("abandoning the trial");
            return;
          }
          std::fprintf(stderr, "%s; the trial could not be abandoned, exiting (the tuning journal "
                               "records the trial: a re-run skips it)\n", m.c_str());
          std::fflush(stderr);
          // layering-ok: the trial's waits did not end when cancelled, so the rank cannot go on
          std::_Exit(parallel::CommWatchdog::kExitCode);
        });
        // On GPUs the host (MPI) groups: their waits are the ones a cancel ends.
        st->watchdog->watch(st->groups->host ? *st->groups->host : *st->groups);
        cfg.groups = st->groups.get();
        cfg.watchdog = st->watchdog.get();
      }
      data::TokenData data = data::token_data_open(data::data_spec_or_corpus(cfg.data));
      auto build = [&]<typename R>(std::unique_ptr<R>& run) {
        run = std::make_unique<R>(cfg, std::move(data), &st->arena);
        run->init(cfg.seed);
      };
      if (!gpu)
        build(st->cpu_run);
      else if (cfg.layout.grad == GradPrecision::bf16)
        build(st->gpu_run_bf16_grads);
      else
        build(st->gpu_run);
    } catch (const memory::OutOfMemory& e) {
      mine = {TrialStatus::out_of_memory, e.what()};
    } catch (const std::exception& e) {
      mine = {TrialStatus::failed, e.what()};
    }
    // Building the stage communicates nothing, so a failure here is agreed
    // on before the first step.
    all = agree(control, mine);
  }

  // The timed steps, for either run.
  auto timed_steps = [&](auto& run) {
    if (st->watchdog) st->watchdog->arm(fmt::format("trial {}", cfg.layout.to_string()));
    // Timed steps run until there are `timed_steps` of them and they took
    // `min_timed_s` (short steps are noisy), up to `max_timed_steps`; the
    // ranks agree on stopping in one all-reduce per step.
    double timed = 0;
    try {
      for (int64_t i = 0;; ++i) {
        if (pc.fault == TrialFault::hang && i == 0) {
          while (!st->cancel.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          throw parallel::CommAbandoned(fmt::format("rank {}: stopped before its first step (test fault)", rank));
        }
        const auto t0 = Clock::now();
        const double loss = run.step_loss(i);
        {
          using R = std::remove_reference_t<decltype(run)>;
          parallel::CommWatchdog::Waiting w(R::kDevice ? st->watchdog.get() : nullptr, R::kGpuWait);
          run.optim.step(i + 1, loss);
          memory::synchronize(run.stage.stream());  // the update is part of the step
        }
        const double dt = seconds_since(t0);
        if (i >= pc.warmup_steps) {
          times.push_back(dt);
          timed += dt;
        }
        out.losses.push_back(loss);
        out.steps = i + 1;
        const int64_t n = int64_t(times.size());
        std::array<int32_t, 3> flags{
            n < pc.timed_steps || (timed < pc.min_timed_s && n < pc.max_timed_steps) ? 1 : 0,
            pc.time_limit_s > 0 && seconds_since(t_start) > pc.time_limit_s ? 1 : 0, stop_requested() ? 1 : 0};
        run.groups.host_groups().world->all_reduce(flags.data(), 3, parallel::ReduceOp::max);
        if (flags[2]) {
          mine = {TrialStatus::stopped, fmt::format("stopped by a signal after {} steps", i + 1)};
          break;
        }
        if (!flags[0]) break;
        if (flags[1]) {
          mine = {TrialStatus::timeout, fmt::format("past the trial time limit of {:g} s after {} steps",
                                                    pc.time_limit_s, i + 1)};
          break;
        }
      }
    } catch (const parallel::CommAbandoned& e) {
      abandoned = true;
      std::lock_guard lk(st->mu);
      mine = {TrialStatus::timeout, st->silence.empty() ? std::string(e.what()) : std::string(st->silence)};
    } catch (const memory::OutOfMemory& e) {
      abandoned = true;
      mine = {TrialStatus::out_of_memory, e.what()};
    } catch (const std::exception& e) {
      abandoned = true;
      mine = {TrialStatus::failed, e.what()};
    }
    if (abandoned) st->cancel.store(true);  // no request may wait on a peer that left
    all = agree(control, mine);
    if (st->watchdog) st->watchdog->disarm();
  };
  if (all.status == TrialStatus::ok) {
    if (st->gpu_run_bf16_grads)
      timed_steps(*st->gpu_run_bf16_grads);
    else if (st->gpu_run)
      timed_steps(*st->gpu_run);
    else {
      const double before = cpu_probe_seconds(control);
      timed_steps(*st->cpu_run);
      // The ranks agreed on the steps' outcome, so all of them take this
      // branch or none; the probe's all-reduces are on the control group.
      if (all.status == TrialStatus::ok) {
        const double after = cpu_probe_seconds(control);
        out.probe_s = before > 0 && after > 0 ? 0.5 * (before + after) : 0;
      }
    }
  }

  // Measurements, agreed: the slowest rank's median step and every rank's peak.
  if (all.status == TrialStatus::ok && !times.empty()) {
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    out.step_s = times[n / 2];
    // The median's relative standard error, from the interquartile range
    // (robust to the odd slow step): sigma ~ IQR / 1.349, and the median of
    // n steps varies by 1.2533 sigma / sqrt(n).
    if (n >= 3 && out.step_s > 0) {
      const double iqr = times[(3 * n) / 4] - times[n / 4];
      out.step_noise = 1.2533 * (iqr / 1.349) / std::sqrt(double(n)) / out.step_s;
    }
  }
  control.all_reduce(&out.step_s, 1, parallel::ReduceOp::max);
  control.all_reduce(&out.step_noise, 1, parallel::ReduceOp::max);
  out.peak_bytes.assign(size_t(world), 0);
  const int64_t peak = st->arena.peak_total();
  control.all_gather(&peak, out.peak_bytes.data(), 1);
  out.status = all.status;
  out.reason = all.reason;
  if (abandoned || all.status == TrialStatus::timeout) {
    if (st->watchdog) st->watchdog->disarm();
    graveyard().push_back(std::move(st));
  }
  out.seconds = seconds_since(t_start);
  return out;
}

}  // namespace weft::trainer
