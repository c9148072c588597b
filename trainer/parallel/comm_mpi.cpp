#include "trainer/parallel/comm_mpi.h"

#include <mpi.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/layout.h"

namespace weft::parallel {

namespace {

std::string mpi_describe(int code) {
  if (code == MPI_SUCCESS) return {};
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    return fmt::format("MPI error code {}", code);
  return fmt::format("{} (error code {})", std::string(text, size_t(len)), code);
}

}  // namespace

// Every MPI call of this file goes through this check, except the queries in
// destructors, which must not throw and have no one to report to.
#define WEFT_MPI_CHECK(call) WEFT_CALL_CHECK("MPI", mpi_describe, call)

namespace {

// Finalises MPI at process exit when weft initialised it. A function-local
// static constructed at the first mpi_init(), so it is destroyed after every
// static built later (including any ProcessGroups held in one).
struct MpiRuntime {
  bool we_initialised = false;
  ~MpiRuntime() {
    if (!we_initialised) return;
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

MpiRuntime& runtime() {
  static MpiRuntime r;
  return r;
}

bool mpi_finalized() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

int mpi_count(int64_t n) {
  if (n < 0 || n > INT_MAX) {
    throw InternalError(
        fmt::format("MPI count {} is outside [0, {}]: split the buffer", n, INT_MAX));
  }
  return int(n);
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16:
      throw InternalError("the MPI backend carries no bf16 (host buffers are fp32); NCCL does");
  }
  throw InternalError("unknown DType");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
  }
  throw InternalError("unknown ReduceOp");
}

int64_t tag_upper_bound() {
  static const int64_t ub = [] {
    void* value = nullptr;
    int flag = 0;
    WEFT_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag));
    return flag ? int64_t(*static_cast<int*>(value)) : int64_t(32767);
  }();
  return ub;
}

// Offsets of the blocks of an uneven all-gather / reduce-scatter, as MPI's ints.
struct Blocks {
  std::vector<int> counts, displs;
  int64_t total = 0;
};

Blocks blocks_of(std::span<const int64_t> counts, int64_t size) {
  WEFT_ASSERT(int64_t(counts.size()) == size);
  Blocks b;
  for (int64_t c : counts) {
    WEFT_ASSERT(c >= 0);
    b.counts.push_back(mpi_count(c));
    b.displs.push_back(mpi_count(b.total));
    b.total += c;
  }
  mpi_count(b.total);
  return b;
}

// How a rank waits for an MPI operation: MPI_Test in a loop, with the cancel
// flag checked between polls (MPI offers no other way to leave a started
// collective). Spinning answers fastest while the peers are about to arrive; a
// rank that keeps waiting gives its core away, first with sched_yield (which
// returns at once when nothing else wants the core), and after 1 ms by
// sleeping between polls, so that a rank waiting out a pipeline bubble or a
// late peer leaves its core to the ranks still computing. Measured with 8
// ranks on 2 shared cores: a 37-element all_reduce took 60 us when yielding
// after 20 us of spinning and 33-37 us after 50, 100 or 200 us, since yielding
// early switches between waiting ranks; 4 ranks saw no difference. A 20 us
// sleep lasts about 100 us under Linux's default 50 us timer slack.
constexpr std::chrono::microseconds kSpinFor{50};
constexpr std::chrono::microseconds kYieldFor{1000};
constexpr std::chrono::microseconds kSleepPerPoll{20};

bool cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_acquire);
}

// Polls `req` until it completes (true; `code` is MPI_Test's result, the
// operation's error if it failed) or `cancel` becomes true first (false; `req`
// is still active). Does not throw, for destructors.
bool poll_request(MPI_Request& req, MPI_Status* status, const std::atomic<bool>* cancel,
                  int& code) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  while (true) {
    int done = 0;
    code = MPI_Test(&req, &done, status);
    if (done || code != MPI_SUCCESS) return true;
    if (cancelled(cancel)) return false;
    const Clock::duration waited = Clock::now() - start;
    if (waited < kSpinFor) continue;
    if (waited < kYieldFor) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(kSleepPerPoll);
    }
  }
}

// what: "all_reduce on the tp group", for messages.
[[noreturn]] void throw_abandoned(const std::string& what) {
  throw CommAbandoned(
      fmt::format("rank {}: {} abandoned: the trial was cancelled", process_rank(), what));
}

// The one wait of this backend. Completes `req`, started by the MPI call named
// `call`; `describe()` names the operation for messages, built only when one is
// thrown. CommError when the operation failed; CommAbandoned when `cancel`
// became true first, leaving `req` active and unfreed, since MPI may still
// complete it.
template <typename Describe>
void wait_request(MPI_Request& req, MPI_Status* status, const std::atomic<bool>* cancel,
                  const char* call, const Describe& describe) {
  int code = MPI_SUCCESS;
  if (!poll_request(req, status, cancel, code)) throw_abandoned(describe());
  if (code != MPI_SUCCESS) {
    const std::string started = fmt::format("{} ({}, completed by MPI_Test)", call, describe());
    throw_call_error("MPI", started.c_str(), mpi_describe(code), __FILE__, __LINE__);
  }
}

// A receive must deliver exactly `expected` elements of `type`.
template <typename Describe>
void check_received(const MPI_Status& status, MPI_Datatype type, int64_t expected,
                    const Describe& describe) {
  int got = 0;
  WEFT_MPI_CHECK(MPI_Get_count(&status, type, &got));
  if (got != expected) {
    throw CommError(fmt::format("rank {}: {} received {} elements, expected {}", process_rank(),
                                describe(), got, expected));
  }
}

// A move of bytes to do once a request completes.
struct Move {
  void* to = nullptr;
  const void* from = nullptr;
  size_t bytes = 0;
};

class MpiRequest final : public CommRequest {
 public:
  // expected < 0 for a send or a collective; for a receive, the element
  // count it must deliver. call: the MPI call that started `req`; what: the
  // operation, for messages. blocks: the counts an uneven collective was
  // given, which MPI reads until the operation completes. then: a move of
  // the result once complete (a reduce-scatter into this rank's own block).
  MpiRequest(MPI_Request req, const char* call, std::string what, MPI_Datatype type,
             int64_t expected, const std::atomic<bool>* cancel, Blocks blocks = {}, Move then = {})
      : req_(req),
        call_(call),
        what_(std::move(what)),
        type_(type),
        expected_(expected),
        cancel_(cancel),
        blocks_(std::move(blocks)),
        then_(then) {}
  // Waits like wait(), without throwing; once the communicator is cancelled
  // the operation is left to MPI (MPI_Request_free) instead of waited for.
  ~MpiRequest() override {
    if (req_ == MPI_REQUEST_NULL || mpi_finalized()) return;
    int code = MPI_SUCCESS;
    if (!poll_request(req_, MPI_STATUS_IGNORE, cancel_, code)) MPI_Request_free(&req_);
  }
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;

  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    MPI_Status status;
    const auto what = [this] { return what_; };
    wait_request(req_, &status, cancel_, call_, what);
    if (expected_ >= 0) check_received(status, type_, expected_, what);
    if (then_.bytes > 0) std::memmove(then_.to, then_.from, then_.bytes);
    then_ = {};
  }

 private:
  MPI_Request req_;
  const char* call_;
  std::string what_;
  MPI_Datatype type_;
  int64_t expected_;
  const std::atomic<bool>* cancel_;
  Blocks blocks_;
  Move then_;
};

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` (a duplicate or split, freed on destruction).
  MpiComm(MPI_Comm comm, std::string name, const std::atomic<bool>* cancel)
      : comm_(comm), name_(std::move(name)), cancel_(cancel) {
    WEFT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    int r = 0, s = 0;
    WEFT_MPI_CHECK(MPI_Comm_rank(comm_, &r));
    WEFT_MPI_CHECK(MPI_Comm_size(comm_, &s));
    rank_ = r;
    size_ = s;
  }
  ~MpiComm() override {
    if (!mpi_finalized()) MPI_Comm_free(&comm_);
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  std::string name() const override { return name_; }
  MPI_Comm handle() const { return comm_; }

  void all_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    check_not_cancelled("all_reduce");
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count), mpi_type(t), mpi_op(op),
                                  comm_, &req));
    complete(req, "MPI_Iallreduce", "all_reduce");
  }

  // Started here; MPI moves it on inside this rank's later MPI calls (the
  // tensor-parallel collectives and pipeline messages of the backward) and
  // finishes it in wait().
  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    check_not_cancelled("iall_reduce");
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count), mpi_type(t), mpi_op(op),
                                  comm_, &req));
    return std::make_unique<MpiRequest>(req, "MPI_Iallreduce", collective_what("iall_reduce"),
                                        mpi_type(t), -1, cancel_);
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    MPI_Request req = start_all_gather(in, out, count, t, "all_gather");
    complete(req, "MPI_Iallgather", "all_gather");
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    MPI_Request req = start_reduce_scatter(in, out, count, t, "reduce_scatter");
    complete(req, "MPI_Ireduce_scatter_block", "reduce_scatter");
  }

  // Started here like iall_reduce: the backward's GEMMs run before its wait().
  std::unique_ptr<CommRequest> iall_gather(const void* in, void* out, int64_t count, DType t) override {
    return std::make_unique<MpiRequest>(start_all_gather(in, out, count, t, "iall_gather"), "MPI_Iallgather",
                                        collective_what("iall_gather"), mpi_type(t), -1, cancel_);
  }

  std::unique_ptr<CommRequest> ireduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    return std::make_unique<MpiRequest>(start_reduce_scatter(in, out, count, t, "ireduce_scatter"),
                                        "MPI_Ireduce_scatter_block", collective_what("ireduce_scatter"),
                                        mpi_type(t), -1, cancel_);
  }

  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    check_not_cancelled("all_gather_v");
    blocks_ = blocks_of(counts, size_);
    const Blocks& b = blocks_;
    const void* send = in == block(out, b.displs[size_t(rank_)], t) ? MPI_IN_PLACE : in;
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Iallgatherv(send, b.counts[size_t(rank_)], mpi_type(t), out,
                                   b.counts.data(), b.displs.data(), mpi_type(t), comm_, &req));
    complete(req, "MPI_Iallgatherv", "all_gather_v");
  }

  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                        DType t) override {
    check_not_cancelled("reduce_scatter_v");
    blocks_ = blocks_of(counts, size_);
    // MPI forbids overlapping buffers: a result meant for this rank's own
    // block of in is computed in place (landing at in's start) and moved.
    const bool own_block = out != in && out == block(in, blocks_.displs[size_t(rank_)], t);
    void* recv = own_block ? const_cast<void*>(in) : out;
    const void* send = recv == in ? MPI_IN_PLACE : in;
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Ireduce_scatter(send, recv, blocks_.counts.data(), mpi_type(t), MPI_SUM,
                                       comm_, &req));
    complete(req, "MPI_Ireduce_scatter", "reduce_scatter_v");
    if (own_block) std::memmove(out, in, size_t(counts[size_t(rank_)] * dtype_bytes(t)));
  }

  std::unique_ptr<CommRequest> ireduce_scatter_v(const void* in, void* out,
                                                 std::span<const int64_t> counts, DType t) override {
    check_not_cancelled("ireduce_scatter_v");
    Blocks b = blocks_of(counts, size_);
    // As reduce_scatter_v: into this rank's own block of in (which may be
    // in's start) by way of its start, the move done once it completes.
    const bool own_block = out == block(in, b.displs[size_t(rank_)], t);
    WEFT_ASSERT(own_block || in != out);
    Move then;
    if (own_block) then = {out, in, size_t(counts[size_t(rank_)] * dtype_bytes(t))};
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Ireduce_scatter(own_block ? MPI_IN_PLACE : in, own_block ? const_cast<void*>(in) : out,
                                       b.counts.data(), mpi_type(t), MPI_SUM, comm_, &req));
    return std::make_unique<MpiRequest>(req, "MPI_Ireduce_scatter", collective_what("ireduce_scatter_v"),
                                        mpi_type(t), -1, cancel_, std::move(b), then);
  }

  void broadcast(void* data, int64_t count, DType t, int64_t root) override {
    WEFT_ASSERT(root >= 0 && root < size_);
    check_not_cancelled("broadcast");
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Ibcast(data, mpi_count(count), mpi_type(t), int(root), comm_, &req));
    complete(req, "MPI_Ibcast", "broadcast");
  }

  void send(const void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    check_peer(peer, tag);
    const auto what = [&] { return p2p_what("send", "to", peer, tag); };
    if (cancelled(cancel_)) throw_abandoned(what());
    MPI_Request req;
    WEFT_MPI_CHECK(
        MPI_Isend(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_, &req));
    wait_request(req, MPI_STATUS_IGNORE, cancel_, "MPI_Isend", what);
  }

  void recv(void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    check_peer(peer, tag);
    const auto what = [&] { return p2p_what("recv", "from", peer, tag); };
    if (cancelled(cancel_)) throw_abandoned(what());
    MPI_Request req;
    WEFT_MPI_CHECK(
        MPI_Irecv(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_, &req));
    MPI_Status status;
    wait_request(req, &status, cancel_, "MPI_Irecv", what);
    check_received(status, mpi_type(t), count, what);
  }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    check_peer(peer, tag);
    std::string what = p2p_what("isend", "to", peer, tag);
    if (cancelled(cancel_)) throw_abandoned(what);
    MPI_Request req;
    WEFT_MPI_CHECK(
        MPI_Isend(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_, &req));
    return std::make_unique<MpiRequest>(req, "MPI_Isend", std::move(what), mpi_type(t), -1,
                                        cancel_);
  }

  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    check_peer(peer, tag);
    std::string what = p2p_what("irecv", "from", peer, tag);
    if (cancelled(cancel_)) throw_abandoned(what);
    MPI_Request req;
    WEFT_MPI_CHECK(
        MPI_Irecv(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_, &req));
    return std::make_unique<MpiRequest>(req, "MPI_Irecv", std::move(what), mpi_type(t), count,
                                        cancel_);
  }

  void barrier() override {
    check_not_cancelled("barrier");
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Ibarrier(comm_, &req));
    complete(req, "MPI_Ibarrier", "barrier");
  }

 private:
  static const void* block(const void* base, int64_t offset, DType t) {
    return static_cast<const char*>(base) + offset * dtype_bytes(t);
  }

  std::string collective_what(const char* op) const {
    return fmt::format("{} on the {} group", op, name_);
  }

  // A communicator whose flag is set starts nothing more.
  void check_not_cancelled(const char* op) const {
    if (cancelled(cancel_)) throw_abandoned(collective_what(op));
  }

  // The even all-gather and reduce-scatter, started (blocking forms wait on
  // the request at once). This rank's block of out as in, or in == out for
  // the reduce-scatter, runs in place.
  MPI_Request start_all_gather(const void* in, void* out, int64_t count, DType t, const char* what) {
    check_not_cancelled(what);
    const void* send = in == block(out, rank_ * count, t) ? MPI_IN_PLACE : in;
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Iallgather(send, mpi_count(count), mpi_type(t), out, mpi_count(count),
                                  mpi_type(t), comm_, &req));
    return req;
  }
  MPI_Request start_reduce_scatter(const void* in, void* out, int64_t count, DType t, const char* what) {
    check_not_cancelled(what);
    const void* send = in == out ? MPI_IN_PLACE : in;
    MPI_Request req;
    WEFT_MPI_CHECK(MPI_Ireduce_scatter_block(send, out, mpi_count(count), mpi_type(t), MPI_SUM,
                                             comm_, &req));
    return req;
  }

  // Waits for the collective `op` started by `call`.
  void complete(MPI_Request& req, const char* call, const char* op) const {
    wait_request(req, MPI_STATUS_IGNORE, cancel_, call, [&] { return collective_what(op); });
  }

  void check_peer(int64_t peer, int64_t tag) const {
    if (peer < 0 || peer >= size_ || tag < 0 || tag > tag_upper_bound()) {
      throw InternalError(
          fmt::format("point-to-point on the {} group of {} ranks: peer {} tag {} "
                      "(tags go up to {})",
                      name_, size_, peer, tag, tag_upper_bound()));
    }
  }

  // "recv on the pp group from rank 1 with tag 3"
  std::string p2p_what(const char* op, const char* direction, int64_t peer, int64_t tag) const {
    return fmt::format("{} on the {} group {} rank {} with tag {}", op, name_, direction, peer,
                       tag);
  }

  MPI_Comm comm_;
  std::string name_;
  const std::atomic<bool>* cancel_;
  int64_t rank_ = 0;
  int64_t size_ = 0;
  // The counts and offsets of the last uneven collective. MPI may read them
  // until the operation completes, which for an abandoned one is never known:
  // they live as long as the communicator, which is leaked then.
  Blocks blocks_;
};

}  // namespace

void mpi_init() {
  MpiRuntime& rt = runtime();
  int initialized = 0;
  WEFT_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    WEFT_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    rt.we_initialised = true;
    if (provided < MPI_THREAD_FUNNELED) {
      throw CommError(
          fmt::format("MPI provides thread level {}, weft needs MPI_THREAD_FUNNELED ({})", provided,
                      int(MPI_THREAD_FUNNELED)));
    }
  } else if (mpi_finalized()) {
    throw InternalError("MPI is already finalized");
  }
  WEFT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0;
  WEFT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  set_process_rank(rank);
}

int64_t mpi_world_size() {
  mpi_init();
  int size = 0;
  WEFT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

int64_t mpi_world_rank() {
  mpi_init();
  int rank = 0;
  WEFT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

ProcessGroups mpi_process_groups(int64_t tp, int64_t pp, int64_t dp, RankOrder order,
                                 const std::atomic<bool>* cancel, int64_t cp) {
  const int64_t world = mpi_world_size();
  const int64_t rank = mpi_world_rank();
  if (tp >= 1 && pp >= 1 && dp >= 1 && cp >= 1) {
    int64_t needed = 0;
    const bool overflow = __builtin_mul_overflow(tp, pp, &needed) || __builtin_mul_overflow(needed, dp, &needed) ||
                          __builtin_mul_overflow(needed, cp, &needed);
    if (overflow || needed != world) {
      throw InputError(fmt::format("layout tp{}{}-pp{}-dp{} needs {} ranks, mpirun started {}", tp,
                                   cp > 1 ? fmt::format("-cp{}", cp) : "", pp, dp,
                                   overflow ? std::string("more than 2^63") : std::to_string(needed), world));
    }
  }
  const RankGrid grid(world, tp, pp, dp, order, cp);  // rejects degrees below 1
  const RankGroups mine = grid.groups_of(rank);

  ProcessGroups g;
  MPI_Comm world_dup;
  WEFT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_dup));
  g.owned.push_back(std::make_unique<MpiComm>(world_dup, "world", cancel));
  g.world = g.owned.back().get();
  for (Axis a : {Axis::tp, Axis::pp, Axis::dp, Axis::cp}) {
    MPI_Comm split;
    WEFT_MPI_CHECK(
        MPI_Comm_split(world_dup, int(mine.group_index(a)), int(mine.coords[a]), &split));
    g.owned.push_back(std::make_unique<MpiComm>(split, to_string(a), cancel));
    Comm* c = g.owned.back().get();
    WEFT_ASSERT(c->size() == grid.size(a) && c->rank() == mine.coords[a]);
    (a == Axis::tp ? g.tp : a == Axis::pp ? g.pp : a == Axis::dp ? g.dp : g.cp) = c;
  }
  if (tp > 1) {
    MPI_Comm dup;
    WEFT_MPI_CHECK(MPI_Comm_dup(static_cast<MpiComm*>(g.tp)->handle(), &dup));
    g.owned.push_back(std::make_unique<MpiComm>(dup, "tp-side", cancel));
    g.tp_side = g.owned.back().get();
  }
  if (cp == 1) {
    g.dpcp = g.dp;
  } else {
    MPI_Comm split;
    WEFT_MPI_CHECK(MPI_Comm_split(world_dup, int(mine.dpcp_group), int(mine.coords.cp + cp * mine.coords.dp), &split));
    g.owned.push_back(std::make_unique<MpiComm>(split, "dpcp", cancel));
    g.dpcp = g.owned.back().get();
    WEFT_ASSERT(g.dpcp->size() == cp * dp);
  }
  return g;
}

std::unique_ptr<Comm> mpi_split(Comm& base, int64_t color, int64_t key, const std::string& name,
                                const std::atomic<bool>* cancel) {
  auto* mpi = dynamic_cast<MpiComm*>(&base);
  if (!mpi) throw InternalError(fmt::format("mpi_split: the group {} is not an MPI group", base.name()));
  MPI_Comm split;
  WEFT_MPI_CHECK(MPI_Comm_split(mpi->handle(), mpi_count(color), mpi_count(key), &split));
  return std::make_unique<MpiComm>(split, name, cancel);
}

std::unique_ptr<Comm> mpi_world_dup(const std::string& name, const std::atomic<bool>* cancel) {
  mpi_init();
  MPI_Comm dup;
  WEFT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  return std::make_unique<MpiComm>(dup, name, cancel);
}

}  // namespace weft::parallel
