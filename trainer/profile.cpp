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
// same fixed GEMM (256 x 256 x 256, fp32, the trainer's own CPU kernel)
// `reps` times at once; the slowest rank's median, in seconds. A VM's cores
// slow down and speed up as their host gets busy: by a quarter over minutes
// (the same layouts' steps drift that much across a brute-force run), and
// twofold between hours, in bursts down to a second. A step measured in a
// slow second would lose to one measured in a fast one; step / probe, with
// the probe timed right after each step, does not move with that drift. The
// ranks must arrive together (`comm` just synchronised them).
double cpu_probe_seconds(parallel::Comm& comm, int64_t reps) {
  constexpr int64_t n = 256;
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
  std::vector<double> t;
  bool ran = true;
  for (int64_t r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    ran = ran && kernels::launch(p, kernels::Workspace{}) == kernels::Status::ok;
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  // A GEMM that did not run times nothing: a negative time on any rank
  // means no probe, and the trial's steps are compared as measured.
  double mine = ran ? t[t.size() / 2] : -1;
  std::array<double, 2> v{mine, -mine};  // max of the times, and whether any rank failed
  comm.all_reduce(v.data(), 2, parallel::ReduceOp::max);
  return v[1] > 0 ? 0 : v[0];
}

// Repetitions of the probe's GEMM after each timed step (their median
// counts): about 5% of a step of the tiny model at seq 64 over 4 ranks.
constexpr int64_t kProbeReps = 3;

// The median of v (sorted in place); 0 when empty.
double median_in_place(std::vector<double>& v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The relative standard error of the median of v's values, from their
// interquartile range (robust to the odd slow step): sigma ~ IQR / 1.349,
// and the median of n values varies by 1.2533 sigma / sqrt(n). 0 under 3.
double median_noise(std::vector<double> v) {
  const size_t n = v.size();
  if (n < 3) return 0;
  const double med = median_in_place(v);
  if (med <= 0) return 0;
  const double iqr = v[(3 * n) / 4] - v[n / 4];
  return 1.2533 * (iqr / 1.349) / std::sqrt(double(n)) / med;
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
  // The tuner sends only layouts the model computes as they say (its
  // capacity factor included: model_for): a rule broken here is the
  // tuner's fault, never a trial that measures something else.
  if (const auto v = pc.train.layout.violations(pc.train.model, pc.train.run, world); !v.empty())
    throw InternalError(fmt::format("trial layout {} for {}: {}", pc.train.layout.to_string(), pc.train.model.name,
                                    v.front()));
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
  std::vector<double> times, probes;  // each timed step, and on CPUs the probe right after it
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
        // Routed past the receive buffers the trial sized: on every rank (agreed).
        if (!run.overflow.empty()) throw InputError(fmt::format("step {}: {}", i + 1, run.overflow));
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
        std::array<int32_t, 4> flags{
            n < pc.timed_steps || (timed < pc.min_timed_s && n < pc.max_timed_steps) ? 1 : 0,
            pc.time_limit_s > 0 && seconds_since(t_start) > pc.time_limit_s ? 1 : 0, stop_requested() ? 1 : 0,
            n == 1 && pc.cut_above_s > 0 && dt > pc.cut_above_s ? 1 : 0};
        run.groups.host_groups().world->all_reduce(flags.data(), 4, parallel::ReduceOp::max);
        // The flags agree on every rank, so all of them probe or none.
        if (!std::remove_reference_t<decltype(run)>::kDevice && pc.probe && i >= pc.warmup_steps && !flags[1] &&
            !flags[2])
          probes.push_back(cpu_probe_seconds(*run.groups.host_groups().world, kProbeReps));
        if (flags[2]) {
          mine = {TrialStatus::stopped, fmt::format("stopped by a signal after {} steps", i + 1)};
          break;
        }
        if (flags[3]) {
          out.cut = true;
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
    // The experts' loads of the trial's steps, summed over the ranks (each
    // stage's layers from its first tp and cp rank, as the run's records).
    const ModelSpec& m = cfg.model;
    if (all.status == TrialStatus::ok && m.moe.enabled()) {
      const int64_t E = m.moe.experts;
      run.expert_load.resize(size_t(m.layers * E));
      control.all_reduce(run.expert_load.data(), int64_t(run.expert_load.size()));
      for (int64_t i = 0; i < m.layers; ++i) {
        if (!m.moe_layer(i)) continue;
        const int64_t* row = run.expert_load.data() + i * E;
        int64_t sum = 0, most = 0;
        for (int64_t j = 0; j < E; ++j) {
          sum += row[j];
          most = std::max(most, row[j]);
        }
        if (sum > 0) out.expert_imbalance = std::max(out.expert_imbalance, double(most) * double(E) / double(sum));
      }
      out.expert_load = run.expert_load;
      run.dispatch_peaks.resize(size_t(E + 1), 0.0);
      control.all_reduce(run.dispatch_peaks.data(), E + 1, parallel::ReduceOp::max);
      out.dispatch_peaks = run.dispatch_peaks;
    }
  };
  if (all.status == TrialStatus::ok) {
    if (st->gpu_run_bf16_grads)
      timed_steps(*st->gpu_run_bf16_grads);
    else if (st->gpu_run)
      timed_steps(*st->gpu_run);
    else
      timed_steps(*st->cpu_run);
  }

  // Measurements, agreed: the slowest rank's median step and every rank's
  // peak. On CPUs also the median of step / probe, which decides: the probe
  // reported is the one that gives that ratio for the median step, and the
  // noise is the ratio's (what the machine's drift leaves). Each step over
  // its own probe spread the same layouts' 3 runs on 2 ranks by 5.3%, the
  // median step over the median probe by 5.6%, the steps alone by 14.3%.
  double ratio = 0;
  if (all.status == TrialStatus::ok && !times.empty()) {
    std::vector<double> r;
    if (probes.size() == times.size() && *std::min_element(probes.begin(), probes.end()) > 0)
      for (size_t i = 0; i < times.size(); ++i) r.push_back(times[i] / probes[i]);
    out.step_noise = median_noise(r.empty() ? times : r);
    ratio = median_in_place(r);
    out.step_s = median_in_place(times);
  }
  std::array<double, 3> agreed{out.step_s, out.step_noise, ratio};
  control.all_reduce(agreed.data(), 3, parallel::ReduceOp::max);
  out.step_s = agreed[0];
  out.step_noise = agreed[1];
  out.probe_s = agreed[2] > 0 ? out.step_s / agreed[2] : 0;
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
