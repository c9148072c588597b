// fp8 ops: what FP8 training runs on the device around each linear layer's
// GEMMs, behind the launch protocol (kernels/kernel.h). The formats, the
// scale rule and the saturating cast are kernels/fp8/fp8.h's; these ops apply
// them to tensors without a host synchronisation: every scale and amax lives
// in memory of the launch's backend (device memory on CUDA), so delayed
// scaling reads the previous steps' scales where the GPU left them.
//
//   Fp8CastParams         x -> codes = fp8_quantize(x, *scale), optionally
//                         also the transposed codes, the amax of x and the
//                         overflow and underflow counts, in one pass.
//   Fp8BlockCastParams    block scaling's cast: codes and a scale per tile
//                         (1 x 128 or 128 x 128), both layouts in one pass.
//   Fp8AmaxParams         amax of a tensor (the current-scaling recipe's
//                         first pass, or a tensor no cast reads).
//   Fp8ScaleUpdateParams  delayed scaling: roll each tensor's amax history
//                         with the step's amax, scale = fp8_scale(max of the
//                         history), scale_inv = 1 / scale; many tensors in
//                         one launch.
//   Fp8GemmParams         C = alpha (A sa)(B sb)^T + beta C with FP8 A and B,
//   Fp8GemmAccParams      fp32 accumulation, C in Elem (bf16 on CUDA: the
//                         forward and dgrad) or Acc<Elem> (fp32: the wgrad
//                         into the main gradients, beta = 1).
//
// Why the GEMM takes only the "TN" form (both operands with k contiguous):
// Hopper's FP8 tensor-core GEMMs (cuBLASLt on sm_89/sm_90) accept nothing
// else, so each linear layer's three products read FP8 copies laid out for
// it; the cast writes both layouts from one read of x:
//   forward  y  = x W^T:   A = x  (rows, in),   B = W   (out, in)
//   dgrad    dx = dy W:    A = dy (rows, out),  B = W^T (in, out)
//   wgrad    dW = dy^T x:  A = dy^T (out, rows), B = x^T (in, rows)
// so x, W and dy are each cast once with out and out_t.
//
// Backends. CPU: float and double, plain loops; the cast and amax are
// fp8.h's functions (a double x is rounded to float first: the codes are an
// fp32 cast's), the GEMM decodes the codes to code * scale_inv (fp8_qdq's
// values) and runs the gemm family's CPU launch, which makes it the oracle
// of the CUDA GEMM. CUDA: bf16 inputs and kernels/fp8/fp8.cu, fp8_gemm.cu.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/fp8/fp8.h"
#include "kernels/kernel.h"

namespace weft::kernels {

// x (rows, cols) -> out (rows, cols) and, when out_t is set, out_t (cols,
// rows): code = fp8_quantize(x, *scale, format), bit for bit on every
// backend. A flat tensor of n elements is rows = 1, cols = n. Optional
// statistics of the same pass:
//   amax:   max |x| (NaN if any x is NaN), written over *amax or, with
//           amax_write = accumulate, max'ed into it (several casts feeding
//           one scale; start it at 0).
//   health: overflow and underflow counts as fp8_qdq counts them, added to
//           *health (a step's casts sum into one pair; zero it at the start).
// ld_t (with out_t; 0: rows): out_t's row stride, at least rows. Each of its
// cols rows holds x's column in [0, rows) and zero codes in [rows, ld_t):
// a weight gradient's operand over a run of tokens whose count is not a
// multiple of 16, padded to one for the GEMM's k (zeros add nothing).
template <typename Elem>
struct Fp8CastParams {
  int64_t rows = 0;
  int64_t cols = 0;
  Fp8Format format = Fp8Format::e4m3;
  const Elem* x = nullptr;       // (rows, cols)
  const float* scale = nullptr;  // (1)
  Fp8* out = nullptr;            // (rows, cols)
  Fp8* out_t = nullptr;          // (cols, ld_t), or null
  int64_t ld_t = 0;              // 0: rows
  float* amax = nullptr;         // (1), or null
  Write amax_write = Write::overwrite;
  Fp8Health* health = nullptr;  // (1), or null
};

// amax = max |x| over n elements (NaN if any is NaN), written or max'ed in
// as in Fp8CastParams.
template <typename Elem>
struct Fp8AmaxParams {
  int64_t n = 0;
  const Elem* x = nullptr;  // (n)
  float* amax = nullptr;    // (1)
  Write write = Write::overwrite;
};

// The delayed-scaling update of `count` tensors of one format, after a step:
// for each tensor t whose step amax a = amax[t] is finite, history row t
// shifts one place towards its end (the oldest entry, at the end, drops out)
// and a goes in at index 0; then scale[t] = fp8_scale(max of the row,
// format, previous scale[t]) and scale_inv[t] = 1 / scale[t]. A non-finite
// amax (a step that overflowed or produced NaN, which the loss rejects) is
// not recorded and leaves the tensor's history and scale as they were, so
// one bad step does not freeze the scale for the history's length. A zeroed
// history (a tensor's first step) thus scales by that step's amax alone.
// Elem is the element type of the tensors the scales are for; the state is
// fp32 on every backend, as the casts and GEMMs read it.
template <typename Elem>
struct Fp8ScaleUpdateParams {
  int64_t count = 0;        // tensors
  int64_t history_len = 0;  // kFp8DelayedHistory (core/layout.h) in training
  Fp8Format format = Fp8Format::e4m3;
  const float* amax = nullptr;  // (count): this step's amax per tensor
  float* history = nullptr;     // (count, history_len), newest first
  float* scale = nullptr;       // (count): read (previous) and written
  float* scale_inv = nullptr;   // tensor t's at scale_inv[t * scale_inv_stride]
  // Floats from one tensor's scale_inv to the next: 4 keeps every one on a
  // 16-byte boundary, as cuBLASLt takes FP8 scales without a copy.
  int64_t scale_inv_stride = 1;
};

// How an FP8 operand's scales cover it. An operand is (rows, k), k
// contiguous, as the GEMM below reads it; with tiles, its scale_inv is an
// array of floats laid out as cuBLASLt's block-scaled Hopper kernels read
// them (cuBLAS 12.9 and newer), so the cast writes what the GEMM takes:
//   tensor    one float for the whole operand (tensorwise and delayed
//             scaling);
//   row128    a float per run of 128 along k in each row (1 x 128 tiles,
//             cuBLASLt's VEC128_32F): (r, kk)'s at (kk / 128) * rows + r,
//             the rows of one run of k contiguous;
//   block128  a float per 128 x 128 block (BLK128x128_32F): (r, kk)'s at
//             (r / 128) * pad4(ceil(k / 128)) + kk / 128, each block row's
//             floats padded to a multiple of 4 (the pads are never read).
// fp8:blockwise (DeepSeek-V3's and Transformer Engine's block recipe) takes
// row128 for activations and gradients and block128 for weights.
enum class Fp8Tiles { tensor, row128, block128 };
const char* to_string(Fp8Tiles t);
// Floats an operand's scale_inv holds under `tiles`, and where (r, kk)'s is
// (inline: the memory model sizes the trainer's scale arrays with it).
inline int64_t fp8_tile_scales(Fp8Tiles tiles, int64_t rows, int64_t k) {
  const int64_t runs = (k + 127) / 128;
  switch (tiles) {
    case Fp8Tiles::tensor: return 1;
    case Fp8Tiles::row128: return runs * rows;
    case Fp8Tiles::block128: return (rows + 127) / 128 * ((runs + 3) / 4 * 4);
  }
  return 0;
}
inline int64_t fp8_tile_scale_at(Fp8Tiles tiles, int64_t rows, int64_t k, int64_t r, int64_t kk) {
  switch (tiles) {
    case Fp8Tiles::tensor: return 0;
    case Fp8Tiles::row128: return kk / 128 * rows + r;
    case Fp8Tiles::block128: return r / 128 * (((k + 127) / 128 + 3) / 4 * 4) + kk / 128;
  }
  return 0;
}

// Block scaling's cast: x (rows, cols) -> out (rows, cols), an operand with
// k = cols, each tile scaled by its own current scale fp8_scale(the tile's
// amax) (fp8_qdq_tiles's rule: a tile of zeros or with a non-finite value
// takes scale 1), codes fp8_quantize(x, that scale), and the tile's
// 1 / scale in scale_inv at fp8_tile_scale_at. With out_t, also the
// transposed codes (cols, rows), an operand with k = rows, with its own
// scale_inv_t: under row128 its tiles run down x's columns (128 x 1 tiles
// of x: the weight gradient's, which reduces over tokens), under block128
// they are the same blocks (the same scales, laid out for the transpose).
// health: the overflow and underflow counts of out, plus out_t's under
// row128 (where its codes differ), added to *health. No host sync: every
// scale is computed and written where the codes are.
template <typename Elem>
struct Fp8BlockCastParams {
  int64_t rows = 0;
  int64_t cols = 0;
  Fp8Format format = Fp8Format::e4m3;
  Fp8Tiles tiles = Fp8Tiles::row128;  // row128 or block128 (tensor: Fp8CastParams)
  const Elem* x = nullptr;            // (rows, cols)
  Fp8* out = nullptr;                 // (rows, cols)
  float* scale_inv = nullptr;         // fp8_tile_scales(tiles, rows, cols)
  Fp8* out_t = nullptr;               // (cols, rows), or null
  float* scale_inv_t = nullptr;       // fp8_tile_scales(tiles, cols, rows), with out_t
  Fp8Health* health = nullptr;        // (1), or null
};

// Whether C accumulates in a fast mode (Hopper's FP8 tensor cores keep a
// partial sum in reduced precision and skip the periodic promotion to fp32)
// or with split accumulation (promoted every few k-steps, so the error grows
// like fp32's). Public FP8 recipes (Transformer Engine, torchao) use fast for
// the forward and split for dgrad and wgrad, where k is long (wgrad sums
// over all tokens) and the gradients' small values suffer most. The CPU
// backend accumulates in full precision either way.
enum class Fp8Accumulation { split, fast };

// C (m, n) = alpha * (A * a_scale_inv) (B * b_scale_inv)^T + beta * C, with
// A and B FP8 codes, row-major, k contiguous in both ("TN" in cuBLASLt's
// column-major terms; the header comment shows how each linear GEMM gets
// there). With beta = 0, C is not read. The scale_invs are device memory on
// CUDA (what Fp8ScaleUpdateParams or the caller's amax rule wrote), host
// memory on the CPU. a_format x b_format: e4m3 x e4m3 or either mixed pair;
// e5m2 x e5m2 is invalid on every backend (cuBLASLt has no such kernel and
// no recipe needs it, so a CPU run cannot come to rely on it). a_tiles and
// b_tiles say how each scale_inv covers its operand (Fp8Tiles): both tensor,
// or both tiled with at most one block128 (the pairs cuBLASLt's Hopper
// kernels take), tiled only with split accumulation (it has no fast
// block-scaled kernels); else invalid on every backend. CUDA supports
// the product only on sm_89 and newer, with n and k multiples of 16 (m too
// under tiles; a tensor-scaled product takes any m, as cuBLASLt's FP8
// kernels need only the k-contiguous rows 16-byte aligned), every
// row stride (lda, ldb, ldc in bytes) a multiple of 16 and every pointer
// 16-byte aligned (the FP8 tensor-core kernels' rules, which core/layout.h's
// fp8 knob already applies to the model's shapes), with tiles k a multiple
// of 128 and the scale arrays 16-byte aligned; otherwise supports() is
// false and the caller keeps that GEMM in bf16.
template <typename Elem>
struct Fp8GemmParams {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Acc<Elem> alpha = 1;
  Acc<Elem> beta = 0;
  const Fp8* a = nullptr;  // (m, k)
  int64_t lda = 0;
  Fp8Format a_format = Fp8Format::e4m3;
  const float* a_scale_inv = nullptr;  // (1), or a_tiles' floats
  Fp8Tiles a_tiles = Fp8Tiles::tensor;
  const Fp8* b = nullptr;              // (n, k)
  int64_t ldb = 0;
  Fp8Format b_format = Fp8Format::e4m3;
  const float* b_scale_inv = nullptr;  // (1), or b_tiles' floats
  Fp8Tiles b_tiles = Fp8Tiles::tensor;
  Elem* c = nullptr;                   // (m, n)
  int64_t ldc = 0;
  Fp8Accumulation accumulation = Fp8Accumulation::split;
};

// The same product with C in Acc<Elem>: the wgrad accumulating (beta = 1)
// into the fp32 main gradients. For fp32 and fp64 it is Fp8GemmParams.
template <typename Elem>
struct Fp8GemmAccParams {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Acc<Elem> alpha = 1;
  Acc<Elem> beta = 0;
  const Fp8* a = nullptr;  // (m, k)
  int64_t lda = 0;
  Fp8Format a_format = Fp8Format::e4m3;
  const float* a_scale_inv = nullptr;  // (1), or a_tiles' floats
  Fp8Tiles a_tiles = Fp8Tiles::tensor;
  const Fp8* b = nullptr;              // (n, k)
  int64_t ldb = 0;
  Fp8Format b_format = Fp8Format::e4m3;
  const float* b_scale_inv = nullptr;  // (1), or b_tiles' floats
  Fp8Tiles b_tiles = Fp8Tiles::tensor;
  Acc<Elem>* c = nullptr;              // (m, n)
  int64_t ldc = 0;
  Fp8Accumulation accumulation = Fp8Accumulation::split;
};

const char* to_string(Fp8Accumulation a);

// Whether FP8 GEMMs run on `backend` in this process: on the CPU always; on
// CUDA when the build has CUDA and the current device has FP8 tensor cores
// (compute capability 8.9 or newer, as the GEMM's supports() requires). If
// `device` is set it receives what was found, for messages: the device's
// name and compute capability, or why there is none.
bool fp8_gemm_available(Backend backend, std::string* device = nullptr);

// The rule both backends apply to the scale update, for one tensor (the CPU
// backend's loop body and the GPU test's reference).
void fp8_scale_update_one(float amax, float* history,  // (history_len)
                          int64_t history_len, Fp8Format format, float* scale, float* scale_inv);

// Workspace: the cast, amax and scale update need none. The GEMM needs, on
// the CPU, the decoded A and B (m k + n k elements); on CUDA, cuBLASLt's
// scratch (kernels/gemm/gemm.cu).
template <typename Elem>
bool supports(const Fp8CastParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const Fp8CastParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const Fp8CastParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const Fp8BlockCastParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const Fp8BlockCastParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const Fp8BlockCastParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const Fp8AmaxParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const Fp8AmaxParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const Fp8AmaxParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const Fp8ScaleUpdateParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const Fp8ScaleUpdateParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const Fp8ScaleUpdateParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const Fp8GemmParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const Fp8GemmParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const Fp8GemmParams<Elem>& p, Workspace ws, Stream stream = {});

template <typename Elem>
bool supports(const Fp8GemmAccParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const Fp8GemmAccParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const Fp8GemmAccParams<Elem>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
