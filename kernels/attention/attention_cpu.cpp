// attention on the CPU: causal GQA attention, flash-style and materialized,
// as BLAS GEMMs on tiles.
//
// Work is dealt out in items, one per (batch, kv head); an item runs the
// H / H_kv query heads that share its kv head, kQueryBlock query rows at a
// time, on one thread, whose GEMMs run on that thread (items_in_parallel has
// the one exception). A block of rows [i0, i1) sees keys [0, i1), so its
// scores S = scale * Q_blk K[0:i1]^T are one GEMM into a (rows x i1) tile; the
// softmax masks the keys past each row's own position (the upper triangle of
// the diagonal part) and zeroes them, and the output P V is a second GEMM.
//
// Flash saves lse per row. Its backward recomputes, per block,
// P = exp(S - lse) and dP = dO V^T (GEMMs), forms dS = P (dP - delta) with
// delta_i = rowsum(dO_i * O_i) in place, and takes dQ_blk = scale dS K,
// dK += scale dS^T Q_blk and dV += P^T dO_blk as three more GEMMs.
//
// Materialized writes the scores of a block straight into the saved
// probabilities and softmaxes them there, as an eager framework would; its
// backward reads P back and needs only the dP tile (delta_i = sum_j P_ij dP_ij).
//
// A block of the sequence (context parallelism) runs the same loops with the
// keys a row sees counted from the positions: row i (at q_offset + i) sees
// keys [0, q_offset + i - k_offset + 1) of the Tk given, none when that is
// below 1 (out 0, lse -inf), all when it passes Tk.
//
// Chunked attention (chunk > 0) also drops the keys before the start of the
// row's chunk, floor((q_offset + i) / chunk) * chunk: row i sees keys
// [first(i), visible(i)). The first key only grows down a block, so a
// block's tiles start at its first row's first key, and each row masks the
// few keys before its own, as it masks those past its position. A block
// within one chunk thus multiplies only the keys of that chunk: the work
// is at most (chunk + rows) keys per row, not the whole prefix.
//
// An item owns its kv head's dK and dV, and walks its heads and blocks in a
// fixed order, so no atomics are needed and the results do not depend on the
// thread count. Tiles live in the workspace, one set per item, so the scratch
// is the same for any thread count.
//
// Measured on the small preset (B 8, T 256, H 8, D 64, fp32, 2 threads),
// forward + backward of one layer, flash: 117 ms with per-row dot products
// and a scalar online softmax, 19 ms with tiles; materialized 71 ms, 16 ms.
// Compiling the softmax loops for AVX2 would save another 8%; the build
// targets baseline x86-64, and that was not worth a dispatch.
#include "kernels/attention/attention.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/attention/attention_check.h"
#include "kernels/cpu_common.h"
#include "kernels/cpu_math.h"
#include "kernels/gemm/blas_core.h"

namespace weft::kernels {
namespace {

// Query rows per block. Measured on the small preset (T 256, D 64, 2
// threads), forward + backward per layer: 16 rows 20.4 ms, 32 rows 18.7 ms,
// 64 rows 19.6 ms, 128 rows 22.7 ms, 256 rows (no blocks) 27.5 ms. Fewer rows
// waste less of the masked diagonal tiles (T / 64 of T^2 / 2 pairs at 32) and
// keep the tiles small; more rows make larger, faster GEMMs.
constexpr int64_t kQueryBlock = 32;

int64_t block_rows(int64_t T) { return std::min(kQueryBlock, T); }

// (block_rows x T) Acc tiles an item uses: the flash forward's scores; the
// flash backward's P and dP; the materialized backward's dP (its P is the
// saved probs, into which its forward writes the scores directly).
int64_t forward_tiles(AttentionKind kind) { return kind == AttentionKind::flash ? 1 : 0; }
int64_t backward_tiles(AttentionKind kind) { return kind == AttentionKind::flash ? 2 : 1; }

// Flat offsets into the layouts, with a block's strides (attention.h).
struct Dims {
  int64_t B, T, H, H_kv, D;
  int64_t Tk;                  // keys
  int64_t q_off, k_off;        // sequence positions of the first query and key
  int64_t chunk;               // positions per attention chunk, 0: none
  int64_t q_rows, kv_rows, lse_rows;  // rows from one sequence of the batch to the next
  int64_t group() const { return H / H_kv; }
  int64_t items() const { return B * H_kv; }
  int64_t q_at(int64_t b, int64_t t, int64_t h) const { return ((b * q_rows + t) * H + h) * D; }
  int64_t kv_at(int64_t b, int64_t t, int64_t hk) const { return ((b * kv_rows + t) * H_kv + hk) * D; }
  int64_t row_at(int64_t b, int64_t h, int64_t t) const { return (b * H + h) * lse_rows + t; }
  int64_t probs_at(int64_t b, int64_t h, int64_t i) const { return ((b * H + h) * T + i) * Tk; }
  int64_t ld_q() const { return H * D; }
  int64_t ld_kv() const { return H_kv * D; }
  // Keys query row i sees: those at or before its position.
  int64_t visible(int64_t i) const { return std::clamp<int64_t>(q_off + i - k_off + 1, 0, Tk); }
  // The first key query row i sees: that of its chunk's start, 0 without
  // chunks; at most visible(i), since a chunk starts at or before its rows.
  int64_t first(int64_t i) const {
    if (chunk <= 0) return 0;
    return std::clamp<int64_t>((q_off + i) / chunk * chunk - k_off, 0, visible(i));
  }
};

template <typename P>
Dims dims_of(const P& p) {
  const int64_t Tk = p.Tk ? p.Tk : p.T;
  return {p.B,        p.T,        p.H,
          p.H_kv,     p.D,        Tk,
          p.q_offset, p.k_offset, p.chunk,    p.q_batch_rows ? p.q_batch_rows : p.T,
          p.kv_batch_rows ? p.kv_batch_rows : Tk, p.lse_batch_rows ? p.lse_batch_rows : p.T};
}

// Elements from one tile to the next: a tile is one 64-byte aligned piece.
template <typename A>
int64_t tile_stride(const Dims& d) {
  return cpu::piece_bytes<A>(block_rows(d.T) * d.Tk) / int64_t(sizeof(A));
}

template <typename A>
int64_t tiles_bytes(const Dims& d, int64_t tiles_per_item) {
  return d.items() * tiles_per_item * cpu::piece_bytes<A>(block_rows(d.T) * d.Tk);
}

// C = alpha op(A) op(B) + beta C, row-major, on the calling thread when
// called inside a parallel region.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  blas_core();
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  blas_core();
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
constexpr bool kT = true, kN = false;

// Softmax in place of a row's scores [first, visible); the rest of the row,
// up to `width`, is zeroed. Returns the row's log-sum-exp (-inf when it sees
// no key, the row then all zero).
template <typename A>
A softmax_row(A* s, int64_t first, int64_t visible, int64_t width) {
  std::fill(s, s + first, A(0));
  if (visible == first) {
    std::fill(s + first, s + width, A(0));
    return -std::numeric_limits<A>::infinity();
  }
  A mx = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = first; j < visible; ++j) mx = s[j] > mx ? s[j] : mx;  // maxps; std::max does not vectorize
  A sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = first; j < visible; ++j) {
    s[j] = cpu::exp_nonpositive(s[j] - mx);
    sum += s[j];
  }
  const A inv = A(1) / sum;
#pragma omp simd
  for (int64_t j = first; j < visible; ++j) s[j] *= inv;
  std::fill(s + visible, s + width, A(0));
  return mx + std::log(sum);
}

// The dS row of the flash backward: p = exp(s - lse) in place,
// dp = p (dp - delta), on the keys [first, visible), both zero elsewhere (a
// row that sees none contributes nothing, whatever its lse).
template <typename A>
void flash_grad_row(A* s, A* dp, int64_t first, int64_t visible, int64_t width, A lse, A delta) {
  if (visible == first) lse = 0;
  std::fill(s, s + first, A(0));
  std::fill(dp, dp + first, A(0));
#pragma omp simd
  for (int64_t j = first; j < visible; ++j) {
    const A pj = cpu::exp_nonpositive(s[j] - lse);
    s[j] = pj;
    dp[j] = pj * (dp[j] - delta);
  }
  std::fill(s + visible, s + width, A(0));
  std::fill(dp + visible, dp + width, A(0));
}

// The dS row of the materialized backward from the saved probabilities,
// which are zero outside [first, visible).
template <typename A>
void materialized_grad_row(const A* prob, A* dp, int64_t first, int64_t visible, int64_t width) {
  A delta = 0;
#pragma omp simd reduction(+ : delta)
  for (int64_t j = first; j < visible; ++j) delta += prob[j] * dp[j];
  std::fill(dp, dp + first, A(0));
#pragma omp simd
  for (int64_t j = first; j < visible; ++j) dp[j] = prob[j] * (dp[j] - delta);
  std::fill(dp + visible, dp + width, A(0));
}

// Multiply-adds of one pass over the (query, key) pairs a call can see.
template <typename P>
int64_t pair_work(const P& p) {
  const Dims d = dims_of(p);
  const int64_t keys = std::min(d.Tk, d.visible(p.T - 1));
  return p.B * p.H * p.T * (d.chunk > 0 ? std::min(keys, d.chunk) : keys) * p.D;
}

// Whether items run on the OpenMP team. A BLAS call inside a parallel region
// runs on its calling thread only in OpenBLAS's OpenMP build; the pthread
// build would start its own pool from every team thread at once (measured on
// the small preset: 17x slower), so there the items run one after another
// and BLAS threads each GEMM (1.8x slower than the OpenMP build; BLAS splits
// rows and columns, so the results stay the same).
template <typename P>
bool items_in_parallel(const P& p) {
  static const bool blas_on_calling_thread = openblas_get_parallel() != OPENBLAS_THREAD;
  return blas_on_calling_thread && cpu::worth_parallel(pair_work(p));
}

// BLAS takes 32-bit sizes and leading dimensions.
bool fits_blas(int64_t T, int64_t H, int64_t D) { return T <= INT_MAX && H * D <= INT_MAX; }
template <typename P>
bool fits_blas(const P& p) {
  return fits_blas(std::max(p.T, p.Tk), p.H, p.D);
}

// The shared rules (attention_check.h), then BLAS's 32-bit sizes.
template <typename P>
Status check(const P& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  // cudnn is cuDNN's kernels, which only the CUDA backend has.
  if (p.kind == AttentionKind::cudnn) return Status::unsupported;
  return fits_blas(p) ? Status::ok : Status::unsupported;
}

// The CPU instantiations compute in their element type, so tiles, saved
// probabilities and outputs share one type and feed BLAS directly.
template <typename Elem>
constexpr bool kElemIsAcc = std::is_same_v<Elem, Acc<Elem>>;

template <typename Elem>
void attention_forward(const AttentionForwardParams<Elem>& p, Elem* tiles) {
  static_assert(kElemIsAcc<Elem>);
  using A = Elem;
  const Dims d = dims_of(p);
  const A scale = A(1) / std::sqrt(A(p.D));
  const bool flash = p.kind == AttentionKind::flash;
  const int64_t rows = block_rows(d.T), stride = tile_stride<A>(d);
#pragma omp parallel for schedule(dynamic, 1) if (items_in_parallel(p))
  for (int64_t item = 0; item < d.items(); ++item) {
    const int64_t b = item / d.H_kv, hk = item % d.H_kv;
    const Elem* k = p.k + d.kv_at(b, 0, hk);
    const Elem* v = p.v + d.kv_at(b, 0, hk);
    for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h)
      for (int64_t i0 = 0; i0 < d.T; i0 += rows) {
        // Rows, the first key the first row sees, the keys [j0, n) of the tile.
        const int64_t m = std::min(rows, d.T - i0), j0 = d.first(i0), n = d.visible(i0 + m - 1) - j0;
        // Flash scores go to the item's tile, whose column 0 is key j0;
        // materialized ones into the saved probabilities, whose rows run
        // over all Tk keys.
        A* s = flash ? tiles + item * stride : p.probs + d.probs_at(b, h, i0);
        const int64_t lds = flash ? std::max<int64_t>(n, 1) : d.Tk, base = flash ? j0 : 0;
        A* s_j0 = s + (j0 - base);
        if (n > 0)
          gemm(kN, kT, m, n, d.D, scale, p.q + d.q_at(b, i0, h), d.ld_q(), k + j0 * d.ld_kv(), d.ld_kv(), A(0), s_j0,
               lds);
        for (int64_t r = 0; r < m; ++r) {
          const A lse = softmax_row(s + r * lds, d.first(i0 + r) - base, d.visible(i0 + r) - base, flash ? n : lds);
          if (p.lse) p.lse[d.row_at(b, h, i0 + r)] = lse;
        }
        if (n > 0) {
          gemm(kN, kN, m, d.D, n, A(1), s_j0, lds, v + j0 * d.ld_kv(), d.ld_kv(), A(0), p.out + d.q_at(b, i0, h),
               d.ld_q());
        } else {
          for (int64_t r = 0; r < m; ++r) std::fill_n(p.out + d.q_at(b, i0 + r, h), d.D, Elem(0));
        }
      }
  }
}

template <typename Elem>
void attention_backward(const AttentionBackwardParams<Elem>& p, Elem* tiles) {
  static_assert(kElemIsAcc<Elem>);
  using A = Elem;
  const Dims d = dims_of(p);
  const A scale = A(1) / std::sqrt(A(p.D));
  const bool flash = p.kind == AttentionKind::flash;
  const int64_t rows = block_rows(d.T), stride = tile_stride<A>(d);
  const int64_t n_tiles = backward_tiles(p.kind);
#pragma omp parallel for schedule(dynamic, 1) if (items_in_parallel(p))
  for (int64_t item = 0; item < d.items(); ++item) {
    const int64_t b = item / d.H_kv, hk = item % d.H_kv;
    const Elem* k = p.k + d.kv_at(b, 0, hk);
    const Elem* v = p.v + d.kv_at(b, 0, hk);
    Elem* dk = p.dk + d.kv_at(b, 0, hk);
    Elem* dv = p.dv + d.kv_at(b, 0, hk);
    if (p.dkv_write == Write::overwrite)
      for (int64_t t = 0; t < d.Tk; ++t) {
        std::fill_n(dk + t * d.ld_kv(), d.D, Elem(0));
        std::fill_n(dv + t * d.ld_kv(), d.D, Elem(0));
      }
    const A dq_beta = p.dq_write == Write::accumulate ? A(1) : A(0);
    A* s = tiles + item * n_tiles * stride;  // flash: scores, then P
    A* dp = s + (n_tiles - 1) * stride;      // dP, then dS
    for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h)
      for (int64_t i0 = 0; i0 < d.T; i0 += rows) {
        const int64_t m = std::min(rows, d.T - i0), j0 = d.first(i0), n = d.visible(i0 + m - 1) - j0;
        const Elem* q = p.q + d.q_at(b, i0, h);
        const Elem* k_j0 = k + j0 * d.ld_kv();
        const Elem* v_j0 = v + j0 * d.ld_kv();
        const Elem* dout = p.dout + d.q_at(b, i0, h);
        if (n <= 0) {  // no key in sight: no gradient
          if (p.dq_write == Write::overwrite)
            for (int64_t r = 0; r < m; ++r) std::fill_n(p.dq + d.q_at(b, i0 + r, h), d.D, Elem(0));
          continue;
        }
        // The tiles' column 0 is key j0.
        gemm(kN, kT, m, n, d.D, A(1), dout, d.ld_q(), v_j0, d.ld_kv(), A(0), dp, n);
        const A* prob;
        int64_t ldp;
        if (flash) {
          gemm(kN, kT, m, n, d.D, scale, q, d.ld_q(), k_j0, d.ld_kv(), A(0), s, n);
          for (int64_t r = 0; r < m; ++r) {
            const Elem* o_r = p.out + d.q_at(b, i0 + r, h);
            const Elem* do_r = dout + r * d.ld_q();
            A delta = 0;
#pragma omp simd reduction(+ : delta)
            for (int64_t c = 0; c < d.D; ++c) delta += do_r[c] * o_r[c];
            flash_grad_row(s + r * n, dp + r * n, d.first(i0 + r) - j0, d.visible(i0 + r) - j0, n,
                           p.lse[d.row_at(b, h, i0 + r)], delta);
          }
          prob = s;
          ldp = n;
        } else {
          prob = p.probs + d.probs_at(b, h, i0) + j0;
          ldp = d.Tk;
          for (int64_t r = 0; r < m; ++r)
            materialized_grad_row(prob + r * ldp, dp + r * n, d.first(i0 + r) - j0, d.visible(i0 + r) - j0, n);
        }
        // dp now holds dS (zero past each row's keys), prob holds P.
        gemm(kN, kN, m, d.D, n, scale, dp, n, k_j0, d.ld_kv(), dq_beta, p.dq + d.q_at(b, i0, h), d.ld_q());
        gemm(kT, kN, n, d.D, m, scale, dp, n, q, d.ld_q(), A(1), dk + j0 * d.ld_kv(), d.ld_kv());
        gemm(kT, kN, n, d.D, m, A(1), prob, ldp, dout, d.ld_q(), A(1), dv + j0 * d.ld_kv(), d.ld_kv());
      }
  }
}

}  // namespace

template <typename Elem>
bool supports(const AttentionForwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const AttentionForwardParams<Elem>& p, Backend) {
  if (check(p) != Status::ok) return 0;
  return tiles_bytes<Acc<Elem>>(dims_of(p), forward_tiles(p.kind));
}

template <typename Elem>
Status launch(const AttentionForwardParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(check(p), workspace_bytes(p), ws, stream); s != Status::ok) return s;
  attention_forward(p, static_cast<Elem*>(ws.data));
  return Status::ok;
}

template <typename Elem>
bool supports(const AttentionBackwardParams<Elem>& p, Backend backend) {
  return backend == Backend::cpu && check(p) == Status::ok;
}

template <typename Elem>
int64_t workspace_bytes(const AttentionBackwardParams<Elem>& p, Backend) {
  if (check(p) != Status::ok) return 0;
  return tiles_bytes<Acc<Elem>>(dims_of(p), backward_tiles(p.kind));
}

template <typename Elem>
Status launch(const AttentionBackwardParams<Elem>& p, Workspace ws, Stream stream) {
  if (Status s = cpu::preflight(check(p), workspace_bytes(p), ws, stream); s != Status::ok) return s;
  attention_backward(p, static_cast<Elem*>(ws.data));
  return Status::ok;
}

WEFT_CPU_INSTANTIATE(AttentionForwardParams)
WEFT_CPU_INSTANTIATE(AttentionBackwardParams)

}  // namespace weft::kernels
