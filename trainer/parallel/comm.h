// Comm: the collectives and point-to-point operations of one process group,
// behind one interface with a backend per transport: a single-rank backend
// (no MPI, no GPU), MPI on host memory, and NCCL on devices. Groups are values
// passed explicitly (ProcessGroups), never globals.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace weft::parallel {

enum class DType { f32, f64, i32, i64 };
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

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  virtual std::string name() const = 0;

  // In place over `count` elements.
  virtual void all_reduce(void* data, int64_t count, DType t, ReduceOp op) = 0;
  // out (size * count) = concatenation of every rank's in (count), in rank order.
  virtual void all_gather(const void* in, void* out, int64_t count, DType t) = 0;
  // out (count) = the sum over ranks of this rank's block of in (size * count).
  virtual void reduce_scatter(const void* in, void* out, int64_t count, DType t) = 0;
  virtual void broadcast(void* data, int64_t count, DType t, int64_t root) = 0;
  virtual void send(const void* data, int64_t count, DType t, int64_t peer, int64_t tag) = 0;
  virtual void recv(void* data, int64_t count, DType t, int64_t peer, int64_t tag) = 0;
  virtual void barrier() = 0;

  template <typename T>
  void all_reduce(T* data, int64_t count, ReduceOp op = ReduceOp::sum) {
    all_reduce(static_cast<void*>(data), count, dtype_of<T>(), op);
  }
  template <typename T>
  void all_gather(const T* in, T* out, int64_t count) {
    all_gather(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>());
  }
  template <typename T>
  void reduce_scatter(const T* in, T* out, int64_t count) {
    reduce_scatter(static_cast<const void*>(in), static_cast<void*>(out), count, dtype_of<T>());
  }
};

// A group of one: every collective is the identity (copies where in != out).
std::unique_ptr<Comm> single_rank_comm();

int64_t dtype_bytes(DType t);

}  // namespace weft::parallel
