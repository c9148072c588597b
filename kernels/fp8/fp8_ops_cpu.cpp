// The fp8 ops on the CPU (kernels/fp8/fp8_ops.h): plain loops over fp8.h's
// functions, the oracle of the CUDA backend. The cast and amax give the same
// result for any thread count (each code depends on one element; the counts
// and the max are exact reductions); the GEMM is as reproducible as
// OpenBLAS.
#include <climits>
#include <cmath>
#include <type_traits>

#include "kernels/cpu_common.h"
#include "kernels/fp8/fp8_check.h"
#include "kernels/fp8/fp8_ops.h"
#include "kernels/gemm/gemm.h"

namespace weft::kernels {
namespace {

// Past max plus half a step a value no longer rounds to max (fp8_qdq's rule).
float overflow_at(Fp8Format f) { return f == Fp8Format::e4m3 ? 464.0f : 61440.0f; }

// max(a, b) where NaN wins, as fp8_amax's NaN result asks.
float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b); }

template <typename Elem>
float amax_of(const Elem* x, int64_t n) {
  if constexpr (std::is_same_v<Elem, float>) {
    return fp8_amax(x, n);
  } else {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = nan_max(m, std::fabs(float(x[i])));
    return m;
  }
}

void amax_store(float* amax, float value, Write write) {
  *amax = write == Write::accumulate ? nan_max(*amax, value) : value;
}

}  // namespace

const char* to_string(Fp8Accumulation a) { return a == Fp8Accumulation::fast ? "fast" : "split"; }

const char* to_string(Fp8Tiles t) {
  switch (t) {
    case Fp8Tiles::tensor: return "tensor";
    case Fp8Tiles::row128: return "1x128";
    case Fp8Tiles::block128: return "128x128";
  }
  return "?";
}

namespace {
constexpr int64_t kTile = 128;
}  // namespace

void fp8_scale_update_one(float amax, float* history, int64_t history_len, Fp8Format format, float* scale,
                          float* scale_inv) {
  if (std::isfinite(amax)) {
    for (int64_t i = history_len - 1; i > 0; --i) history[i] = history[i - 1];
    history[0] = amax;
    float m = 0.0f;
    for (int64_t i = 0; i < history_len; ++i) m = nan_max(m, history[i]);
    *scale = fp8_scale(m, format, *scale);
  }
  *scale_inv = 1.0f / *scale;
}

// Cast.

template <typename Elem>
bool supports(const Fp8CastParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && fp8_detail::params_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const Fp8CastParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const Fp8CastParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(fp8_detail::params_check(p), 0, ws, stream); s != Status::ok) return s;
  const int64_t n = p.rows * p.cols, ld = p.ld_t > 0 ? p.ld_t : p.rows;
  if (p.amax) amax_store(p.amax, amax_of(p.x, n), p.amax_write);
  if (p.out_t)  // the padding columns of the transpose
    for (int64_t c = 0; c < p.cols; ++c)
      for (int64_t r = p.rows; r < ld; ++r) p.out_t[c * ld + r].bits = 0;
  if (n == 0) return Status::ok;
  const float scale = *p.scale, over_at = overflow_at(p.format);
  int64_t over = 0, under = 0;
#pragma omp parallel for reduction(+ : over, under) schedule(static) if (cpu::worth_parallel(n))
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const float v = float(p.x[r * p.cols + c]);
      const uint8_t code = fp8_quantize(v, scale, p.format);
      p.out[r * p.cols + c].bits = code;
      if (p.out_t) p.out_t[c * ld + r].bits = code;
      if (std::fabs(v * scale) > over_at) ++over;
      if ((code & 0x7f) == 0 && v != 0.0f) ++under;
    }
  }
  if (p.health) *p.health += Fp8Health{over, under};
  return Status::ok;
}

// Block cast: one pass per layout, tile by tile (fp8_qdq_tiles's rule).

namespace {

// x's tiles of tile_rows x tile_cols, each with its own scale: codes into
// out, row-major (rows, cols), or with `transposed` (cols, rows); each
// tile's 1 / scale where `tiles` puts it for that operand. Returns the
// health counts.
template <typename Elem>
Fp8Health block_pass(const Elem* x, int64_t rows, int64_t cols, int64_t tile_rows, int64_t tile_cols,
                     Fp8Format f, Fp8Tiles tiles, bool transposed, Fp8* out, float* scale_inv) {
  const int64_t grid_rows = (rows + tile_rows - 1) / tile_rows, grid_cols = (cols + tile_cols - 1) / tile_cols;
  const float over_at = overflow_at(f);
  int64_t over = 0, under = 0;
#pragma omp parallel for reduction(+ : over, under) schedule(static) if (cpu::worth_parallel(rows * cols))
  for (int64_t t = 0; t < grid_rows * grid_cols; ++t) {
    const int64_t r0 = (t / grid_cols) * tile_rows, c0 = (t % grid_cols) * tile_cols;
    const int64_t r1 = std::min(rows, r0 + tile_rows), c1 = std::min(cols, c0 + tile_cols);
    const float scale = fp8_tile_scale(x, cols, r0, r1, c0, c1, f);
    scale_inv[transposed ? fp8_tile_scale_at(tiles, cols, rows, c0, r0) : fp8_tile_scale_at(tiles, rows, cols, r0, c0)] =
        1.0f / scale;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const float v = float(x[r * cols + c]);
        const uint8_t code = fp8_quantize(v, scale, f);
        out[transposed ? c * rows + r : r * cols + c].bits = code;
        if (std::fabs(v * scale) > over_at) ++over;
        if ((code & 0x7f) == 0 && v != 0.0f) ++under;
      }
  }
  return {over, under};
}

}  // namespace

template <typename Elem>
bool supports(const Fp8BlockCastParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && fp8_detail::params_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const Fp8BlockCastParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const Fp8BlockCastParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(fp8_detail::params_check(p), 0, ws, stream); s != Status::ok) return s;
  if (p.rows == 0 || p.cols == 0) return Status::ok;
  const bool square = p.tiles == Fp8Tiles::block128;
  Fp8Health h = block_pass(p.x, p.rows, p.cols, square ? kTile : 1, kTile, p.format, p.tiles, false, p.out,
                           p.scale_inv);
  if (p.out_t) {
    const Fp8Health ht = block_pass(p.x, p.rows, p.cols, kTile, square ? kTile : 1, p.format, p.tiles, true,
                                    p.out_t, p.scale_inv_t);
    if (!square) h += ht;
  }
  if (p.health) *p.health += h;
  return Status::ok;
}

// Amax.

template <typename Elem>
bool supports(const Fp8AmaxParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && fp8_detail::params_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const Fp8AmaxParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const Fp8AmaxParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(fp8_detail::params_check(p), 0, ws, stream); s != Status::ok) return s;
  amax_store(p.amax, amax_of(p.x, p.n), p.write);
  return Status::ok;
}

// Scale update.

template <typename Elem>
bool supports(const Fp8ScaleUpdateParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && fp8_detail::params_check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const Fp8ScaleUpdateParams<Elem>&, Backend) {
  return 0;
}

template <typename Elem>
Status launch(const Fp8ScaleUpdateParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(fp8_detail::params_check(p), 0, ws, stream); s != Status::ok) return s;
  for (int64_t t = 0; t < p.count; ++t)
    fp8_scale_update_one(p.amax[t], p.history + t * p.history_len, p.history_len, p.format, p.scale + t,
                         p.scale_inv + t * p.scale_inv_stride);
  return Status::ok;
}

// GEMM: decode each operand to code * its scale_inv (fp8_qdq's values, or
// fp8_qdq_tiles's under tiles) in the workspace, then the gemm family's CPU launch with B transposed.

namespace {

template <typename P>
int64_t gemm_scratch(const P& p) {
  using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(p.c)>>;
  return cpu::piece_bytes<Elem>(p.m * p.k) + cpu::piece_bytes<Elem>(p.n * p.k);
}

template <typename Elem>
void decode_into(Elem* dst, const Fp8* src, int64_t rows, int64_t cols, int64_t ld, Fp8Format f,
                 const float* scale_inv, Fp8Tiles tiles) {
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(rows * cols))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[r * cols + c] =
          Elem(fp8_decode(src[r * ld + c].bits, f) * scale_inv[fp8_tile_scale_at(tiles, rows, cols, r, c)]);
}

// Fp8GemmParams<Elem> and Fp8GemmAccParams<Elem> (the same for fp32 and fp64).
template <typename P>
Status gemm_launch(const P& p, Workspace ws, Stream stream) {
  using Elem = std::remove_cv_t<std::remove_pointer_t<decltype(p.c)>>;
  const Status checked = fp8_detail::params_check(p);
  if (Status s = cpu::preflight(checked, checked == Status::ok ? gemm_scratch(p) : 0, ws, stream);
      s != Status::ok)
    return s;
  cpu::WorkspaceCarver carve(ws);
  Elem* a = carve.take<Elem>(p.m * p.k);
  Elem* b = carve.take<Elem>(p.n * p.k);
  if (p.m > 0 && p.n > 0 && p.k > 0) {
    decode_into(a, p.a, p.m, p.k, p.lda, p.a_format, p.a_scale_inv, p.a_tiles);
    decode_into(b, p.b, p.n, p.k, p.ldb, p.b_format, p.b_scale_inv, p.b_tiles);
  }
  const GemmParams<Elem> g{.trans_a = Trans::no,
                           .trans_b = Trans::yes,
                           .m = p.m,
                           .n = p.n,
                           .k = p.k,
                           .alpha = p.alpha,
                           .beta = p.beta,
                           .a = a,
                           .lda = std::max<int64_t>(1, p.k),
                           .b = b,
                           .ldb = std::max<int64_t>(1, p.k),
                           .c = p.c,
                           .ldc = p.ldc};
  return launch(g, Workspace{}, stream);
}

// The rules, then BLAS's 32-bit sizes (the gemm family's CPU limit).
template <typename P>
bool gemm_supports(const P& p, Backend backend) {
  if (backend != Backend::cpu || fp8_detail::params_check(p) != Status::ok) return false;
  for (int64_t v : {p.m, p.n, p.k, p.ldc})
    if (v > INT_MAX) return false;
  return true;
}

}  // namespace

template <typename Elem>
bool supports(const Fp8GemmParams<Elem>& p, Backend backend) {
  return gemm_supports(p, backend);
}
template <typename Elem>
int64_t workspace_bytes(const Fp8GemmParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && fp8_detail::params_check(p) == Status::ok ? gemm_scratch(p) : 0;
}
template <typename Elem>
Status launch(const Fp8GemmParams<Elem>& p, Workspace ws, Stream stream) {
  return gemm_launch(p, ws, stream);
}

template <typename Elem>
bool supports(const Fp8GemmAccParams<Elem>& p, Backend backend) {
  return gemm_supports(p, backend);
}
template <typename Elem>
int64_t workspace_bytes(const Fp8GemmAccParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && fp8_detail::params_check(p) == Status::ok ? gemm_scratch(p) : 0;
}
template <typename Elem>
Status launch(const Fp8GemmAccParams<Elem>& p, Workspace ws, Stream stream) {
  return gemm_launch(p, ws, stream);
}

WEFT_CPU_INSTANTIATE(Fp8CastParams)
WEFT_CPU_INSTANTIATE(Fp8BlockCastParams)
WEFT_CPU_INSTANTIATE(Fp8AmaxParams)
WEFT_CPU_INSTANTIATE(Fp8ScaleUpdateParams)
WEFT_CPU_INSTANTIATE(Fp8GemmParams)
WEFT_CPU_INSTANTIATE(Fp8GemmAccParams)

}  // namespace weft::kernels
