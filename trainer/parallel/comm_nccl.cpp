#include "trainer/parallel/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/layout.h"
#include "trainer/parallel/comm_mpi.h"

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

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& bootstrap, std::string name, cudaStream_t compute)
      : name_(std::move(name)), compute_(compute), size_(bootstrap.size()), rank_(bootstrap.rank()) {
    ncclUniqueId id;
    if (rank_ == 0) WEFT_NCCL_CHECK(ncclGetUniqueId(&id));
    static_assert(sizeof(id) % sizeof(int64_t) == 0);
    std::vector<int64_t> words(sizeof(id) / sizeof(int64_t));
    std::memcpy(words.data(), &id, sizeof(id));
    bootstrap.broadcast(words.data(), int64_t(words.size()), 0);
    std::memcpy(&id, words.data(), sizeof(id));
    WEFT_NCCL_CHECK(ncclCommInitRank(&comm_, int(size_), id, int(rank_)));
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming));
  }
  ~NcclComm() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaEventDestroy(before_);
    cudaEventDestroy(after_);
    cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  std::string name() const override { return name_; }

  void all_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    start();
    WEFT_NCCL_CHECK(ncclAllReduce(data, data, size_t(count), nccl_type(t), nccl_op(op), comm_, stream_));
    end();
  }

  // On the communication stream only: the compute stream goes on with later
  // work (the next block's backward) until the request's wait().
  std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    start();
    WEFT_NCCL_CHECK(ncclAllReduce(data, data, size_t(count), nccl_type(t), nccl_op(op), comm_, stream_));
    return finish();
  }

  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    start();
    // NCCL's in-place form is exactly ours: in == this rank's block of out.
    WEFT_NCCL_CHECK(ncclAllGather(in, out, size_t(count), nccl_type(t), comm_, stream_));
    end();
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    start();
    if (in != out) {
      WEFT_NCCL_CHECK(ncclReduceScatter(in, out, size_t(count), nccl_type(t), ncclSum, comm_, stream_));
      end();
      return;
    }
    // In place NCCL leaves the result in this rank's block; ours is the first.
    char* mine = at(out, rank_ * count, t);
    WEFT_NCCL_CHECK(ncclReduceScatter(in, mine, size_t(count), nccl_type(t), ncclSum, comm_, stream_));
    if (rank_ != 0)
      WEFT_CUDA_CHECK(cudaMemcpyAsync(out, mine, size_t(count * dtype_bytes(t)), cudaMemcpyDeviceToDevice, stream_));
    end();
  }

  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    WEFT_ASSERT(int64_t(counts.size()) == size_);
    start();
    WEFT_NCCL_CHECK(ncclGroupStart());
    int64_t offset = 0;
    for (int64_t r = 0; r < size_; ++r) {
      WEFT_NCCL_CHECK(ncclBroadcast(r == rank_ ? in : nullptr, at(out, offset, t), size_t(counts[size_t(r)]),
                                    nccl_type(t), int(r), comm_, stream_));
      offset += counts[size_t(r)];
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
    end();
  }

  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    start();
    enqueue_reduce_scatter_v(in, out, counts, t);
    end();
  }

  std::unique_ptr<CommRequest> ireduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                                 DType t) override {
    start();
    enqueue_reduce_scatter_v(in, out, counts, t);
    return finish();
  }

  void broadcast(void* data, int64_t count, DType t, int64_t root) override {
    WEFT_ASSERT(root >= 0 && root < size_);
    start();
    WEFT_NCCL_CHECK(ncclBroadcast(data, data, size_t(count), nccl_type(t), int(root), comm_, stream_));
    end();
  }

  // Tags order messages on MPI; NCCL delivers a pair's messages in the order
  // they were posted, which the pipeline schedule already guarantees.
  void send(const void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    start();
    WEFT_NCCL_CHECK(ncclSend(data, size_t(count), nccl_type(t), int(peer), comm_, stream_));
    end();
  }
  void recv(void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    start();
    WEFT_NCCL_CHECK(ncclRecv(data, size_t(count), nccl_type(t), int(peer), comm_, stream_));
    end();
  }
  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    start();
    WEFT_NCCL_CHECK(ncclSend(data, size_t(count), nccl_type(t), int(peer), comm_, stream_));
    return finish();
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType t, int64_t peer, int64_t) override {
    start();
    WEFT_NCCL_CHECK(ncclRecv(data, size_t(count), nccl_type(t), int(peer), comm_, stream_));
    return finish();
  }

  void barrier() override {
    // A one-element all-reduce, then the host waits for it: the only call
    // that blocks the host.
    if (!scratch_) WEFT_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));
    WEFT_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream_));
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
                                 nccl_type(t), ncclSum, int(r), comm_, stream_));
      offset += counts[size_t(r)];
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
    if (dest == out) return;
    const size_t bytes = size_t(counts[size_t(rank_)] * dtype_bytes(t));
    if (mine >= counts[size_t(rank_)]) {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(out, dest, bytes, cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    // The block overlaps the front, and cudaMemcpy does not move overlapping
    // ranges: go through a stream-ordered temporary (callers that care pass
    // their own block as out and move nothing).
    void* tmp = nullptr;
    WEFT_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, stream_));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(tmp, dest, bytes, cudaMemcpyDeviceToDevice, stream_));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, stream_));
    WEFT_CUDA_CHECK(cudaFreeAsync(tmp, stream_));
  }

  // The communication stream waits for the compute stream's earlier work...
  void start() {
    WEFT_CUDA_CHECK(cudaEventRecord(before_, compute_));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(stream_, before_, 0));
  }
  // ...and the compute stream's later work waits for the communication.
  void end() {
    WEFT_CUDA_CHECK(cudaEventRecord(after_, stream_));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(compute_, after_, 0));
  }
  std::unique_ptr<CommRequest> finish() {
    cudaEvent_t done;
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclRequest>(compute_, done);
  }

  std::string name_;
  cudaStream_t compute_;
  int64_t size_, rank_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<Comm> nccl_comm(Comm& bootstrap, const std::string& name, void* compute_stream) {
  return std::make_unique<NcclComm>(bootstrap, name, static_cast<cudaStream_t>(compute_stream));
}

ProcessGroups nccl_process_groups(const Layout& layout, void* compute_stream,
                                  const std::atomic<bool>* cancel) {
  auto mpi = std::make_shared<ProcessGroups>(mpi_process_groups(layout, {}, cancel));
  ProcessGroups g;
  for (auto [slot, mpi_comm, label] : {std::tuple{&g.world, mpi->world, "world"}, std::tuple{&g.tp, mpi->tp, "tp"},
                                       std::tuple{&g.pp, mpi->pp, "pp"}, std::tuple{&g.dp, mpi->dp, "dp"}}) {
    g.owned.push_back(nccl_comm(*mpi_comm, label, compute_stream));
    *slot = g.owned.back().get();
  }
  g.host = std::move(mpi);
  g.cuda_stream = compute_stream;
  return g;
}

ProcessGroups nccl_device_groups(const Layout& layout, const std::atomic<bool>* cancel) {
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Destroyed after the communicators (ProcessGroups declares the owner first).
  std::shared_ptr<void> owner(s, [](void* p) { cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  ProcessGroups g = nccl_process_groups(layout, s, cancel);
  g.stream_owner = std::move(owner);
  return g;
}

}  // namespace weft::parallel
