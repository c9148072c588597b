#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "trainer/parallel/comm.h"

namespace weft::parallel {

int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

namespace {
// A request that was complete when it was made.
struct DoneRequest final : CommRequest {
  void wait() override {}
};
}  // namespace

std::unique_ptr<CommRequest> Comm::iall_reduce(void* data, int64_t count, DType t, ReduceOp op) {
  all_reduce(data, count, t, op);
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<CommRequest> Comm::iall_gather(const void* in, void* out, int64_t count, DType t) {
  all_gather(in, out, count, t);
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<CommRequest> Comm::ireduce_scatter(const void* in, void* out, int64_t count, DType t) {
  reduce_scatter(in, out, count, t);
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<CommRequest> Comm::iall_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                                 DType t) {
  all_gather_v(in, out, counts, t);
  return std::make_unique<DoneRequest>();
}

void Comm::all_to_all(const void* in, void* out, int64_t count, DType t, int64_t tag) {
  const int64_t bytes = count * dtype_bytes(t);
  std::vector<std::unique_ptr<CommRequest>> pending;
  for (int64_t j = 0; j < size(); ++j) {
    if (j == rank()) continue;
    pending.push_back(irecv(static_cast<char*>(out) + j * bytes, count, t, j, tag));
    pending.push_back(isend(static_cast<const char*>(in) + j * bytes, count, t, j, tag));
  }
  for (auto& p : pending) p->wait();
}

void Comm::all_to_all_v(const void* in, std::span<const int64_t> send, void* out, std::span<const int64_t> recv,
                        DType t, int64_t tag) {
  WEFT_ASSERT(int64_t(send.size()) == size() && int64_t(recv.size()) == size());
  const int64_t bytes = dtype_bytes(t);
  std::vector<std::unique_ptr<CommRequest>> pending;
  int64_t sent = 0, received = 0;
  for (int64_t j = 0; j < size(); ++j) {
    if (j != rank() && recv[size_t(j)] > 0)
      pending.push_back(irecv(static_cast<char*>(out) + received * bytes, recv[size_t(j)], t, j, tag));
    if (j != rank() && send[size_t(j)] > 0)
      pending.push_back(isend(static_cast<const char*>(in) + sent * bytes, send[size_t(j)], t, j, tag));
    sent += send[size_t(j)];
    received += recv[size_t(j)];
  }
  for (auto& p : pending) p->wait();
}

std::unique_ptr<CommRequest> Comm::ireduce_scatter_v(const void* in, void* out,
                                                     std::span<const int64_t> counts, DType t) {
  reduce_scatter_v(in, out, counts, t);
  return std::make_unique<DoneRequest>();
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::bf16: return "bf16";
    case DType::u8: return "u8";
  }
  return "?";
}

namespace {
std::atomic<int64_t> g_process_rank{-1};
}  // namespace

int64_t process_rank() { return g_process_rank.load(std::memory_order_relaxed); }
void set_process_rank(int64_t rank) { g_process_rank.store(rank, std::memory_order_relaxed); }

void throw_call_error(const char* lib, const char* call, const std::string& what, const char* file,
                      int line) {
  const int64_t rank = process_rank();
  const std::string who = rank >= 0 ? fmt::format("rank {}", rank) : std::string("rank ?");
  throw CommError(
      fmt::format("{}: {} call {} failed at {}:{}: {}", who, lib, call, file, line, what));
}

namespace {

class SingleRankComm final : public Comm {
 public:
  int64_t size() const override { return 1; }
  int64_t rank() const override { return 0; }
  std::string name() const override { return "single"; }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void all_gather(const void* in, void* out, int64_t count, DType t) override { copy(in, out, count, t); }
  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    copy(in, out, count, t);
  }
  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    WEFT_ASSERT(counts.size() == 1);
    copy(in, out, counts[0], t);
  }
  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                        DType t) override {
    WEFT_ASSERT(counts.size() == 1);
    copy(in, out, counts[0], t);
  }
  void broadcast(void*, int64_t, DType, int64_t root) override { WEFT_ASSERT(root == 0); }
  void send(const void*, int64_t, DType, int64_t, int64_t) override {
    throw InternalError("send on a single-rank group");
  }
  void recv(void*, int64_t, DType, int64_t, int64_t) override {
    throw InternalError("recv on a single-rank group");
  }
  std::unique_ptr<CommRequest> isend(const void*, int64_t, DType, int64_t, int64_t) override {
    throw InternalError("isend on a single-rank group");
  }
  std::unique_ptr<CommRequest> irecv(void*, int64_t, DType, int64_t, int64_t) override {
    throw InternalError("irecv on a single-rank group");
  }
  void barrier() override {}

 private:
  static void copy(const void* in, void* out, int64_t count, DType t) {
    if (in != out) std::memmove(out, in, size_t(count * dtype_bytes(t)));
  }
};

}  // namespace

std::unique_ptr<Comm> single_rank_comm() { return std::make_unique<SingleRankComm>(); }

}  // namespace weft::parallel

#include "trainer/parallel/process_groups.h"

namespace weft::parallel {

ProcessGroups single_process_groups() {
  ProcessGroups g;
  for (int i = 0; i < 5; ++i) g.owned.push_back(single_rank_comm());
  g.world = g.owned[0].get();
  g.tp = g.owned[1].get();
  g.pp = g.owned[2].get();
  g.dp = g.owned[3].get();
  g.cp = g.owned[4].get();
  g.dpcp = g.dp;
  return g;
}

}  // namespace weft::parallel
