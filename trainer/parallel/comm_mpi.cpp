#include "trainer/parallel/comm_mpi.h"

#include <mpi.h>

#include <climits>
#include <numeric>
#include <string>
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

class MpiRequest final : public CommRequest {
 public:
  // expected < 0 for a send; for a receive, the element count it must deliver.
  MpiRequest(MPI_Request req, MPI_Datatype type, int64_t expected, std::string what)
      : req_(req), type_(type), expected_(expected), what_(std::move(what)) {}
  ~MpiRequest() override {
    if (req_ != MPI_REQUEST_NULL && !mpi_finalized()) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    MPI_Status status;
    WEFT_MPI_CHECK(MPI_Wait(&req_, &status));
    if (expected_ >= 0) check_received(status);
  }

  void check_received(const MPI_Status& status) const {
    int got = 0;
    WEFT_MPI_CHECK(MPI_Get_count(&status, type_, &got));
    if (got != expected_) {
      throw CommError(fmt::format("rank {}: {} received {} elements, expected {}", process_rank(),
                                  what_, got, expected_));
    }
  }

 private:
  MPI_Request req_;
  MPI_Datatype type_;
  int64_t expected_;
  std::string what_;
};

class MpiComm final : public Comm {
 public:
  // Takes ownership of `comm` (a duplicate or split, freed on destruction).
  MpiComm(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
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

  void all_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    WEFT_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), mpi_type(t), mpi_op(op), comm_));
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    const void* send = in == block(out, rank_ * count, t) ? MPI_IN_PLACE : in;
    WEFT_MPI_CHECK(MPI_Allgather(send, mpi_count(count), mpi_type(t), out, mpi_count(count),
                                 mpi_type(t), comm_));
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    const void* send = in == out ? MPI_IN_PLACE : in;
    WEFT_MPI_CHECK(
        MPI_Reduce_scatter_block(send, out, mpi_count(count), mpi_type(t), MPI_SUM, comm_));
  }

  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    const Blocks b = blocks_of(counts, size_);
    const void* send = in == block(out, b.displs[size_t(rank_)], t) ? MPI_IN_PLACE : in;
    WEFT_MPI_CHECK(MPI_Allgatherv(send, b.counts[size_t(rank_)], mpi_type(t), out, b.counts.data(),
                                  b.displs.data(), mpi_type(t), comm_));
  }

  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                        DType t) override {
    const Blocks b = blocks_of(counts, size_);
    const void* send = in == out ? MPI_IN_PLACE : in;
    WEFT_MPI_CHECK(MPI_Reduce_scatter(send, out, b.counts.data(), mpi_type(t), MPI_SUM, comm_));
  }

  void broadcast(void* data, int64_t count, DType t, int64_t root) override {
    WEFT_ASSERT(root >= 0 && root < size_);
    WEFT_MPI_CHECK(MPI_Bcast(data, mpi_count(count), mpi_type(t), int(root), comm_));
  }

  void send(const void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    check_peer(peer, tag);
    WEFT_MPI_CHECK(MPI_Send(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_));
  }

  void recv(void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    check_peer(peer, tag);
    MPI_Status status;
    WEFT_MPI_CHECK(
        MPI_Recv(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_, &status));
    MpiRequest(MPI_REQUEST_NULL, mpi_type(t), count, recv_what(peer, tag)).check_received(status);
  }

  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    check_peer(peer, tag);
    MPI_Request req;
    WEFT_MPI_CHECK(
        MPI_Isend(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_, &req));
    return std::make_unique<MpiRequest>(req, mpi_type(t), -1, std::string());
  }

  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    check_peer(peer, tag);
    MPI_Request req;
    WEFT_MPI_CHECK(
        MPI_Irecv(data, mpi_count(count), mpi_type(t), int(peer), int(tag), comm_, &req));
    return std::make_unique<MpiRequest>(req, mpi_type(t), count, recv_what(peer, tag));
  }

  void barrier() override { WEFT_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  static const void* block(const void* base, int64_t offset, DType t) {
    return static_cast<const char*>(base) + offset * dtype_bytes(t);
  }

  void check_peer(int64_t peer, int64_t tag) const {
    if (peer < 0 || peer >= size_ || tag < 0 || tag > tag_upper_bound()) {
      throw InternalError(
          fmt::format("point-to-point on the {} group of {} ranks: peer {} tag {} "
                      "(tags go up to {})",
                      name_, size_, peer, tag, tag_upper_bound()));
    }
  }

  std::string recv_what(int64_t peer, int64_t tag) const {
    return fmt::format("recv on the {} group from rank {} with tag {}", name_, peer, tag);
  }

  MPI_Comm comm_;
  std::string name_;
  int64_t rank_ = 0;
  int64_t size_ = 0;
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

ProcessGroups mpi_process_groups(int64_t tp, int64_t pp, int64_t dp, RankOrder order) {
  const int64_t world = mpi_world_size();
  const int64_t rank = mpi_world_rank();
  if (tp >= 1 && pp >= 1 && dp >= 1) {
    int64_t needed = 0;
    const bool overflow =
        __builtin_mul_overflow(tp, pp, &needed) || __builtin_mul_overflow(needed, dp, &needed);
    if (overflow || needed != world) {
      throw InputError(
          fmt::format("layout tp{}-pp{}-dp{} needs {} ranks, mpirun started {}", tp, pp, dp,
                      overflow ? std::string("more than 2^63") : std::to_string(needed), world));
    }
  }
  const RankGrid grid(world, tp, pp, dp, order);  // rejects degrees below 1
  const RankGroups mine = grid.groups_of(rank);

  ProcessGroups g;
  MPI_Comm world_dup;
  WEFT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_dup));
  g.owned.push_back(std::make_unique<MpiComm>(world_dup, "world"));
  g.world = g.owned.back().get();
  for (Axis a : {Axis::tp, Axis::pp, Axis::dp}) {
    MPI_Comm split;
    WEFT_MPI_CHECK(
        MPI_Comm_split(world_dup, int(mine.group_index(a)), int(mine.coords[a]), &split));
    g.owned.push_back(std::make_unique<MpiComm>(split, to_string(a)));
    Comm* c = g.owned.back().get();
    WEFT_ASSERT(c->size() == grid.size(a) && c->rank() == mine.coords[a]);
    (a == Axis::tp ? g.tp : a == Axis::pp ? g.pp : g.dp) = c;
  }
  return g;
}

ProcessGroups mpi_process_groups(const Layout& layout, RankOrder order) {
  return mpi_process_groups(layout.tp, layout.pp, layout.dp, order);
}

}  // namespace weft::parallel
