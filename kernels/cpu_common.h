// Helpers shared by the CPU kernels; not part of the public API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/kernel.h"

namespace weft::kernels::cpu {

// Workspace pieces start on 64-byte boundaries (a cache line), so one op's
// threads never share a line between two pieces.
constexpr int64_t kWorkspaceAlign = 64;

constexpr int64_t align_up(int64_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Bytes of `count` elements of T as one workspace piece.
template <typename T>
constexpr int64_t piece_bytes(int64_t count) {
  return align_up(count * static_cast<int64_t>(sizeof(T)));
}

// Hands out consecutive typed pieces of a workspace, in the order
// workspace_bytes() counted them.
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(Workspace ws) : base_(static_cast<std::byte*>(ws.data)) {}
  template <typename T>
  T* take(int64_t count) {
    T* p = reinterpret_cast<T*>(base_ + offset_);
    offset_ += piece_bytes<T>(count);
    return p;
  }

 private:
  std::byte* base_;
  int64_t offset_ = 0;
};

// The common front of every CPU launch: the backend, the params' own check,
// then the workspace.
inline Status preflight(Status checked, int64_t needed, Workspace ws, Stream stream) {
  if (stream.backend != Backend::cpu) return Status::unsupported;
  if (checked != Status::ok) return checked;
  if (needed > 0) {
    if (ws.data == nullptr || ws.bytes < needed) return Status::invalid_argument;
    if (reinterpret_cast<std::uintptr_t>(ws.data) % 16 != 0) return Status::invalid_argument;
  }
  return Status::ok;
}

// A tensor of `count` elements is present unless it is empty.
inline bool present(const void* p, int64_t count) { return count == 0 || p != nullptr; }

inline Status status_of(bool valid) { return valid ? Status::ok : Status::invalid_argument; }

// Loops with less work than this (multiply-adds or elements touched) run on
// the calling thread: a parallel region's fork and join costs microseconds on
// idle cores and milliseconds when the cores are shared, more than such a loop.
constexpr int64_t kParallelMinWork = int64_t{1} << 15;
inline bool worth_parallel(int64_t work) { return work >= kParallelMinWork; }

// Column blocks for reductions over rows (weight gradients): each thread owns
// whole columns, so the sum over rows runs in a fixed order without atomics.
constexpr int64_t kColumnBlock = 64;

}  // namespace weft::kernels::cpu

// Explicit instantiations of the protocol for one params template, for float
// and double. The kernel file defines supports, workspace_bytes and launch as
// templates; this emits the symbols the headers declare.
#define WEFT_CPU_INSTANTIATE_FOR(Params, Elem)                                         \
  template bool supports<Elem>(const Params<Elem>&, Backend);                          \
  template int64_t workspace_bytes<Elem>(const Params<Elem>&, Backend);                \
  template Status launch<Elem>(const Params<Elem>&, Workspace, Stream);
#define WEFT_CPU_INSTANTIATE(Params)      \
  WEFT_CPU_INSTANTIATE_FOR(Params, float) \
  WEFT_CPU_INSTANTIATE_FOR(Params, double)
