#include "trainer/parallel/comm_watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::parallel {

namespace {

// Reports every call of the wrapped communicator to a watchdog.
class WatchedComm final : public Comm {
 public:
  WatchedComm(Comm& inner, std::string group, CommWatchdog& w)
      : inner_(inner), group_(std::move(group)), w_(w) {}

  int64_t size() const override { return inner_.size(); }
  int64_t rank() const override { return inner_.rank(); }
  std::string name() const override { return inner_.name(); }

  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    Call c(*this, "iall_reduce");
    return std::make_unique<WatchedRequest>(inner_.iall_reduce(data, count, t, op), *this,
                                            "wait for iall_reduce");
  }
  void all_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    Call c(*this, "all_reduce");
    inner_.all_reduce(data, count, t, op);
  }
  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    Call c(*this, "all_gather");
    inner_.all_gather(in, out, count, t);
  }
  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    Call c(*this, "reduce_scatter");
    inner_.reduce_scatter(in, out, count, t);
  }
  std::unique_ptr<CommRequest> iall_gather(const void* in, void* out, int64_t count, DType t) override {
    Call c(*this, "iall_gather");
    return std::make_unique<WatchedRequest>(inner_.iall_gather(in, out, count, t), *this, "wait for iall_gather");
  }
  std::unique_ptr<CommRequest> ireduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    Call c(*this, "ireduce_scatter");
    return std::make_unique<WatchedRequest>(inner_.ireduce_scatter(in, out, count, t), *this,
                                            "wait for ireduce_scatter");
  }
  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    Call c(*this, "all_gather_v");
    inner_.all_gather_v(in, out, counts, t);
  }
  std::unique_ptr<CommRequest> iall_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                             DType t) override {
    Call c(*this, "iall_gather_v");
    return std::make_unique<WatchedRequest>(inner_.iall_gather_v(in, out, counts, t), *this,
                                            "wait for iall_gather_v");
  }
  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                        DType t) override {
    Call c(*this, "reduce_scatter_v");
    inner_.reduce_scatter_v(in, out, counts, t);
  }
  std::unique_ptr<CommRequest> ireduce_scatter_v(const void* in, void* out,
                                                 std::span<const int64_t> counts, DType t) override {
    Call c(*this, "ireduce_scatter_v");
    return std::make_unique<WatchedRequest>(inner_.ireduce_scatter_v(in, out, counts, t), *this,
                                            "wait for ireduce_scatter_v");
  }
  void broadcast(void* data, int64_t count, DType t, int64_t root) override {
    Call c(*this, "broadcast");
    inner_.broadcast(data, count, t, root);
  }
  void send(const void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    Call c(*this, "send");
    inner_.send(data, count, t, peer, tag);
  }
  void recv(void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    Call c(*this, "recv");
    inner_.recv(data, count, t, peer, tag);
  }
  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    Call c(*this, "isend");
    return std::make_unique<WatchedRequest>(inner_.isend(data, count, t, peer, tag), *this,
                                            "wait for isend");
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    Call c(*this, "irecv");
    return std::make_unique<WatchedRequest>(inner_.irecv(data, count, t, peer, tag), *this,
                                            "wait for irecv");
  }
  void barrier() override {
    Call c(*this, "barrier");
    inner_.barrier();
  }

 private:
  struct Call {
    Call(WatchedComm& comm, const char* op) : w(comm.w_) { w.call_begin(op, comm.group_); }
    ~Call() { w.call_end(); }
    CommWatchdog& w;
  };

  class WatchedRequest final : public CommRequest {
   public:
    WatchedRequest(std::unique_ptr<CommRequest> inner, WatchedComm& comm, const char* op)
        : inner_(std::move(inner)), comm_(comm), op_(op) {}
    void wait() override {
      Call c(comm_, op_);
      inner_->wait();
    }

   private:
    std::unique_ptr<CommRequest> inner_;
    WatchedComm& comm_;
    const char* op_;
  };

  Comm& inner_;
  std::string group_;
  CommWatchdog& w_;
};

}  // namespace

CommWatchdog::CommWatchdog(double timeout_s, int exit_code)
    : timeout_s_(timeout_s), exit_code_(exit_code) {
  if (!(timeout_s > 0)) {
    throw InputError(fmt::format("watchdog timeout must be positive, got {} s", timeout_s));
  }
  thread_ = std::thread([this] { run(); });
}

CommWatchdog::CommWatchdog(double timeout_s, OnTimeout on_timeout)
    : CommWatchdog(timeout_s, kExitCode) {
  std::lock_guard lk(mu_);
  on_timeout_ = std::move(on_timeout);
}

CommWatchdog::~CommWatchdog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommWatchdog::Clock::time_point CommWatchdog::next_deadline() const {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
}

void CommWatchdog::arm(std::string what) {
  {
    std::lock_guard lk(mu_);
    armed_ = true;
    region_ = std::move(what);
    in_call_.clear();
    last_call_.clear();
    deadline_ = next_deadline();
  }
  cv_.notify_all();
}

void CommWatchdog::disarm() {
  std::lock_guard lk(mu_);
  armed_ = false;
}

bool CommWatchdog::armed() const {
  std::lock_guard lk(mu_);
  return armed_;
}

void CommWatchdog::progress() {
  std::lock_guard lk(mu_);
  deadline_ = next_deadline();
}

void CommWatchdog::call_begin(const char* op, const std::string& group) {
  std::lock_guard lk(mu_);
  in_call_ = fmt::format("{} on the {} group", op, group);
  call_start_ = Clock::now();
  deadline_ = next_deadline();
}

void CommWatchdog::call_end() {
  std::lock_guard lk(mu_);
  last_call_ = std::move(in_call_);
  in_call_.clear();
  const auto now = Clock::now();
  comm_seconds_ += std::chrono::duration<double>(now - call_start_).count();
  deadline_ = next_deadline();
}

void CommWatchdog::wait_begin(std::string what) {
  std::lock_guard lk(mu_);
  waiting_ = std::move(what);
  deadline_ = next_deadline();
}

void CommWatchdog::wait_end() {
  std::lock_guard lk(mu_);
  waiting_.clear();
  deadline_ = next_deadline();
}

CommWatchdog::Waiting::Waiting(CommWatchdog* w, std::string what) : w_(w) {
  if (w_) w_->wait_begin(std::move(what));
}

CommWatchdog::Waiting::~Waiting() {
  if (w_) w_->wait_end();
}

double CommWatchdog::comm_seconds() const {
  std::lock_guard lk(mu_);
  return comm_seconds_;
}

void CommWatchdog::watch(ProcessGroups& groups) {
  WEFT_ASSERT(groups.world && groups.tp && groups.pp && groups.dp);
  {
    std::lock_guard lk(mu_);
    rank_ = groups.world->rank();
  }
  // Slots that share one communicator share one wrapper.
  std::map<Comm*, Comm*> wrapped;
  const std::pair<Comm**, const char*> slots[] = {{&groups.world, "world"}, {&groups.tp, "tp"}, {&groups.pp, "pp"},
                                                   {&groups.dp, "dp"},       {&groups.cp, "cp"}, {&groups.dpcp, "dpcp"},
                                                   {&groups.shard, "shard"}, {&groups.replica, "replica"},
                                                   {&groups.ep, "ep"},       {&groups.edp, "edp"},
                                                   {&groups.tp_side, "tp-side"}};
  for (auto [slot, label] : slots) {
    if (*slot == nullptr) continue;  // no cp, no tp-side group, no hybrid sharding
    auto it = wrapped.find(*slot);
    if (it == wrapped.end()) {
      groups.owned.push_back(std::make_unique<WatchedComm>(**slot, label, *this));
      it = wrapped.emplace(*slot, groups.owned.back().get()).first;
    }
    *slot = it->second;
  }
}

std::string CommWatchdog::timeout_message() const {
  std::lock_guard lk(mu_);
  return message_locked();
}

std::string CommWatchdog::message_locked() const {
  const int64_t rank = rank_ >= 0 ? rank_ : process_rank();
  const std::string who = rank >= 0 ? fmt::format("rank {}", rank) : std::string("this rank");
  // A host call inside a wait is the more precise place.
  if (!in_call_.empty() || !waiting_.empty()) {
    return fmt::format("{}: no progress in {:g} s in {}; another rank may have died", who,
                       timeout_s_, in_call_.empty() ? waiting_ : in_call_);
  }
  const std::string after =
      last_call_.empty() ? std::string() : fmt::format(" after {}", last_call_);
  return fmt::format(
      "{}: no progress in {:g} s in {}{} (no communication call running: this rank is stuck or the "
      "watchdog timeout is shorter than its compute)",
      who, timeout_s_, region_, after);
}

void CommWatchdog::run() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lk);
      continue;
    }
    const Clock::time_point deadline = deadline_;  // calls move deadline_ while we wait
    if (Clock::now() < deadline) {
      cv_.wait_until(lk, deadline);
      continue;
    }
    const std::string message = message_locked();
    armed_ = false;
    if (on_timeout_) {
      OnTimeout callback = on_timeout_;
      lk.unlock();
      callback(message);
      lk.lock();
      continue;
    }
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    // layering-ok: a rank stuck in a collective cannot unwind; ending it lets mpirun end the rest
    std::_Exit(exit_code_);
  }
}

}  // namespace weft::parallel
