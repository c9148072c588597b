// CommWatchdog: a rank whose peer died must not wait forever in a collective.
//
// How it works. A background thread holds a deadline. The trainer arms the
// watchdog around a step (Scope). Every call on a watched communicator (see
// watch()) records what this rank is doing, e.g. "all_reduce on the tp group",
// and moves the deadline to now + timeout both when the call starts and when it
// returns; so does progress(). If the deadline passes while armed, the thread
// writes one line to stderr,
//   rank 2: no progress in 60 s in all_reduce on the tp group; another rank may have died
// and ends the process with std::_Exit(exit_code) (124 by default, like
// timeout(1)). mpirun sees a rank leave with a non-zero code and without
// MPI_Finalize and tears the whole job down, so every rank is gone within about
// the timeout plus mpirun's teardown, and mpirun exits with that code.
//
// Why std::_Exit and not MPI_Abort or an exception: under MPI_THREAD_FUNNELED
// only the main thread may call MPI, and the main thread is the one blocked
// inside MPI, where nothing can interrupt it. _Exit runs no destructors or
// atexit handlers, which could block on MPI (MPI_Finalize) or on locks the
// blocked thread holds.
//
// The deadline measures silence, not step length: a long step made of many
// calls never fires, one hung call does. A stretch of pure compute longer than
// the timeout between two calls also fires, so the timeout must exceed the
// longest one (minutes, not seconds, for real runs).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "trainer/parallel/process_groups.h"

namespace weft::parallel {

class CommWatchdog {
 public:
  static constexpr int kExitCode = 124;
  using OnTimeout = std::function<void(const std::string& message)>;

  // Exits the process with exit_code on timeout. InputError unless timeout_s > 0.
  explicit CommWatchdog(double timeout_s, int exit_code = kExitCode);
  // Calls on_timeout (on the watchdog thread) instead of exiting, then disarms:
  // for tests, or a trainer that wants to log before it exits.
  CommWatchdog(double timeout_s, OnTimeout on_timeout);
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  // Starts watching; `what` names the region in messages ("step 12").
  void arm(std::string what = "the step");
  void disarm();
  bool armed() const;

  // Arms for the lifetime of the scope.
  class Scope {
   public:
    explicit Scope(CommWatchdog& w, std::string what = "the step") : w_(w) {
      w_.arm(std::move(what));
    }
    ~Scope() { w_.disarm(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CommWatchdog& w_;
  };

  // Marks progress outside communication (resets the deadline).
  void progress();

  // A stretch in which the rank waits for something other than a host call:
  // on a GPU, its stream, whose NCCL operations a dead peer leaves hanging
  // forever. The timeout message names it ("in a wait for the GPU's ..."),
  // and its time does not count as communication. Null watchdog: nothing.
  class Waiting {
   public:
    Waiting(CommWatchdog* w, std::string what);
    ~Waiting();
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    CommWatchdog* w_;
  };
  // A communication call on `group` starts / has returned.
  void call_begin(const char* op, const std::string& group);
  void call_end();
  void wait_begin(std::string what);
  void wait_end();

  // Replaces world/tp/pp/dp of `groups` by wrappers that report every call to
  // this watchdog (the wrappers join groups.owned). The watchdog must outlive
  // the groups. Also takes this rank's number for messages from groups.world.
  void watch(ProcessGroups& groups);

  // The line printed on timeout, for the current state.
  std::string timeout_message() const;
  double timeout_s() const { return timeout_s_; }
  // Seconds this rank has spent inside watched communication calls (blocking
  // collectives, sends and receives, and waits on requests): the exposed
  // communication time, for the progress line and the cost model.
  double comm_seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  void run();
  Clock::time_point next_deadline() const;
  std::string message_locked() const;

  double timeout_s_;
  int exit_code_;
  OnTimeout on_timeout_;
  int64_t rank_ = -1;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false;
  bool stop_ = false;
  Clock::time_point deadline_;
  std::string region_;     // what arm() named
  std::string in_call_;    // "all_reduce on the tp group" while a call runs, else ""
  std::string last_call_;  // the last call that returned
  std::string waiting_;    // what a Waiting names while it lasts, else ""
  Clock::time_point call_start_;
  double comm_seconds_ = 0;
  std::thread thread_;
};

}  // namespace weft::parallel
