#include "trainer/parallel/comm_mpi_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/layout.h"
#include "kernels/kernel.h"
#include "trainer/parallel/comm_mpi.h"
#include "trainer/parallel/device_comm.h"

namespace weft::parallel {

namespace {

std::string cuda_describe(cudaError_t e) { return e == cudaSuccess ? std::string() : cudaGetErrorString(e); }
#define WEFT_CUDA_CHECK(call) WEFT_CALL_CHECK("CUDA", cuda_describe, call)

char* at(void* p, int64_t elements, DType t) { return static_cast<char*>(p) + elements * dtype_bytes(t); }

// How a buffer of `t` travels through a host operation that moves it
// without arithmetic: bf16, which the MPI host backend does not carry, as
// its bytes.
struct Wire {
  DType type;
  int64_t scale;  // wire elements per element
};
Wire wire_of(DType t) { return t == DType::bf16 ? Wire{DType::u8, 2} : Wire{t, 1}; }

// One pinned host buffer. `free_after` is recorded on the compute stream
// after the last copy that reads it, so the host writes into it again only
// once that copy has run.
struct Pinned {
  void* p = nullptr;
  size_t bytes = 0;
  cudaEvent_t free_after = nullptr;
  bool copy_pending = false;
  ~Pinned() {
    if (free_after) cudaEventDestroy(free_after);
    if (p) {
      cudaFreeHost(p);
      device_comm_staging_add(-int64_t(bytes));
    }
  }
};

// The staging buffers of one communicator. A lease takes the smallest free
// buffer that holds the bytes (growing one when none does) and hands it back
// when done; a buffer an abandoned operation may still be written into by
// MPI is leaked instead (see CommAbandoned).
class StagingPool {
 public:
  std::unique_ptr<Pinned> take(size_t bytes) {
    bytes = std::max<size_t>(bytes, 256);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if ((*it)->bytes >= bytes && (best == free_.end() || (*it)->bytes < (*best)->bytes)) best = it;
    std::unique_ptr<Pinned> b;
    if (best != free_.end()) {
      b = std::move(*best);
      free_.erase(best);
    } else if (!free_.empty()) {
      // Grow the largest free buffer rather than keep a small one beside a big one.
      auto largest = std::max_element(free_.begin(), free_.end(),
                                      [](const auto& x, const auto& y) { return x->bytes < y->bytes; });
      b = std::move(*largest);
      free_.erase(largest);
    } else {
      b = std::make_unique<Pinned>();
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&b->free_after, cudaEventDisableTiming));
    }
    if (b->copy_pending) {
      WEFT_CUDA_CHECK(cudaEventSynchronize(b->free_after));
      b->copy_pending = false;
    }
    if (b->bytes < bytes) {
      if (b->p) {
        WEFT_CUDA_CHECK(cudaFreeHost(b->p));
        device_comm_staging_add(-int64_t(b->bytes));
      }
      b->p = nullptr;
      b->bytes = 0;
      WEFT_CUDA_CHECK(cudaHostAlloc(&b->p, bytes, cudaHostAllocDefault));
      b->bytes = bytes;
      device_comm_staging_add(int64_t(bytes));
    }
    return b;
  }
  void give_back(std::unique_ptr<Pinned> b) { free_.push_back(std::move(b)); }
  void leak(std::unique_ptr<Pinned> b) { (void)b.release(); }

 private:
  std::vector<std::unique_ptr<Pinned>> free_;
};

bool is_cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_acquire);
}

// A staging buffer for the length of one operation: back to the pool at the
// end, or leaked if the operation was abandoned on the way out.
class Lease {
 public:
  Lease(std::shared_ptr<StagingPool> pool, size_t bytes, const std::atomic<bool>* cancel)
      : pool_(std::move(pool)), buf_(pool_->take(bytes)), cancel_(cancel), exceptions_(std::uncaught_exceptions()) {}
  ~Lease() {
    if (!buf_) return;
    if (std::uncaught_exceptions() > exceptions_ && is_cancelled(cancel_)) pool_->leak(std::move(buf_));
    else pool_->give_back(std::move(buf_));
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  char* bytes() const { return static_cast<char*>(buf_->p); }
  Pinned& buffer() { return *buf_; }
  std::unique_ptr<Pinned> release() { return std::move(buf_); }

 private:
  std::shared_ptr<StagingPool> pool_;
  std::unique_ptr<Pinned> buf_;
  const std::atomic<bool>* cancel_;
  int exceptions_;
};

// bf16 <-> fp32 on the host, for the sums (rounded once, to nearest even).
void widen(const void* in, float* out, int64_t n) {
  const auto* b = static_cast<const kernels::bf16*>(in);
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::bf16_to_float(b[i]);
}
void narrow(const float* in, void* out, int64_t n) {
  auto* b = static_cast<kernels::bf16*>(out);
  for (int64_t i = 0; i < n; ++i) b[i] = kernels::float_to_bf16(in[i]);
}

class MpiDeviceComm;

// A non-blocking send or receive on staged buffers: wait() completes the
// host operation, then (a receive) queues the copy to the device on the
// compute stream.
class StagedRequest final : public CommRequest {
 public:
  StagedRequest(std::unique_ptr<CommRequest> host, std::shared_ptr<StagingPool> pool, std::unique_ptr<Pinned> buf,
                void* device_out, size_t bytes, cudaStream_t stream, const std::atomic<bool>* cancel)
      : host_(std::move(host)), pool_(std::move(pool)), buf_(std::move(buf)), out_(device_out), bytes_(bytes),
        stream_(stream), cancel_(cancel) {}
  ~StagedRequest() override {
    if (!buf_) return;
    if (is_cancelled(cancel_)) {
      // MPI may still write the buffer: leave both to it (the host request's
      // own destructor does not wait on a cancelled communicator).
      host_.reset();
      pool_->leak(std::move(buf_));
      return;
    }
    try {
      wait();
    } catch (...) {
      // A destructor cannot report: the caller who wanted the error waits.
      if (buf_) pool_->leak(std::move(buf_));
    }
  }
  void wait() override {
    if (!buf_) return;
    host_->wait();
    if (out_) {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(out_, buf_->p, bytes_, cudaMemcpyHostToDevice, stream_));
      WEFT_CUDA_CHECK(cudaEventRecord(buf_->free_after, stream_));
      buf_->copy_pending = true;
    }
    pool_->give_back(std::move(buf_));
  }

 private:
  std::unique_ptr<CommRequest> host_;
  std::shared_ptr<StagingPool> pool_;
  std::unique_ptr<Pinned> buf_;
  void* out_;
  size_t bytes_;
  cudaStream_t stream_;
  const std::atomic<bool>* cancel_;
};

class MpiDeviceComm final : public Comm {
 public:
  MpiDeviceComm(std::shared_ptr<void> keep, Comm& host, cudaStream_t stream, const std::atomic<bool>* cancel)
      : keep_(std::move(keep)), host_(host), stream_(stream), cancel_(cancel),
        pool_(std::make_shared<StagingPool>()) {}
  ~MpiDeviceComm() override {
    // Copies still queued from the staging buffers must finish before they go.
    cudaStreamSynchronize(stream_);
  }

  int64_t size() const override { return host_.size(); }
  int64_t rank() const override { return host_.rank(); }
  std::string name() const override { return host_.name(); }

  void all_reduce(void* data, int64_t count, DType t, ReduceOp op) override {
    const size_t bytes = size_t(count * dtype_bytes(t));
    Lease s(pool_, bytes, cancel_);
    to_host(s, data, bytes);
    if (t == DType::bf16) {
      std::vector<float> wide(static_cast<size_t>(count));
      widen(s.bytes(), wide.data(), count);
      host_.all_reduce(wide.data(), count, DType::f32, op);
      narrow(wide.data(), s.bytes(), count);
    } else {
      host_.all_reduce(s.bytes(), count, t, op);
    }
    to_device(s, data, bytes);
  }

  // in (count) is gathered into out (size * count); in may be this rank's
  // block of out. Staged as the host's in-place form.
  void all_gather(const void* in, void* out, int64_t count, DType t) override {
    const int64_t n = size();
    const size_t block = size_t(count * dtype_bytes(t)), bytes = block * size_t(n);
    Lease s(pool_, bytes, cancel_);
    to_host(s, in, block, block * size_t(rank()));
    const Wire w = wire_of(t);
    host_.all_gather(s.bytes() + block * size_t(rank()), s.bytes(), count * w.scale, w.type);
    to_device(s, out, bytes);
  }

  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    const int64_t n = size();
    const size_t block = size_t(count * dtype_bytes(t)), bytes = block * size_t(n);
    Lease s(pool_, bytes, cancel_);
    to_host(s, in, bytes);
    if (t == DType::bf16) {
      std::vector<float> wide(static_cast<size_t>(count * n));
      widen(s.bytes(), wide.data(), count * n);
      host_.reduce_scatter(wide.data(), wide.data(), count, DType::f32);
      narrow(wide.data(), s.bytes(), count);
    } else {
      host_.reduce_scatter(s.bytes(), s.bytes(), count, t);  // lands in the first block
    }
    to_device(s, out, block);
  }

  void all_gather_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    WEFT_ASSERT(int64_t(counts.size()) == size());
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t mine = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
    const size_t bytes = size_t(total * dtype_bytes(t));
    Lease s(pool_, bytes, cancel_);
    to_host(s, in, size_t(counts[size_t(rank())] * dtype_bytes(t)), size_t(mine * dtype_bytes(t)));
    const Wire w = wire_of(t);
    std::vector<int64_t> wire_counts(counts.begin(), counts.end());
    for (auto& c : wire_counts) c *= w.scale;
    host_.all_gather_v(s.bytes() + mine * dtype_bytes(t), s.bytes(), wire_counts, w.type);
    to_device(s, out, bytes);
  }

  void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts, DType t) override {
    WEFT_ASSERT(int64_t(counts.size()) == size());
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t mine = counts[size_t(rank())];
    Lease s(pool_, size_t(total * dtype_bytes(t)), cancel_);
    to_host(s, in, size_t(total * dtype_bytes(t)));
    // In place on the host: the result lands at the staging buffer's start,
    // then goes wherever out is (the front of in, its own block, elsewhere).
    if (t == DType::bf16) {
      std::vector<float> wide(static_cast<size_t>(total));
      widen(s.bytes(), wide.data(), total);
      host_.reduce_scatter_v(wide.data(), wide.data(), counts, DType::f32);
      narrow(wide.data(), s.bytes(), mine);
    } else {
      host_.reduce_scatter_v(s.bytes(), s.bytes(), counts, t);
    }
    to_device(s, out, size_t(mine * dtype_bytes(t)));
  }

  void broadcast(void* data, int64_t count, DType t, int64_t root) override {
    const size_t bytes = size_t(count * dtype_bytes(t));
    Lease s(pool_, bytes, cancel_);
    to_host(s, data, bytes);
    const Wire w = wire_of(t);
    host_.broadcast(s.bytes(), count * w.scale, w.type, root);
    to_device(s, data, bytes);
  }

  // Every block but this rank's own travels; its own block of out is left
  // as it was (the caller copies it).
  void all_to_all(const void* in, void* out, int64_t count, DType t, int64_t tag) override {
    const int64_t n = size();
    const size_t block = size_t(count * dtype_bytes(t)), bytes = block * size_t(n);
    Lease s_in(pool_, bytes, cancel_), s_out(pool_, bytes, cancel_);
    to_host(s_in, in, bytes);
    const Wire w = wire_of(t);
    host_.all_to_all(s_in.bytes(), s_out.bytes(), count * w.scale, w.type, tag);
    for (int64_t j = 0; j < n; ++j)
      if (j != rank())
        WEFT_CUDA_CHECK(cudaMemcpyAsync(at(out, j * count, t), s_out.bytes() + block * size_t(j), block,
                                        cudaMemcpyHostToDevice, stream_));
    mark_copied(s_out);
  }

  void send(const void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    const size_t bytes = size_t(count * dtype_bytes(t));
    Lease s(pool_, bytes, cancel_);
    to_host(s, data, bytes);
    const Wire w = wire_of(t);
    host_.send(s.bytes(), count * w.scale, w.type, peer, tag);
  }
  void recv(void* data, int64_t count, DType t, int64_t peer, int64_t tag) override {
    const size_t bytes = size_t(count * dtype_bytes(t));
    Lease s(pool_, bytes, cancel_);
    const Wire w = wire_of(t);
    host_.recv(s.bytes(), count * w.scale, w.type, peer, tag);
    to_device(s, data, bytes);
  }
  std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    const size_t bytes = size_t(count * dtype_bytes(t));
    Lease s(pool_, bytes, cancel_);
    to_host(s, data, bytes);
    const Wire w = wire_of(t);
    auto host = host_.isend(s.bytes(), count * w.scale, w.type, peer, tag);
    return std::make_unique<StagedRequest>(std::move(host), pool_, s.release(), nullptr, 0, stream_, cancel_);
  }
  std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType t, int64_t peer,
                                     int64_t tag) override {
    const size_t bytes = size_t(count * dtype_bytes(t));
    Lease s(pool_, bytes, cancel_);
    const Wire w = wire_of(t);
    auto host = host_.irecv(s.bytes(), count * w.scale, w.type, peer, tag);
    return std::make_unique<StagedRequest>(std::move(host), pool_, s.release(), data, bytes, stream_, cancel_);
  }

  void barrier() override {
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_.barrier();
  }

 private:
  // `bytes` of device memory at `from` into the staging buffer at `offset`,
  // once every kernel queued before on the compute stream is done.
  void to_host(Lease& s, const void* from, size_t bytes, size_t offset = 0) {
    if (bytes > 0)
      WEFT_CUDA_CHECK(cudaMemcpyAsync(s.bytes() + offset, from, bytes, cudaMemcpyDeviceToHost, stream_));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // The staging buffer's first `bytes` to the device, queued on the compute
  // stream: later kernels see them; the buffer is reused after the copy.
  void to_device(Lease& s, void* to, size_t bytes) {
    if (bytes > 0) WEFT_CUDA_CHECK(cudaMemcpyAsync(to, s.bytes(), bytes, cudaMemcpyHostToDevice, stream_));
    mark_copied(s);
  }
  void mark_copied(Lease& s) {
    WEFT_CUDA_CHECK(cudaEventRecord(s.buffer().free_after, stream_));
    s.buffer().copy_pending = true;
  }

  std::shared_ptr<void> keep_;  // owns host_
  Comm& host_;
  cudaStream_t stream_;
  const std::atomic<bool>* cancel_;
  std::shared_ptr<StagingPool> pool_;
};

}  // namespace

std::unique_ptr<Comm> mpi_device_comm(std::shared_ptr<void> keep, Comm& host, void* compute_stream,
                                      const std::atomic<bool>* cancel) {
  return std::make_unique<MpiDeviceComm>(std::move(keep), host, static_cast<cudaStream_t>(compute_stream), cancel);
}

ProcessGroups mpi_device_process_groups(const Layout& layout, void* compute_stream,
                                        const std::atomic<bool>* cancel) {
  // The device communicators' own MPI groups, apart from the host groups, so
  // that the host's scalars and the device's tensors never share a channel.
  auto wires = std::make_shared<ProcessGroups>(mpi_process_groups(layout, {}, cancel));
  auto host = std::make_shared<ProcessGroups>(mpi_process_groups(layout, {}, cancel));
  ProcessGroups g;
  const auto wrap = [&](Comm* from) -> Comm* {
    if (from == nullptr) return nullptr;
    g.owned.push_back(mpi_device_comm(wires, *from, compute_stream, cancel));
    return g.owned.back().get();
  };
  g.world = wrap(wires->world);
  g.tp = wrap(wires->tp);
  g.pp = wrap(wires->pp);
  g.dp = wrap(wires->dp);
  g.cp = wrap(wires->cp);
  g.tp_side = wrap(wires->tp_side);
  g.dpcp = wires->dpcp == wires->dp ? g.dp : wrap(wires->dpcp);
  // (Expert parallelism's ep and edp groups are the replica and shard
  // groups, dpcp itself, or, folded over tp, ep a group of its own.)
  std::map<Comm*, Comm*> made = {{wires->dpcp, g.dpcp}};
  const auto once = [&](Comm* from) -> Comm* {
    if (from == nullptr) return nullptr;
    if (auto it = made.find(from); it != made.end()) return it->second;
    return made[from] = wrap(from);
  };
  g.shard = once(wires->shard);
  g.replica = once(wires->replica);
  g.ep = once(wires->ep);
  g.edp = once(wires->edp);
  g.host = std::move(host);
  g.cuda_stream = compute_stream;
  return g;
}

ProcessGroups device_groups_on_own_stream(const std::function<ProcessGroups(void* stream)>& make) {
  cudaStream_t s = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Destroyed after the communicators (ProcessGroups declares the owner first).
  std::shared_ptr<void> owner(s, [](void* p) { cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  ProcessGroups g = make(s);
  g.stream_owner = std::move(owner);
  return g;
}

ProcessGroups mpi_device_groups(const Layout& layout, const std::atomic<bool>* cancel) {
  return device_groups_on_own_stream([&](void* s) { return mpi_device_process_groups(layout, s, cancel); });
}

}  // namespace weft::parallel
