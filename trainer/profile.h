// Profiling one layout with real training steps: the tuner's measurement.
//
// Every rank of the world calls profile_layout() for the same layout. It
// builds the layout's process groups, reserves this rank's predicted memory up
// front, builds the model stage (initialised from the seed) and optimizer,
// runs warm-up then timed steps (forward, backward, optimizer step and the
// logging all-reduce), and tears everything down. The ranks agree on the
// outcome over a control communicator after setup and at the end, so every
// rank returns the same TrialOutcome and goes on to the next trial together:
//   - a reservation refused on any rank: out_of_memory, before any collective
//     on the trial's groups;
//   - no communication progress for `silence_s` (a rank hung, a peer stuck) or
//     the trial past `time_limit_s` at a step boundary: timeout. A wait that
//     the silence watchdog interrupts abandons the trial's communicators; their
//     buffers are kept alive until the process exits (MPI may still complete
//     the pending operations into them), which costs one trial's memory;
//   - any other error on a rank: failed, with that rank's message.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/loop.h"

namespace weft::trainer {

// stopped: a signal asked the process to stop (core/stop.h); no measurement.
enum class TrialStatus { ok, timeout, out_of_memory, failed, stopped };
const char* to_string(TrialStatus s);
TrialStatus trial_status_parse(const std::string& s);

// Faults a test can ask of one rank during one trial.
enum class TrialFault {
  none,
  refuse_memory,  // the allocator refuses the up-front reservation
  hang,           // the rank stops before its first step until the trial is abandoned
  die,            // the process exits at once with code 137, as if killed
};

// The slack of an arena's reservation over the memory model's bytes. The
// tensor table makes every allocation once, in order, at the sizes the model
// counts (aligned as the arena aligns them), and frees nothing until the run
// ends, so nothing fragments; the slack only guards the run against a buffer
// the model might miss, which fails with the sizes named. It was 5% before
// the device's own count showed the arena's peak equal to the model.
inline constexpr double kArenaSlack = 0.005;

struct ProfileConfig {
  TrainConfig train;         // model, run, layout, device, optim, seed, data, threads
  int64_t warmup_steps = 1;
  int64_t timed_steps = 3;      // at least
  double min_timed_s = 0.5;     // timed steps go on until they took this long...
  int64_t max_timed_steps = 50;  // ...or there are this many
  // Reserve this rank's stage as the memory model predicts it, times 1 + slack.
  bool reserve = true;
  double reserve_slack = kArenaSlack;
  double silence_s = 60;      // seconds without communication progress before abandoning
  double time_limit_s = 0;    // whole-trial limit, checked between steps; 0: none
  // A trial whose first timed step took longer than this (on its slowest
  // rank) ends there, measured by that one step: a layout that far behind
  // needs no more steps to rank (0: every trial runs its steps).
  double cut_above_s = 0;
  TrialFault fault = TrialFault::none;
  // CPU trials: time the probe GEMM after each timed step (trial's probe_s).
  // Off where a node's ranks share cores: the probe then times the
  // scheduler's switches between them, which spread the probe-corrected
  // steps more than the raw ones (21% against 13% on 4 ranks over 2 cores).
  bool probe = true;
};

// Builds the process groups of a layout whose waits give up (CommAbandoned)
// once `cancel` is set; null cancel never gives up.
using GroupFactory =
    std::function<parallel::ProcessGroups(const Layout& layout, const std::atomic<bool>* cancel)>;

struct TrialOutcome {
  TrialStatus status = TrialStatus::ok;
  std::string reason;                // "rank 1: ..." when not ok
  double step_s = 0;                 // median timed step, slowest rank
  double step_noise = 0;             // that median's relative standard error, from its own steps (largest rank's)
  double probe_s = 0;                // CPU trials with a probe: the one that gives step_s the median step / probe (0: none)
  std::vector<int64_t> peak_bytes;   // arena high-water mark per world rank
  int64_t steps = 0;                 // steps completed (warm-up included)
  bool cut = false;                  // ended after its first timed step (ProfileConfig::cut_above_s)
  // MoE models: how unevenly the router spread the trial's tokens, the
  // busiest expert's tokens over its layer's mean in the worst MoE layer,
  // over every step of the trial and every rank (1: even; 0: a dense model).
  double expert_imbalance = 0;
  // The tokens each expert took, (model layers) x E over the trial's steps
  // and every rank (dense layers' rows 0); empty for a dense model.
  std::vector<int64_t> expert_load;
  // The most uneven dispatches of the trial, over every rank, (E + 1)
  // (LlamaStage::take_dispatch_peaks): at d, what the receive buffers of
  // ep d must hold, in units of a rank's balanced rows x k; empty for a
  // dense model.
  std::vector<double> dispatch_peaks;
  double seconds = 0;                // wall time of the whole trial
  std::vector<double> losses;        // per step, for checks
};

// The bytes a rank's arena reserves up front for a layout: the memory
// model's prediction for the rank's stage without the runtime's share (the
// arena never holds it), plus `slack` of it and 1 MiB.
int64_t arena_reservation(const TrainConfig& t, int64_t world_rank, int64_t world, double slack);

// `control` spans the same ranks as the layout's world and is used only to
// agree (never abandoned); `make_groups` is null for a single process.
TrialOutcome profile_layout(const ProfileConfig& config, parallel::Comm& control,
                            const GroupFactory& make_groups);

}  // namespace weft::trainer
