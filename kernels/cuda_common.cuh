// Shared pieces of the CUDA kernels: bf16 <-> __nv_bfloat16, 16-byte vector
// loads and stores, warp and block reductions, launch geometry, the grid-
// stride elementwise driver, the check of token ids, and the macro that
// defines a family's bf16 protocol functions. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cpu_common.h"  // piece_bytes, WorkspaceCarver, present, status_of: backend-neutral
#include "kernels/cuda_check.h"

namespace weft::kernels::gpu {

// bf16 is the bits of a bfloat16, exactly what __nv_bfloat16 stores.
static_assert(sizeof(bf16) == sizeof(__nv_bfloat16) && alignof(bf16) == alignof(__nv_bfloat16),
              "weft::kernels::bf16 must be layout-compatible with __nv_bfloat16");

using nv_bf16 = __nv_bfloat16;

inline nv_bf16* dev(bf16* p) { return reinterpret_cast<nv_bf16*>(p); }
inline const nv_bf16* dev(const bf16* p) { return reinterpret_cast<const nv_bf16*>(p); }
// fp32 tensors (gradients in either type) pass as they are.
inline float* dev(float* p) { return p; }
inline const float* dev(const float* p) { return p; }

// The bf16 bits in the top half of an fp32: exact for every value, NaN's sign
// and payload included (sm_90's cvt.f32.bf16, which __bfloat162float uses
// there, returns the canonical NaN).
__device__ __forceinline__ float to_float(nv_bf16 v) { return __uint_as_float(uint32_t(__bfloat16_as_ushort(v)) << 16); }
__device__ __forceinline__ nv_bf16 to_bf16(float v) { return __float2bfloat16_rn(v); }
// An fp32 intermediate rounded through bf16, as Elem(...) rounds in the CPU reference.
__device__ __forceinline__ float round_bf16(float v) { return to_float(to_bf16(v)); }

// Elements per 16-byte access of bf16: the unit of every vectorised loop.
constexpr int kVec = 8;

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// N consecutive elements in fp32 registers: N = kVec for a 16-byte access of
// bf16, N = 1 for the element-by-element form of the same loop.
template <int N>
struct Floats {
  float v[N];
};
using Float8 = Floats<kVec>;

// p 16-byte aligned.
__device__ __forceinline__ Float8 load8(const nv_bf16* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  Float8 f;
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f.v[2 * i] = t.x;
    f.v[2 * i + 1] = t.y;
  }
  return f;
}

__device__ __forceinline__ void store8(nv_bf16* p, const Float8& f) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) h[i] = __floats2bfloat162_rn(f.v[2 * i], f.v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// fp32 tensors beside bf16 ones (Acc outputs): two 16-byte accesses.
__device__ __forceinline__ Float8 load8(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  return Float8{{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
}

__device__ __forceinline__ void store8(float* p, const Float8& f) {
  reinterpret_cast<float4*>(p)[0] = make_float4(f.v[0], f.v[1], f.v[2], f.v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(f.v[4], f.v[5], f.v[6], f.v[7]);
}

// One element of T from and to float: bf16 widened or rounded, fp32 as is.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ void put(nv_bf16& p, float v) { p = to_bf16(v); }
__device__ __forceinline__ void put(float& p, float v) { p = v; }

// load<N> / store<N>: one 16-byte access of bf16 (two of fp32) for N = kVec,
// elementwise otherwise; p aligned to N elements' bytes. T: nv_bf16 or float.
template <int N, typename T>
__device__ __forceinline__ Floats<N> load(const T* p) {
  if constexpr (N == kVec) {
    return load8(p);
  } else {
    Floats<N> f;
#pragma unroll
    for (int i = 0; i < N; ++i) f.v[i] = to_float(p[i]);
    return f;
  }
}
template <int N, typename T>
__device__ __forceinline__ void store(T* p, const Floats<N>& f) {
  if constexpr (N == kVec) {
    store8(p, f);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) put(p[i], f.v[i]);
  }
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly over the 32 lanes: every lane ends with the reduction, in the same
// order on every run.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Every thread of the block gets the reduction. blockDim.x must be a multiple
// of 32 (at most 1024) and every thread must call it; back-to-back calls are
// safe (the first barrier waits for the previous call's readers).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x >> 5) ? partial[lane] : identity;
  return warp_reduce(v, op);
}

// Multiprocessors of the current device.
int sm_count();

// Blocks for a grid-stride loop over `items` pieces of work with `threads`
// per block: no more than fill every SM with kMaxThreadsPerSm threads (2048
// on sm_80 and sm_90), since extra blocks only queue behind resident ones and
// each resident thread then loops over several pieces.
constexpr int kMaxThreadsPerSm = 2048;
int64_t grid_blocks(int64_t items, int threads);

// The most blocks a grid's x dimension takes: kernels with one block per row
// report more rows than this as unsupported.
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;

// Threads for one block per row when the row holds `units` independent pieces
// (16-byte vectors or single elements): one piece per thread up to
// max_threads, in whole warps (block_reduce needs them).
constexpr int kMaxRowThreads = 1024;
inline int row_threads(int64_t units, int max_threads = kMaxRowThreads) {
  const int64_t warps = (units + 31) / 32;
  const int64_t threads = warps < 1 ? 32 : warps * 32;
  return int(threads < max_threads ? threads : max_threads);
}

// Grid-stride loop over n elements: f.vec(i) for every whole group of kVec at
// i (a multiple of kVec) when `vec` (every pointer f touches is 16-byte
// aligned), then f.one(i) for each element left. A thread reads all inputs of
// its elements before writing them, so outputs may alias inputs.
constexpr int kElementwiseThreads = 256;

template <typename F>
__global__ void __launch_bounds__(kElementwiseThreads) for_each8_kernel(int64_t n, bool vec, F f) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t groups = n / kVec;
    for (int64_t g = t; g < groups; g += stride) f.vec(g * kVec);
    done = groups * kVec;
  }
  for (int64_t i = done + t; i < n; i += stride) f.one(i);
}

template <typename F>
void for_each8(int64_t n, bool vec, const F& f, cudaStream_t stream, const char* what) {
  if (n == 0) return;
  const int64_t items = vec ? n / kVec + kVec : n;
  for_each8_kernel<<<grid_blocks(items, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
      n, vec, f);
  launch_check(stream, what, __FILE__, __LINE__);
}

// The check behind "ids outside [0, V) throw weft::InputError before anything
// is written" (embedding tokens, cross-entropy targets): one pass over the ids
// on the device, then a synchronisation of the stream to read the first
// offender. It needs kIdCheckBytes of workspace. While the stream is captured
// into a graph it cannot synchronise and reports nothing; the kernels then
// treat an invalid id as out of the shard (a zero row, no gradient).
constexpr int64_t kIdCheckBytes = cpu::kWorkspaceAlign;
struct InvalidId {
  int64_t position = -1;  // -1: every id valid (or not checked)
  int32_t id = 0;
};
// ignore: an id that is allowed although outside [0, V) (cross entropy's
// ignore_index); pass a value no int32 can hold for none.
InvalidId first_invalid_id(const int32_t* ids,  // (n) device memory
                           int64_t n, int64_t V, int64_t ignore, void* scratch,
                           cudaStream_t stream);

// The front of every CUDA launch after the backend: the params' own check,
// then the workspace.
inline Status preflight(Status checked, int64_t needed, Workspace ws) {
  if (checked != Status::ok) return checked;
  if (needed > 0 && (ws.data == nullptr || ws.bytes < needed || !aligned16(ws.data)))
    return Status::invalid_argument;
  return Status::ok;
}

}  // namespace weft::kernels::gpu

// The bf16 protocol functions of one params template, as explicit
// specializations of the templates the family header declares. The family
// file defines, for Params<bf16> in an unnamed namespace:
//   Status  check(const P&)                          valid params? (the CPU's rules)
//   int64_t scratch(const P&)                        workspace, for params that pass check
//   Status  run(const P&, Workspace, cudaStream_t)   enqueue the work
// WEFT_CUDA_INSTANTIATE_BF16_GRAD does the same for Params<bf16, bf16>, the
// params whose gradient output has a type of its own (rmsnorm's dweight,
// embedding's dtable, adamw's grad), with bf16 gradients (grad:bf16).
#define WEFT_CUDA_INSTANTIATE(Params) WEFT_CUDA_SPECIALIZE(Params<bf16>)
#define WEFT_CUDA_INSTANTIATE_BF16_GRAD(Params) WEFT_CUDA_SPECIALIZE(Params<bf16, bf16>)
// The specializations' template arguments are deduced from the params type.
#define WEFT_CUDA_SPECIALIZE(...)                                                              \
  template <>                                                                                  \
  bool supports(const __VA_ARGS__& p, Backend backend) {                                       \
    return backend == Backend::cuda && check(p) == Status::ok;                                 \
  }                                                                                            \
  template <>                                                                                  \
  int64_t workspace_bytes(const __VA_ARGS__& p, Backend backend) {                             \
    return backend == Backend::cuda && check(p) == Status::ok ? scratch(p) : 0;                \
  }                                                                                            \
  template <>                                                                                  \
  Status launch(const __VA_ARGS__& p, Workspace ws, Stream stream) {                           \
    if (stream.backend != Backend::cuda) return Status::unsupported;                           \
    const Status checked = check(p);                                                           \
    if (Status s = gpu::preflight(checked, checked == Status::ok ? scratch(p) : 0, ws);        \
        s != Status::ok)                                                                       \
      return s;                                                                                \
    return run(p, ws, cuda_stream(stream));                                                    \
  }
