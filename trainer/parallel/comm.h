// Comm: the collectives and point-to-point operations of one process group,
// behind one interface with a backend per transport: a single-rank backend
// (no MPI, no GPU), MPI on host memory, and NCCL on devices. Groups are values
// passed explicitly (ProcessGroups), never globals.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "kernels/kernel.h"

namespace weft::parallel {

// bf16 travels only on devices (NCCL); the MPI backend refuses it. u8 is
// bytes (FP8 codes), gathered and sent, never summed.
enum class DType { f32, f64, i32, i64, bf16, u8 };
enum class ReduceOp { sum, max };

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<double>() { return DType::f64; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <>
constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <>
constexpr DType dtype_of<kernels::bf16>() { return DType::bf16; }
template <>
constexpr DType dtype_of<uint8_t>() { return DType::u8; }

// A pending non-blocking send or receive. wait() returns when the buffer may be
// reused (send) or holds the message (recv). A request must be waited on
// before its buffer goes away; the destructor waits if the caller did not,
// unless its communicator was cancelled (see CommAbandoned): then it leaves the
// operation to MPI and returns.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  virtual std::string name() const = 0;

  // In place over `count` elements.
  virtual void all_reduce(void* data, int64_t count, DType t, ReduceOp op) = 0;
  // The same all-reduce, begun now and complete once the request's wait()
  // returns: until then the buffer must be left alone. A backend whose
  // collectives run beside the caller's work (NCCL on its own stream)
  // overlaps it with what the caller does meanwhile; this default runs it at
  // once and returns a finished request; MPI starts it and leaves its
  // progress to the library's later calls.
  virtual std::unique_ptr<CommRequest> iall_reduce(void* data, int64_t count, DType t, ReduceOp op);
  // out (size * count) = concatenation of every rank's in (count), in rank order.
  virtual void all_gather(const void* in, void* out, int64_t count, DType t) = 0;
  // out (count) = the sum over ranks of this rank's block of in (size * count).
  // With in == out the result lands in the first count elements.
  virtual void reduce_scatter(const void* in, void* out, int64_t count, DType t) = 0;
  // The same all-gather and reduce-scatter begun now, like iall_reduce: in
  // and out stay untouched by the caller until the request's wait() returns.
  // The defaults run them at once; MPI and NCCL start them (the backward
  // runs its tensor-parallel GEMMs beside them).
  virtual std::unique_ptr<CommRequest> iall_gather(const void* in, void* out, int64_t count, DType t);
  virtual std::unique_ptr<CommRequest> ireduce_scatter(const void* in, void* out, int64_t count, DType t);
  // Uneven variants; counts has size() entries, the same on every rank.
  // all_gather_v: out (sum of counts) = every rank's in (counts[r]), in rank order.
  virtual void all_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                            DType t) = 0;
  // The same uneven all-gather begun now, like iall_reduce: in and out stay
  // untouched by the caller until the request's wait() returns. The default
  // runs it at once (MPI too: without a progress thread it would not move
  // beside the caller's work anyway).
  virtual std::unique_ptr<CommRequest> iall_gather_v(const void* in, void* out, std::span<const int64_t> counts,
                                                     DType t);
  // reduce_scatter_v: out (counts[rank]) = the sum over ranks of this rank's
  // block of in (sum of counts; block r starts at counts[0] + ... + counts[r-1]).
  // With in == out the result lands in the first counts[rank] elements; with
  // out == this rank's own block of in, it replaces that block, which moves
  // nothing on a device.
  virtual void reduce_scatter_v(const void* in, void* out, std::span<const int64_t> counts,
                                DType t) = 0;
  // The same uneven reduce-scatter begun now, like iall_reduce: in and out
  // stay untouched by the caller until the request's wait() returns. The
  // default runs it at once. Out of place, or into this rank's own block of
  // in as above; not in place at in's start (unless that is its own block).
  virtual std::unique_ptr<CommRequest> ireduce_scatter_v(const void* in, void* out,
                                                         std::span<const int64_t> counts, DType t);
  virtual void broadcast(void* data, int64_t count, DType t, int64_t root) = 0;
  // Block j (count elements) of in goes to rank j, where it lands as block
  // rank() of out: in and out hold size() blocks each. This rank's own block
  // is neither sent nor written (the caller copies it). The default posts an
  // isend and an irecv per peer (with tag) and waits for all of them; NCCL
  // runs it as one group over the whole communicator, which reaches every
  // rank where its point-to-point channels reach ring neighbours only.
  virtual void all_to_all(const void* in, void* out, int64_t count, DType t, int64_t tag);
  // The uneven form: send[j] elements of in go to rank j (in's blocks in
  // rank order), and recv[j] elements from rank j land in out (its blocks
  // in rank order); send on one rank and recv on its peer must agree. This
  // rank's own block is neither sent nor written (the caller copies it);
  // empty blocks post nothing. The default posts an isend and an irecv per
  // peer and waits for all of them.
  virtual void all_to_all_v(const void* in, std::span<const int64_t> send, void* out,
                            std::span<const int64_t> recv, DType t, int64_t tag);
  // Blocking point-to-point; peer is a rank of this group, tag in [0, 32767].
  // Two ranks that both send before they receive may deadlock on large
  // messages: exchange with isend/irecv and wait instead.
  virtual void send(const void* data, int64_t count, DType t, int64_t peer, int64_t tag) = 0;
  virtual void recv(void* data, int64_t count, DType t, int64_t peer, int64_t tag) = 0;
  virtual std::unique_ptr<CommRequest> isend(const void* data, int64_t count, DType t, int64_t peer,
                                             int64_t tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(void* data, int64_t count, DType t, int64_t peer,
                                             int64_t tag) = 0;
  virtual void barrier() = 0;

  template <typename T>
  void all_reduce(T* data, int64_t count, ReduceOp op = ReduceOp::sum) {
    all_reduce(static_cast<void*>(data), count, dtype_of<T>(), op);
  }
  template <typename T>
  std::unique_ptr<CommRequest> iall_reduce(T* data, int64_t count, ReduceOp op = ReduceOp::sum) {
    return iall_reduce(static_cast<void*>(data), count, dtype_of<T>(), op);
  }
  template <typename T>
  void all_gather(const T* in, T* out, int64_t count) {
    all_gather(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>());
  }
  template <typename T>
  void reduce_scatter(const T* in, T* out, int64_t count) {
    reduce_scatter(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>());
  }
  template <typename T>
  std::unique_ptr<CommRequest> iall_gather(const T* in, T* out, int64_t count) {
    return iall_gather(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>());
  }
  template <typename T>
  std::unique_ptr<CommRequest> ireduce_scatter(const T* in, T* out, int64_t count) {
    return ireduce_scatter(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>());
  }
  template <typename T>
  void all_gather_v(const T* in, T* out, std::span<const int64_t> counts) {
    all_gather_v(static_cast<const void*>(in), static_cast<void*>(out), counts, dtype_of<T>());
  }
  template <typename T>
  std::unique_ptr<CommRequest> iall_gather_v(const T* in, T* out, std::span<const int64_t> counts) {
    return iall_gather_v(static_cast<const void*>(in), static_cast<void*>(out), counts, dtype_of<T>());
  }
  template <typename T>
  void reduce_scatter_v(const T* in, T* out, std::span<const int64_t> counts) {
    reduce_scatter_v(static_cast<const void*>(in), static_cast<void*>(out), counts, dtype_of<T>());
  }
  template <typename T>
  std::unique_ptr<CommRequest> ireduce_scatter_v(const T* in, T* out, std::span<const int64_t> counts) {
    return ireduce_scatter_v(static_cast<const void*>(in), static_cast<void*>(out), counts, dtype_of<T>());
  }
  template <typename T>
  void all_to_all(const T* in, T* out, int64_t count, int64_t tag) {
    all_to_all(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>(), tag);
  }
  template <typename T>
  void broadcast(T* data, int64_t count, int64_t root) {
    broadcast(static_cast<void*>(data), count, dtype_of<T>(), root);
  }
  template <typename T>
  void send(const T* data, int64_t count, int64_t peer, int64_t tag) {
    send(static_cast<const void*>(data), count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  void recv(T* data, int64_t count, int64_t peer, int64_t tag) {
    recv(static_cast<void*>(data), count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  std::unique_ptr<CommRequest> isend(const T* data, int64_t count, int64_t peer, int64_t tag) {
    return isend(static_cast<const void*>(data), count, dtype_of<T>(), peer, tag);
  }
  template <typename T>
  std::unique_ptr<CommRequest> irecv(T* data, int64_t count, int64_t peer, int64_t tag) {
    return irecv(static_cast<void*>(data), count, dtype_of<T>(), peer, tag);
  }
};

// A group of one: every collective is the identity (copies where in != out).
std::unique_ptr<Comm> single_rank_comm();

int64_t dtype_bytes(DType t);
const char* to_string(DType t);

// A failed call into a communication library (MPI, NCCL) or the CUDA runtime.
class CommError : public Error {
 public:
  using Error::Error;
};

// Thrown by a call that was waiting (for its peers, or for a message) when its
// communicator's cancel flag became true, and by any call made on it while the
// flag is true: the tuner abandons a trial whose ranks no longer meet, and the
// process goes on. MPI cannot cancel a started collective, so it may still
// complete the pending operations later: the communicator must not be used or
// freed afterwards, and the buffers of its pending operations must stay
// allocated; the caller leaks them on purpose. A fresh communicator (a new
// duplicate of the world) works normally.
class CommAbandoned : public CommError {
 public:
  using CommError::CommError;
};

// This process's rank in the world, for error messages; -1 until a backend
// that knows it (MPI) records it. A process has one world rank, so unlike
// communicators it is process state and not passed around.
int64_t process_rank();
void set_process_rank(int64_t rank);

// Throws CommError "rank R: LIB call CALL failed at FILE:LINE: WHAT".
[[noreturn]] void throw_call_error(const char* lib, const char* call, const std::string& what,
                                   const char* file, int line);

}  // namespace weft::parallel

// The one check behind WEFT_MPI_CHECK (and the NCCL and CUDA checks to come):
// `describe(status)` returns "" for success and the library's own text for a
// failure, which is thrown as a CommError naming the rank, the call, the file
// and the line.
#define WEFT_CALL_CHECK(lib, describe, call)                                              \
  do {                                                                                    \
    const auto weft_call_status_ = (call);                                                \
    const std::string weft_call_what_ = describe(weft_call_status_);                      \
    if (!weft_call_what_.empty())                                                         \
      ::weft::parallel::throw_call_error(lib, #call, weft_call_what_, __FILE__, __LINE__); \
  } while (0)
