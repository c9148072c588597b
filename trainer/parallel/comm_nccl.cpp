#include "trainer/parallel/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <map>
#include <numeric>
#include <utility>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/layout.h"
#include "trainer/parallel/comm_mpi.h"
#include "trainer/parallel/comm_mpi_device.h"
#include "trainer/parallel/rank_grid.h"

namespace weft::parallel {

namespace {

std::string cuda_describe(cudaError_t e) { return e == cudaSuccess ? std::string() : cudaGetErrorString(e); }
std::string nccl_describe(ncclResult_t r) {
  if (r == ncclSuccess) return {};
  const char* last = ncclGetLastError(nullptr);
  return fmt::format("{}{}{}", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

#define WEFT_CUDA_CHECK(call) WEFT_CALL_CHECK("CUDA", cuda_describe, call)
#define WEFT_NCCL_CHECK(call) WEFT_CALL_CHECK("NCCL", nccl_describe, call)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::bf16: return ncclBfloat16;
    case DType::u8: return ncclUint8;
  }
  throw InternalError("unknown DType");
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

const char* at(const void* p, int64_t elements, DType t) {
  return static_cast<const char*>(p) + elements * dtype_bytes(t);
}
char* at(void* p, int64_t elements, DType t) { return static_cast<char*>(p) + elements * dtype_bytes(t); }

// A non-blocking send or receive: wait() orders the compute stream after it.
class NcclRequest final : public CommRequest {
 public:
  NcclRequest(cudaStream_t compute, cudaEvent_t done) : compute_(compute), done_(done) {}
  ~NcclRequest() override {
    if (done_) cudaEventDestroy(done_);
  }
  void wait() override {
    if (!done_) return;
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_, 0));
    WEFT_CUDA_CHECK(cudaEventDestroy(done_));
    done_ = nullptr;
  }

 private:
  cudaStream_t compute_;
  cudaEvent_t done_;
};

// A NCCL communicator and the stream its operations run on.
struct Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// The unique id of a communicator over the ranks of `bootstrap`: rank
// `root` makes it and broadcasts it.
ncclUniqueId unique_id_from(Comm& bootstrap, int64_t root) {
  ncclUniqueId id;
  if (bootstrap.rank() == root) WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
  static_assert(sizeof(id) % sizeof(int64_t) == 0);
  std::vector<int64_t> words(sizeof(id) / sizeof(int64_t));
  std::memcpy(words.data(), &id, sizeof(id));
  bootstrap.broadcast(words.data(), int64_t(words.size()), root);
  std::memcpy(&id, words.data(), sizeof(id));
  return id;
}

// Joins communicator `id` of `ranks` ranks as `rank`, with a stream for it.
Channel open_channel(const ncclUniqueId& id, int64_t ranks, int64_t rank) {
  Channel c;
  WEFT_NCCL_CHECK(ncclCommInitRank(&c.comm, int(ranks), id, int(rank)));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  return c;
}

void close_channel(Channel& c) {
  if (c.stream) cudaStreamSynchronize(c.stream);
  if (c.comm) ncclCommDestroy(c.comm);
  if (c.stream) cudaStreamDestroy(c.stream);
  c = {};
}

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& bootstrap, std::string name, cudaStream_t compute, bool ring_p2p)
      : name_(std::move(name)), compute_(compute), size_(bootstrap.size()), rank_(bootstrap.rank()) {
    group_ = open_channel(unique_id_from(bootstrap, 0), size_, rank_);
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming));
    if (ring_p2p) open_ring(bootstrap);
  }
  ~NcclComm() override {
    for (auto& [peer, c] : to_) close_channel(c);
    for (auto& [peer, c] : from_) close_channel(c);
    close_channel(group_);
    cudaEventDestroy(before_);
    cudaEventDestroy(after_);
    if (scratch_) cudaFree(scratch_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  std::string name() const override { return name_; }

  void all_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    start();
    WEFT_NCCL_CHECK(ncclAllReduce(data, data, size_t(count), nccl_type(t), nccl_op(op), group_.comm, group_.stream));
    end();
  }

  // On the communication stream only: the compute stream goes on with later
  // work (the next block's backward) until the request's wait().
  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    start();
    WEFT_NCCL_CHECK(ncclAllReduce(data, data, size_t(count), nccl_type(t), nccl_op(op), group_.comm, group_.stream));
    return finish();
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    start();
    // NCCL's in-place form is exactly ours: in == this rank's block of out.
    WEFT_NCCL_CHECK(ncclAllGather(in, out, size_t(count), nccl_type(t), group_.comm, group_.stream));
    end();
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    start();
    enqueue_reduce_scatter(in, out, count, t);
    end();
  }

  // On the communication stream only, like iall_reduce: the backward's
  // re-gathered inputs and reduce-scattered input gradients, beside its GEMMs.
  std::unique_ptr<CommRequest> iall_gather(const void* in, void* out, int64_t count, DType t) override {
    start();
    WEFT_NCCL_CHECK(ncclAllGather(in, out, size_t(count), nccl_type(t), group_.comm, group_.stream));
    return finish();
  }

  std::unique_ptr<CommRequest> ireduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    start();
    enqueue_reduce_scatter(in, out, count, t);
    return finish();
  }

  void enqueue_reduce_scatter(const void* in, void* out, int64_t count, DType t) {
    if (in != out) {
      WEFT_NCCL_CHECK(ncclReduceScatter(in, out, size_t(count), nccl_type(t), ncclSum, group_.comm, group_.stream));
      return;
    }
    // In place NCCL leaves the result in this rank's block; ours is the first.
    char* mine = at(out, rank_ * count, t);
    WEFT_NCCL_CHECK(ncclReduceScatter(in, mine, size_t(count), nccl_type(t), ncclSum, group_.comm, group_.stream));
    if (rank_ != 0)
      WEFT_CUDA_CHECK(cudaMemcpyAsync(out, mine, size_t(count * dtype_bytes(t)), cudaMemcpyDeviceToDevice, group_.stream));
  }

  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    start();
    enqueue_all_gather_v(in, out, counts, t);
    end();
  }

  // On the communication stream only, like iall_reduce: ZeRO-3 gathers the
  // next block's weights there while the compute stream runs this block.
  std::unique_ptr<CommRequest> iall_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                             DType t) override {
    start();
    enqueue_all_gather_v(in, out, counts, t);
    return finish();
  }

  void enqueue_all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) {
    WEFT_ASSERT(int64_t(counts.size()) == size_);
    WEFT_NCCL_CHECK(ncclGroupStart());
    int64_t offset = 0;
    for (int64_t r = 0; r < size_; ++r) {
      WEFT_NCCL_CHECK(ncclBroadcast(r == rank_ ? in : nullptr, at(out, offset, t), size_t(counts[size_t(r)]),
                                    nccl_type(t), int(r), group_.comm, group_.stream));
      offset += counts[size_t(r)];
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
  }

  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    start();
    enqueue_reduce_scatter_v(in, out, counts, t);
    end();
  }

  std::unique_ptr<CommRequest> ireduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                 DType t) override {
    // Into this rank's own block or elsewhere, not in place at the front.
    WEFT_ASSERT(in != out || std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0}) == 0);
    start();
    enqueue_reduce_scatter_v(in, out, counts, t);
    return finish();
  }

  // One group of sends and receives over the whole communicator: every peer,
  // not only the ring neighbours the point-to-point channels reach.
  void all_to_all(const void* in, void* out, int64_t count, DType t, int64_t) override {
    start();
    WEFT_NCCL_CHECK(ncclGroupStart());
    for (int64_t j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      WEFT_NCCL_CHECK(ncclSend(at(in, j * count, t), size_t(count), nccl_type(t), int(j), group_.comm, group_.stream));
      WEFT_NCCL_CHECK(ncclRecv(at(out, j * count, t), size_t(count), nccl_type(t), int(j), group_.comm, group_.stream));
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
    end();
  }

  // The uneven form the same way: expert parallelism's rows, to and from
  // every peer of the ep group in one NCCL group.
  void all_to_all_v(const void* in, std::span<const int64_t> send, void* out, std::span<const int64_t> recv, DType t,
                    int64_t) override {
    WEFT_ASSERT(int64_t(send.size()) == size_ && int64_t(recv.size()) == size_);
    start();
    WEFT_NCCL_CHECK(ncclGroupStart());
    int64_t sent = 0, received = 0;
    for (int64_t j = 0; j < size_; ++j) {
      const int64_t s = send[size_t(j)], r = recv[size_t(j)];
      if (j != rank_ && s > 0)
        WEFT_NCCL_CHECK(ncclSend(at(in, sent, t), size_t(s), nccl_type(t), int(j), group_.comm, group_.stream));
      if (j != rank_ && r > 0)
        WEFT_NCCL_CHECK(ncclRecv(at(out, received, t), size_t(r), nccl_type(t), int(j), group_.comm, group_.stream));
      sent += s;
      received += r;
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
    end();
  }

  void broadcast(void* data, int64_t count, DType t, int64_t root) override {
    WEFT_ASSERT(root >= 0 && root < size_);
    start();
    WEFT_NCCL_CHECK(ncclBroadcast(data, data, size_t(count), nccl_type(t), int(root), group_.comm, group_.stream));
    end();
  }

  // Point-to-point runs over the ring channels (see open_ring): the sends to
  // a peer in the order they were posted, on a stream of their own, and the
  // receives from it likewise, so a send waiting for its receive never holds
  // up this rank's receives, as MPI's non-blocking sends do not. Tags order
  // messages on MPI; here each direction delivers in posting order, which
  // the pipeline schedule already keeps (per pair and direction, its sends
  // and receives come in the same order).
  void send(const void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    const Channel& c = channel(to_, peer, "send to");
    start(c.stream);
    WEFT_NCCL_CHECK(ncclSend(data, size_t(count), nccl_type(t), 1, c.comm, c.stream));
    end(c.stream);
  }
  void recv(void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    const Channel& c = channel(from_, peer, "receive from");
    start(c.stream);
    WEFT_NCCL_CHECK(ncclRecv(data, size_t(count), nccl_type(t), 0, c.comm, c.stream));
    end(c.stream);
  }
  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    const Channel& c = channel(to_, peer, "send to");
    start(c.stream);
    WEFT_NCCL_CHECK(ncclSend(data, size_t(count), nccl_type(t), 1, c.comm, c.stream));
    return finish(c.stream);
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    const Channel& c = channel(from_, peer, "receive from");
    start(c.stream);
    WEFT_NCCL_CHECK(ncclRecv(data, size_t(count), nccl_type(t), 0, c.comm, c.stream));
    return finish(c.stream);
  }

  void barrier() override {
    // A one-element all-reduce, then the host waits for it: the only call
    // that blocks the host.
    if (!scratch_) WEFT_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));
    WEFT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, group_.comm, group_.stream));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(group_.stream));
  }

 private:
  // reduce_scatter_v on the communication stream, as one NCCL group of
  // reduces (NCCL has no uneven reduce-scatter).
  void enqueue_reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType t) {
    WEFT_ASSERT(int64_t(counts.size()) == size_);
    int64_t offset = 0, mine = 0;
    for (int64_t r = 0; r < rank_; ++r) mine += counts[size_t(r)];
    // This rank's block of in is where NCCL reduces in place. With in == out
    // the result must then move to the front (the others still read the
    // rest of in during the reduce, so it cannot go there directly).
    char* dest = in == out ? at(out, mine, t) : static_cast<char*>(out);
    WEFT_NCCL_CHECK(ncclGroupStart());
    for (int64_t r = 0; r < size_; ++r) {
      WEFT_NCCL_CHECK(ncclReduce(at(in, offset, t), r == rank_ ? dest : nullptr, size_t(counts[size_t(r)]),
                                 nccl_type(t), ncclSum, int(r), group_.comm, group_.stream));
      offset += counts[size_t(r)];
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
    if (dest == out) return;
    const size_t bytes = size_t(counts[size_t(rank_)] * dtype_bytes(t));
    if (mine >= counts[size_t(rank_)]) {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(out, dest, bytes, cudaMemcpyDeviceToDevice, group_.stream));
      return;
    }
    // The block overlaps the front, and cudaMemcpy does not move overlapping
    // ranges: go through a stream-ordered temporary (callers that care pass
    // their own block as out and move nothing).
    void* tmp = nullptr;
    WEFT_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, group_.stream));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(tmp, dest, bytes, cudaMemcpyDeviceToDevice, group_.stream));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, group_.stream));
    WEFT_CUDA_CHECK(cudaFreeAsync(tmp, group_.stream));
  }

  // Two-rank communicators between this rank and each neighbour on the
  // ring of the group, one per direction (rank 0 of each sends, rank 1
  // receives), each on its own stream. NCCL runs the calls of one stream in
  // order and a lone send blocks its stream until the peer receives, so with
  // sends and receives on one stream two stages that send to each other
  // before receiving (as 1F1B does every step) would wait for each other
  // forever. Made in ring_channels' order, in which every two-rank creation
  // finds its peer.
  void open_ring(Comm& bootstrap) {
    constexpr int64_t kTag = 32000;
    for (const RingChannel& ch : ring_channels(size_, rank_)) {
      // The sender makes the id and hands it to the receiver over the
      // bootstrap group.
      ncclUniqueId id;
      static_assert(sizeof(id) % sizeof(int64_t) == 0);
      std::vector<int64_t> words(sizeof(id) / sizeof(int64_t));
      if (rank_ == ch.from) {
        WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
        std::memcpy(words.data(), &id, sizeof(id));
        bootstrap.send(words.data(), int64_t(words.size()), ch.to, kTag);
        to_[ch.to] = open_channel(id, 2, 0);
      } else {
        bootstrap.recv(words.data(), int64_t(words.size()), ch.from, kTag);
        std::memcpy(&id, words.data(), sizeof(id));
        from_[ch.from] = open_channel(id, 2, 1);
      }
    }
  }

  const Channel& channel(const std::map<int64_t, Channel>& of, int64_t peer, const char* what) const {
    const auto it = of.find(peer);
    if (it == of.end())
      throw InternalError(fmt::format("NCCL {} rank {} on the {} group of {} ranks: point-to-point is set up "
                                      "between ring neighbours of the pp group only",
                                      what, peer, name_, size_));
    return it->second;
  }

  // The communication stream waits for the compute stream's earlier work...
  void start(cudaStream_t on = nullptr) {
    WEFT_CUDA_CHECK(cudaEventRecord(before_, compute_));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(on ? on : group_.stream, before_, 0));
  }
  // ...and the compute stream's later work waits for the communication.
  void end(cudaStream_t on = nullptr) {
    WEFT_CUDA_CHECK(cudaEventRecord(after_, on ? on : group_.stream));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(compute_, after_, 0));
  }
  std::unique_ptr<CommRequest> finish(cudaStream_t on = nullptr) {
    cudaEvent_t done;
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaEventRecord(done, on ? on : group_.stream));
    return std::make_unique<NcclRequest>(compute_, done);
  }

  std::string name_;
  cudaStream_t compute_;
  int64_t size_, rank_;
  Channel group_;  // the group's communicator, for collectives
  std::map<int64_t, Channel> to_, from_;  // point-to-point, by peer (open_ring)
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<Comm> nccl_comm(Comm& bootstrap, const std::string& name, void* compute_stream, bool ring_p2p) {
  return std::make_unique<NcclComm>(bootstrap, name, static_cast<cudaStream_t>(compute_stream), ring_p2p);
}

ProcessGroups nccl_process_groups(const Layout& layout, void* compute_stream,
                                  const std::atomic<bool>* cancel) {
  auto mpi = std::make_shared<ProcessGroups>(mpi_process_groups(layout, {}, cancel));
  ProcessGroups g;
  for (auto [slot, mpi_comm, label] : {std::tuple{&g.world, mpi->world, "world"}, std::tuple{&g.tp, mpi->tp, "tp"},
                                       std::tuple{&g.pp, mpi->pp, "pp"}, std::tuple{&g.dp, mpi->dp, "dp"},
                                       std::tuple{&g.cp, mpi->cp, "cp"}}) {
    // The pipeline sends and receives (stage boundaries, tied embedding
    // gradients) and the cp ring's, always to ring neighbours.
    g.owned.push_back(nccl_comm(*mpi_comm, label, compute_stream, slot == &g.pp || slot == &g.cp));
    *slot = g.owned.back().get();
  }
  if (mpi->tp_side) {
    g.owned.push_back(nccl_comm(*mpi->tp_side, "tp-side", compute_stream, false));
    g.tp_side = g.owned.back().get();
  }
  if (mpi->dpcp == mpi->dp) {
    g.dpcp = g.dp;
  } else {
    g.owned.push_back(nccl_comm(*mpi->dpcp, "dpcp", compute_stream, false));
    g.dpcp = g.owned.back().get();
  }
  // (Expert parallelism's ep and edp groups are the replica and shard
  // groups, or, folded over tp, ep a group of its own: one communicator
  // for each distinct group.)
  std::map<Comm*, Comm*> made;
  for (auto [slot, mpi_comm, label] : {std::tuple{&g.shard, mpi->shard, "shard"},
                                       std::tuple{&g.replica, mpi->replica, "replica"},
                                       std::tuple{&g.ep, mpi->ep, "ep"}, std::tuple{&g.edp, mpi->edp, "edp"}})
    if (mpi_comm) {
      if (mpi_comm == mpi->dpcp) {
        *slot = g.dpcp;
        continue;
      }
      if (auto it = made.find(mpi_comm); it != made.end()) {
        *slot = it->second;
        continue;
      }
      g.owned.push_back(nccl_comm(*mpi_comm, label, compute_stream, false));
      *slot = made[mpi_comm] = g.owned.back().get();
    }
  g.host = std::move(mpi);
  g.cuda_stream = compute_stream;
  return g;
}

ProcessGroups nccl_device_groups(const Layout& layout, const std::atomic<bool>* cancel) {
  return device_groups_on_own_stream([&](void* s) { return nccl_process_groups(layout, s, cancel); });
}

}  // namespace weft::parallel
