// The launch protocol every kernel family follows, on every backend.
//
// An op is a params struct (64-bit counts and strides, a shape comment on
// every tensor) and three functions overloaded on it:
//
//   bool    supports(const P&, Backend)          would this run there? no side effects
//   int64_t workspace_bytes(const P&, Backend)   scratch the launch needs (0: none)
//   Status  launch(const P&, Workspace, Stream)  run it on the stream's backend
//
// so the tuner and the memory model can ask "would this run, and with how
// much scratch?" without launching anything. Params that cannot describe a
// valid computation (negative sizes, missing tensors, H not divisible by
// H_kv, too little workspace) give Status::invalid_argument; valid params a
// backend does not implement give Status::unsupported. Errors only the data
// can explain (a token id outside the vocabulary) throw weft::InputError.
//
// The params structs are templated on the element type. The CPU backend
// instantiates float (the backend itself, and the oracle the CUDA backend is
// tested against) and double (finite-difference gradient checks run through
// the very same code). CPU launches are synchronous and use the calling
// thread's OpenMP team; apart from gemm, which is as reproducible as OpenBLAS,
// they give bit-identical results for any thread count, since every reduction
// runs in a fixed order.
//
// The CUDA backend instantiates bf16 (fp32 arithmetic and statistics): each
// family's <family>.cu defines the bf16 functions, which accept only
// Backend::cuda and run on the stream's cudaStream_t, and a build without
// CUDA compiles kernels/cuda_unavailable.cpp instead, whose bf16 functions
// refuse (false, 0, Status::unsupported). float and double launches on a
// CUDA stream are unsupported, except the few fp32 elementwise ops on the
// main gradients of bf16 training (kernels/elementwise). The params that
// write or read gradients (rmsnorm's and embedding's backwards, adamw) take
// the gradients' type as a second parameter, Acc<Elem> by default; the CUDA
// backend also instantiates them with bf16 gradients, <bf16, bf16>, for
// grad:bf16 (the weight-gradient GEMM is then GemmParams<bf16>, gemm.h).
// CUDA launches are asynchronous; their reductions run in a fixed order, so
// results repeat run to run, except where a family's .cu file says otherwise.
#pragma once

#include <cstdint>
#include <type_traits>

namespace weft::kernels {

enum class Status { ok, unsupported, invalid_argument };
const char* to_string(Status s);

// Throws weft::InternalError naming the op when s is not ok: callers launch
// params they built themselves, so a refusal is a bug, not user input.
void status_check(Status s, const char* op);

enum class Backend { cpu, cuda };

// Where a launch runs and what it is ordered after. The CPU backend runs
// launches synchronously and ignores handle; the CUDA backend carries its
// cudaStream_t in handle, which keeps these headers free of CUDA.
struct Stream {
  Backend backend = Backend::cpu;
  void* handle = nullptr;
};

// Scratch memory owned by the caller (the arena's workspace category), at
// least workspace_bytes(params) long and aligned to 16 bytes.
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
};

// Whether an output is overwritten or added to (gradient accumulation).
enum class Write { overwrite, accumulate };

// bfloat16 storage, the GPU training type, without CUDA headers: the bits of
// a bfloat16 (sign, 8 exponent, 7 mantissa bits). The CUDA backend
// reinterprets it as __nv_bfloat16; host code converts with the two helpers
// (round to nearest even; NaN stays NaN).
struct bf16 {
  uint16_t bits = 0;
};
inline float bf16_to_float(bf16 v) {
  const uint32_t u = uint32_t(v.bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

// Accumulator and saved-statistic type (rstd, lse, row max, sum-exp): fp32
// for fp32 and narrower elements, fp64 in the double instantiation so that
// gradient checks see no fp32 rounding anywhere.
template <typename Elem>
using Acc = std::conditional_t<std::is_same_v<Elem, double>, double, float>;

}  // namespace weft::kernels
