#include "trainer/async_save.h"

#include <utility>

namespace weft::trainer {

AsyncSaver::~AsyncSaver() {
  if (thread_.joinable()) thread_.join();
}

void AsyncSaver::wait() {
  if (thread_.joinable()) thread_.join();
  if (done_) spare_ = std::move(done_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void AsyncSaver::submit(std::unique_ptr<SaveJob> job, std::function<void()> then) {
  wait();
  thread_ = std::thread([this, job = std::move(job), then = std::move(then)]() mutable {
    try {
      state_write(*job);
      if (then) then();
      done_ = std::move(job);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

}  // namespace weft::trainer
