// Checkpoints written while training goes on. A save gathers the state into
// host memory at a step boundary (state_gather, on every rank) and hands it
// to this writer on world rank 0, whose thread writes the folder (built under
// a temporary name, fsynced and swapped in) and only then marks it `latest`.
// A save waits for the one before it, so at most one write is in flight and
// checkpoints become `latest` in step order; a crash during a write leaves
// the previous checkpoint as `latest`. A write that fails is reported by the
// next submit() or by wait(), which the loop calls before it returns.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>

#include "trainer/state_io.h"

namespace weft::trainer {

class AsyncSaver {
 public:
  AsyncSaver() = default;
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;
  // Joins a write in flight; its error, if any, is dropped (the caller is
  // already leaving by another error).
  ~AsyncSaver();

  // Waits for the previous write (rethrowing its error), then writes `job`
  // and runs `then` (marking it latest) on the writer thread.
  void submit(std::unique_ptr<SaveJob> job, std::function<void()> then);
  // Waits for the write in flight; rethrows its error.
  void wait();
  bool busy() const { return thread_.joinable(); }
  // A written job whose storage the next gather may fill again (null when
  // none is free). With the job in flight that makes two copies of the
  // state at most, and no fresh pages for the saves after the first two.
  std::unique_ptr<SaveJob> take_spare() { return std::move(spare_); }
  void give_spare(std::unique_ptr<SaveJob> job) { spare_ = std::move(job); }

 private:
  std::thread thread_;
  std::exception_ptr error_;
  std::unique_ptr<SaveJob> done_;   // written by the thread; read after the join
  std::unique_ptr<SaveJob> spare_;  // the caller's
};

}  // namespace weft::trainer
