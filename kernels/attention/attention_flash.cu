// Flash attention on CUDA, bf16: weft's own forward and backward kernels,
// called by the routing in attention.cu.
//
// Flash forward (FlashAttention-2). A block of 4 warps owns 64 query rows of
// one (batch, head); each warp owns 16 rows and keeps their Q fragments, the
// O accumulator and the running row max and sum in registers. Key blocks of
// 64 are staged into shared memory with cp.async (K and V single-buffered,
// each loaded while the other is in use) and read with ldmatrix into
// mma.sync.m16n8k16 bf16 fragments; S = Q K^T and O += P V accumulate in
// fp32, P goes from the S accumulators straight into A fragments as bf16.
// The softmax is online, in the log2 domain (ex2.approx, scale * log2(e)
// folded into one FMA). Causal: a query block visits key blocks 0..its own,
// and since query and key blocks are both 64, only the last (diagonal) one
// needs a mask; rows and keys past T are zero-filled and masked the same way.
// Blocks start with the longest query blocks so that the short ones fill the
// tail. Saves lse = scale m + ln(l) per row for the backward.
//
// Flash backward (FlashAttention-2). A preprocessing kernel forms
// delta = rowsum(dO * O) in fp32. The main kernel gives a block of 8 warps
// one 64-key block of one (batch, kv head); it keeps K and V in shared memory
// and walks the query blocks at and after the diagonal for each of the
// H / H_kv query heads that share the kv head, so dK and dV of the group sum
// in registers without atomics. Per 64-query step (Q, dO, lse, delta
// double-buffered with cp.async): S^T = K Q^T and dP^T = V dO^T (warps tile
// 4 key groups x 2 query halves), P^T = exp(S^T - lse) and
// dS^T = P^T (dP^T - delta) go to shared memory as bf16, then
// dV += P^T dO and dK += dS^T Q (4 key groups x 2 D halves) and
// dQ_partial = dS K (4 query groups x 2 D halves). dQ is summed over key
// blocks with fp32 atomics into a workspace that a last kernel scales and
// rounds to bf16. The alternative, a separate dQ pass over query blocks,
// recomputes S and dP: 7 matrix products instead of 5, 40% more backward
// arithmetic, for bitwise reproducible dQ. With the atomics, dQ's fp32 sums
// depend on arrival order; the spread is fp32 rounding (~1e-7 relative),
// visible after the bf16 rounding only as an occasional last-bit flip. dK,
// dV, out and lse are reproducible bit for bit.
//
// Tiles and resources (ptxas -v, nvcc 13.0; no kernel spills or uses a stack
// frame). Rows of a shared tile are D + 8 elements, so the 8 rows one
// ldmatrix reads fall in distinct 16-byte bank groups. Query and key blocks
// are 64 rows; smaller blocks waste less of the masked diagonal, larger ones
// reuse each shared tile over more rows.
//   forward   D 64: 27 KB shared, 155 / 131 registers (sm_80 / sm_90), 4 warps
//             D 128: 51 KB shared, 233 / 238 registers, 4 warps
//   backward  D 64: 73 KB shared, 128 / 128 registers (capped), 8 warps
//             D 128: 121 KB shared, 222 / 224 registers, 8 warps
// Registers, not shared memory, bound the forward: 3 blocks (12 warps) per SM
// at D 64 and 2 (8 warps) at D 128 on both chips; capping D 128 at 168
// registers for a third block spills 180 bytes. A warp holds 16 rows: O is
// 16 x D fp32 (D / 2 registers a thread), S 16 x 64 (32), Q fragments D / 4;
// FlashAttention-2's 32 rows per warp would halve the shared-memory reads per
// MMA but needs twice the accumulators. The backward runs one block per SM at
// D 128 (121 KB, 57 K registers) and two at D 64 (capped at 128 registers,
// which costs no spills); each warp keeps a 16 x D/2 slice of dK and of dV
// (D / 4 registers each).
// Small kernels (delta, softmax rows, conversions, pointer arrays) use 10-40.
#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_cuda.cuh"

namespace weft::kernels::attention_cuda {

namespace {

using gpu::dev;
using gpu::nv_bf16;

constexpr float kLog2e = 1.4426950408889634f;

// ------------------------------------------------------------- device primitives

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zeros when !valid (src unread).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most n of this thread's committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// and each lane receives (row lane/4, columns 2 (lane%4) + {0,1}) of each.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// The same with each 8x8 matrix transposed: a lane receives rows 2 (lane%4)
// + {0,1} of column lane/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// D += A B for a 16x16 bf16 A (row), 16x8 bf16 B (col), fp32 16x8 D. With
// g = lane / 4 and t = lane % 4: A registers hold (g, 2t..2t+1), (g+8, 2t..),
// (g, 2t+8..), (g+8, 2t+8..); B registers (k 2t..2t+1, n g), (k 2t+8.., n g);
// D holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16 in one register, the first in the low half (the lower
// column of a fragment pair).

// 2^x in one instruction (relative error ~2^-22); 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A tile of kRows rows x kD bf16 from global rows [row0, row0 + kRows) (row
// stride ld elements) into shared rows of kStride elements; rows at or past T
// are zero-filled.
template <int kRows, int kD, int kStride, int kThreads>
__device__ __forceinline__ void load_tile(nv_bf16* tile, const nv_bf16* base, int64_t ld,
                                          int64_t row0, int64_t T, int tid) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int chunk = tid + i * kThreads;
    const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * 8;
    const int64_t row = row0 + r;
    const bool valid = row < T;
    cp_async_16(smem_u32(tile + r * kStride + c), base + (valid ? row : 0) * ld + c, valid);
  }
}

// ------------------------------------------------------------- flash forward

// Query and key blocks are the same size, so only the diagonal key block of a
// query block needs a causal mask.
template <int kD>
struct FlashForwardTile {
  static constexpr int kBlockM = 64;  // query rows per block, 16 per warp
  static constexpr int kBlockN = 64;  // keys per step
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStride = kD + 8;  // shared row, padded against bank conflicts
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kStride * int(sizeof(nv_bf16));
  static_assert(kBlockM == kWarps * 16 && kBlockM == kBlockN);
};

struct FlashForwardArgs {
  const nv_bf16* q;  // (B, T, H, D)
  const nv_bf16* k;  // (B, T, H_kv, D)
  const nv_bf16* v;  // (B, T, H_kv, D)
  nv_bf16* out;      // (B, T, H, D)
  float* lse;        // (B, H, T)
  int64_t T, H, H_kv;
  float scale;       // 1 / sqrt(D)
  float scale_log2;  // scale * log2(e)
};

template <int kD>
__global__ void __launch_bounds__(FlashForwardTile<kD>::kThreads)
    flash_forward_kernel(const FlashForwardArgs a) {
  using Tile = FlashForwardTile<kD>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kStride = Tile::kStride;
  constexpr int kNt = kBlockN / 8;  // n8 tiles of S
  constexpr int kDt = kD / 8;       // n8 tiles of O
  extern __shared__ __align__(16) unsigned char smem[];
  nv_bf16* sQ = reinterpret_cast<nv_bf16*>(smem);
  nv_bf16* sK = sQ + kBlockM * kStride;
  nv_bf16* sV = sK + kBlockN * kStride;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int qb = int(gridDim.x) - 1 - int(blockIdx.x);  // longest blocks first
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t hk = h / (a.H / a.H_kv);
  const int64_t ldq = a.H * kD, ldkv = a.H_kv * kD;
  const nv_bf16* q = a.q + (b * a.T * a.H + h) * kD;
  const nv_bf16* k = a.k + (b * a.T * a.H_kv + hk) * kD;
  const nv_bf16* v = a.v + (b * a.T * a.H_kv + hk) * kD;
  const int64_t q0 = int64_t(qb) * kBlockM;

  load_tile<kBlockM, kD, kStride, Tile::kThreads>(sQ, q, ldq, q0, a.T, tid);
  cp_async_commit();
  load_tile<kBlockN, kD, kStride, Tile::kThreads>(sK, k, ldkv, 0, a.T, tid);
  cp_async_commit();

  uint32_t qf[kD / 16][4];
  float o[kDt][4];
#pragma unroll
  for (int i = 0; i < kDt; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // Per thread two rows, g and g + 8 of the warp's 16: running max (raw
  // score units) and this thread's part of the running sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const uint32_t sQ_u = smem_u32(sQ), sK_u = smem_u32(sK), sV_u = smem_u32(sV);
  const int n_kv = qb + 1;

  for (int j = 0; j < n_kv; ++j) {
    // V(j) streams in while S(j) is computed; K(j + 1) while P V(j) is.
    load_tile<kBlockN, kD, kStride, Tile::kThreads>(sV, v, ldkv, int64_t(j) * kBlockN, a.T, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q and K(j) have landed
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kc = 0; kc < kD / 16; ++kc)
        ldmatrix_x4(qf[kc], sQ_u + 2 * ((warp * 16 + lane % 16) * kStride + kc * 16 + (lane / 16) * 8));
    }
    float s[kNt][4];
#pragma unroll
    for (int i = 0; i < kNt; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < kD / 16; ++kc)
#pragma unroll
      for (int np = 0; np < kNt / 2; ++np) {
        // Keys np*16 .. +15: B fragments for two n8 tiles of this k16 chunk.
        uint32_t kf[4];
        ldmatrix_x4(kf, sK_u + 2 * ((np * 16 + lane % 8 + (lane / 16) * 8) * kStride + kc * 16 +
                                    ((lane / 8) % 2) * 8));
        mma_bf16(s[2 * np], qf[kc], kf[0], kf[1]);
        mma_bf16(s[2 * np + 1], qf[kc], kf[2], kf[3]);
      }
    __syncthreads();  // every warp is done with K(j)
    if (j + 1 < n_kv)
      load_tile<kBlockN, kD, kStride, Tile::kThreads>(sK, k, ldkv, int64_t(j + 1) * kBlockN, a.T, tid);
    cp_async_commit();  // possibly empty, so that the group count stays regular

    if (j == qb) {  // the diagonal block: keys after the row are masked
      const int64_t row0 = q0 + warp * 16 + g, key0 = int64_t(j) * kBlockN + 2 * t;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (key0 + nt * 8 + (c & 1) > row0 + (c >= 2 ? 8 : 0)) s[nt][c] = -INFINITY;
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // Every row sees key 0 in its first block, so mx is finite; the guard
      // keeps a fully masked row at zeros rather than NaN all the same.
      const float m_use = mx == -INFINITY ? 0.f : mx;
      const float alpha = exp2_approx((m[r] - m_use) * a.scale_log2);
      m[r] = mx;
      const float ms = m_use * a.scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        s[nt][2 * r] = exp2_approx(fmaf(s[nt][2 * r], a.scale_log2, -ms));
        s[nt][2 * r + 1] = exp2_approx(fmaf(s[nt][2 * r + 1], a.scale_log2, -ms));
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < kDt; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }

    cp_async_wait<1>();  // V(j) has landed (K(j + 1) may still be in flight)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      // The S accumulators of n8 tiles 2kk, 2kk+1 are the A fragment of P for
      // keys kk*16 .. +15.
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, sV_u + 2 * ((kk * 16 + lane % 16) * kStride + dp * 16 + (lane / 16) * 8));
        mma_bf16(o[2 * dp], pa, vf[0], vf[1]);
        mma_bf16(o[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
    __syncthreads();  // every warp is done with V(j) before V(j + 1) lands there
  }

  // Finish the row sums across the quad, normalise, and stage the warp's 16
  // rows in its own rows of sQ (free since the Q fragments were read) for
  // 16-byte stores.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv[2] = {1.f / l[0], 1.f / l[1]};
  nv_bf16* sO = sQ + warp * 16 * kStride;
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    *reinterpret_cast<uint32_t*>(sO + g * kStride + dt * 8 + 2 * t) =
        pack_bf16(o[dt][0] * inv[0], o[dt][1] * inv[0]);
    *reinterpret_cast<uint32_t*>(sO + (g + 8) * kStride + dt * 8 + 2 * t) =
        pack_bf16(o[dt][2] * inv[1], o[dt][3] * inv[1]);
  }
  __syncwarp();
  nv_bf16* out = a.out + (b * a.T * a.H + h) * kD;
#pragma unroll
  for (int i = lane; i < 16 * kD / 8; i += 32) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    const int64_t row = q0 + warp * 16 + r;
    if (row < a.T)
      *reinterpret_cast<uint4*>(out + row * ldq + c) = *reinterpret_cast<const uint4*>(sO + r * kStride + c);
  }
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = q0 + warp * 16 + g + 8 * r;
      if (row < a.T) a.lse[(b * a.H + h) * a.T + row] = m[r] * a.scale + logf(l[r]);
    }
  }
}

// ------------------------------------------------------------- flash backward

// delta = rowsum(dO * O) in fp32, (B, H, T); 8 lanes per (b, t, h) row, 4
// rows per warp. The loop runs alike on all lanes of a warp (the shuffles
// need every lane), and lanes past the last row add zeros.
template <int kD>
__global__ void flash_delta_kernel(const nv_bf16* __restrict__ out, const nv_bf16* __restrict__ dout,
                                   float* __restrict__ delta, int64_t rows, int64_t T, int64_t H) {
  const int part = threadIdx.x % 8;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x / 8;
  const int64_t first = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
  for (int64_t base = first - (threadIdx.x % 32) / 8; base < rows; base += stride) {
    const int64_t row = base + (threadIdx.x % 32) / 8;
    float acc = 0.f;
    if (row < rows) {
#pragma unroll
      for (int c = part * 8; c < kD; c += 64) {
        const uint4 ou = *reinterpret_cast<const uint4*>(out + row * kD + c);
        const uint4 du = *reinterpret_cast<const uint4*>(dout + row * kD + c);
        const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ou);
        const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&du);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 of = __bfloat1622float2(o2[e]), df = __bfloat1622float2(d2[e]);
          acc = fmaf(of.x, df.x, fmaf(of.y, df.y, acc));
        }
      }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (part == 0 && row < rows) {
      const int64_t b = row / (T * H), t = (row / H) % T, h = row % H;
      delta[(b * H + h) * T + t] = acc;
    }
  }
}

template <int kD>
struct FlashBackwardTile {
  static constexpr int kBlockN = 64;  // keys per block
  static constexpr int kBlockM = 64;  // queries per step
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // Two blocks per SM at D 64 (128 registers, no spills; 152 uncapped allowed
  // one); at D 128 one block already takes 121 KB of shared memory.
  static constexpr int kMinBlocks = kD == 64 ? 2 : 1;
  static constexpr int kStride = kD + 8;
  static constexpr int kPStride = kBlockM + 8;  // rows of the P^T and dS^T tiles
  static constexpr int kTileBytes = kBlockM * kStride * int(sizeof(nv_bf16));
  // K, V, Q[2], dO[2], P^T, dS^T, lse[2], delta[2]
  static constexpr int kSmemBytes = 6 * kTileBytes + 2 * kBlockN * kPStride * int(sizeof(nv_bf16)) +
                                    4 * kBlockM * int(sizeof(float));
  static_assert(kBlockM == kBlockN && kWarps == 8 && kBlockN == 4 * 16 && kBlockM == 2 * 32);
};

struct FlashBackwardArgs {
  const nv_bf16* q;     // (B, T, H, D)
  const nv_bf16* k;     // (B, T, H_kv, D)
  const nv_bf16* v;     // (B, T, H_kv, D)
  const nv_bf16* dout;  // (B, T, H, D)
  const float* lse;     // (B, H, T)
  const float* delta;   // (B, H, T)
  float* dq_acc;        // (B, T, H, D), zeroed; unscaled sums of dS K
  nv_bf16* dk;          // (B, T, H_kv, D)
  nv_bf16* dv;          // (B, T, H_kv, D)
  int64_t T, H, H_kv;
  float scale, scale_log2;
};

template <int kD>
__global__ void __launch_bounds__(FlashBackwardTile<kD>::kThreads, FlashBackwardTile<kD>::kMinBlocks)
    flash_backward_kernel(const FlashBackwardArgs a) {
  using Tile = FlashBackwardTile<kD>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  constexpr int kStride = Tile::kStride, kPStride = Tile::kPStride, kThreads = Tile::kThreads;
  constexpr int kHalf = kD / 2;  // the D columns a warp owns in dK, dV and dQ
  constexpr int kHt = kHalf / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  nv_bf16* sK = reinterpret_cast<nv_bf16*>(smem);
  nv_bf16* sV = sK + kBlockN * kStride;
  nv_bf16* sQ = sV + kBlockN * kStride;       // two buffers
  nv_bf16* sdO = sQ + 2 * kBlockM * kStride;  // two buffers
  nv_bf16* sP = sdO + 2 * kBlockM * kStride;  // P^T (key, query)
  nv_bf16* sdS = sP + kBlockN * kPStride;     // dS^T (key, query)
  float* sLse = reinterpret_cast<float*>(sdS + kBlockN * kPStride);  // two buffers
  float* sDelta = sLse + 2 * kBlockM;                                // two buffers

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const int kb = blockIdx.x;  // block 0 has the most query blocks: it starts first
  const int64_t hk = blockIdx.y, b = blockIdx.z;
  const int64_t group = a.H / a.H_kv;
  const int64_t ldq = a.H * kD, ldkv = a.H_kv * kD;
  const int64_t k0 = int64_t(kb) * kBlockN;
  const int n_qb = int((a.T + kBlockM - 1) / kBlockM);
  const int per_head = n_qb - kb;  // query blocks at and after the diagonal
  const int n_steps = int(group) * per_head;

  const nv_bf16* kbase = a.k + (b * a.T * a.H_kv + hk) * kD;
  const nv_bf16* vbase = a.v + (b * a.T * a.H_kv + hk) * kD;
  auto load_step = [&](int s, int buf) {
    const int64_t h = hk * group + s / per_head;
    const int64_t q0 = int64_t(kb + s % per_head) * kBlockM;
    load_tile<kBlockM, kD, kStride, kThreads>(sQ + buf * kBlockM * kStride,
                                              a.q + (b * a.T * a.H + h) * kD, ldq, q0, a.T, tid);
    load_tile<kBlockM, kD, kStride, kThreads>(sdO + buf * kBlockM * kStride,
                                              a.dout + (b * a.T * a.H + h) * kD, ldq, q0, a.T, tid);
    if (tid < 2 * kBlockM) {
      const int i = tid % kBlockM;
      const int64_t row = q0 + i;
      const bool valid = row < a.T;
      const float* src = (tid < kBlockM ? a.lse : a.delta) + (b * a.H + h) * a.T + (valid ? row : 0);
      float* dst = (tid < kBlockM ? sLse : sDelta) + buf * kBlockM + i;
      cp_async_4(smem_u32(dst), src, valid);
    }
  };

  load_tile<kBlockN, kD, kStride, kThreads>(sK, kbase, ldkv, k0, a.T, tid);
  load_tile<kBlockN, kD, kStride, kThreads>(sV, vbase, ldkv, k0, a.T, tid);
  load_step(0, 0);
  cp_async_commit();

  // Phase A tiling: 16 keys x 32 queries per warp; phases B and C: 16 keys
  // (dK, dV) or 16 queries (dQ) x D/2 columns.
  const int kw = warp % 4, qh = warp / 4, dh = warp / 4;
  float dk[kHt][4], dv[kHt][4];
#pragma unroll
  for (int i = 0; i < kHt; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) dk[i][c] = dv[i][c] = 0.f;
  const uint32_t sK_u = smem_u32(sK), sV_u = smem_u32(sV), sP_u = smem_u32(sP), sdS_u = smem_u32(sdS);

  for (int s = 0; s < n_steps; ++s) {
    if (s + 1 < n_steps) load_step(s + 1, (s + 1) % 2);
    cp_async_commit();
    cp_async_wait<1>();  // step s (and K, V) have landed
    __syncthreads();

    const int buf = s % 2;
    const int64_t h = hk * group + s / per_head;
    const int qb = kb + s % per_head;
    const int64_t q0 = int64_t(qb) * kBlockM;
    const uint32_t sQ_u = smem_u32(sQ + buf * kBlockM * kStride);
    const uint32_t sdO_u = smem_u32(sdO + buf * kBlockM * kStride);
    const float* lse = sLse + buf * kBlockM;
    const float* delta = sDelta + buf * kBlockM;

    // Phase A: S^T = K Q^T and dP^T = V dO^T for keys kw*16.., queries qh*32..
    float st[4][4], dpt[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c) st[i][c] = dpt[i][c] = 0.f;
#pragma unroll
    for (int kc = 0; kc < kD / 16; ++kc) {
      uint32_t ka[4], va[4];
      const uint32_t a_off = 2 * ((kw * 16 + lane % 16) * kStride + kc * 16 + (lane / 16) * 8);
      ldmatrix_x4(ka, sK_u + a_off);
      ldmatrix_x4(va, sV_u + a_off);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const uint32_t b_off =
            2 * ((qh * 32 + np * 16 + lane % 8 + (lane / 16) * 8) * kStride + kc * 16 + ((lane / 8) % 2) * 8);
        uint32_t qf[4], df[4];
        ldmatrix_x4(qf, sQ_u + b_off);
        mma_bf16(st[2 * np], ka, qf[0], qf[1]);
        mma_bf16(st[2 * np + 1], ka, qf[2], qf[3]);
        ldmatrix_x4(df, sdO_u + b_off);
        mma_bf16(dpt[2 * np], va, df[0], df[1]);
        mma_bf16(dpt[2 * np + 1], va, df[2], df[3]);
      }
    }
    // P^T = exp(scale S^T - lse) and dS^T = P^T (dP^T - delta), zero where the
    // key follows the query (diagonal step) or the query is past T (last one).
    const bool need_mask = qb == kb || q0 + kBlockM > a.T;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = qh * 32 + nt * 8 + 2 * t + c;
        const float lse2 = lse[col] * kLog2e, dl = delta[col];
        const int64_t query = q0 + col;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t key = k0 + kw * 16 + g + 8 * r;
          float p = exp2_approx(fmaf(st[nt][2 * r + c], a.scale_log2, -lse2));
          if (need_mask && (key > query || query >= a.T)) p = 0.f;
          st[nt][2 * r + c] = p;
          dpt[nt][2 * r + c] = p * (dpt[nt][2 * r + c] - dl);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int at = (kw * 16 + g + 8 * r) * kPStride + qh * 32 + nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sP + at) = pack_bf16(st[nt][2 * r], st[nt][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(sdS + at) = pack_bf16(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
      }
    }
    __syncthreads();

    // Phase B: dV += P^T dO and dK += dS^T Q for keys kw*16.., columns dh*D/2..
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t pa[4], sa[4];
      const uint32_t a_off = 2 * ((kw * 16 + lane % 16) * kPStride + kk * 16 + (lane / 16) * 8);
      ldmatrix_x4(pa, sP_u + a_off);
      ldmatrix_x4(sa, sdS_u + a_off);
#pragma unroll
      for (int dp = 0; dp < kHalf / 16; ++dp) {
        const uint32_t b_off = 2 * ((kk * 16 + lane % 16) * kStride + dh * kHalf + dp * 16 + (lane / 16) * 8);
        uint32_t df[4], qf[4];
        ldmatrix_x4_trans(df, sdO_u + b_off);
        mma_bf16(dv[2 * dp], pa, df[0], df[1]);
        mma_bf16(dv[2 * dp + 1], pa, df[2], df[3]);
        ldmatrix_x4_trans(qf, sQ_u + b_off);
        mma_bf16(dk[2 * dp], sa, qf[0], qf[1]);
        mma_bf16(dk[2 * dp + 1], sa, qf[2], qf[3]);
      }
    }

    // Phase C: dQ_partial = dS K for queries kw*16.., columns dh*D/2.. The A
    // fragment of dS comes transposed out of the (key, query) dS^T tile.
    {
      const int qw = kw;
      float dq[kHt][4];
#pragma unroll
      for (int i = 0; i < kHt; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t sa[4];
        ldmatrix_x4_trans(sa, sdS_u + 2 * ((kk * 16 + lane % 8 + (lane / 16) * 8) * kPStride + qw * 16 +
                                           ((lane / 8) % 2) * 8));
#pragma unroll
        for (int dp = 0; dp < kHalf / 16; ++dp) {
          uint32_t kf[4];
          ldmatrix_x4_trans(kf, sK_u + 2 * ((kk * 16 + lane % 16) * kStride + dh * kHalf + dp * 16 +
                                            (lane / 16) * 8));
          mma_bf16(dq[2 * dp], sa, kf[0], kf[1]);
          mma_bf16(dq[2 * dp + 1], sa, kf[2], kf[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t query = q0 + qw * 16 + g + 8 * r;
        if (query >= a.T) continue;
        float* row = a.dq_acc + ((b * a.T + query) * a.H + h) * kD + dh * kHalf + 2 * t;
#pragma unroll
        for (int nt = 0; nt < kHt; ++nt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2*>(row + nt * 8), make_float2(dq[nt][2 * r], dq[nt][2 * r + 1]));
#else
          atomicAdd(row + nt * 8, dq[nt][2 * r]);
          atomicAdd(row + nt * 8 + 1, dq[nt][2 * r + 1]);
#endif
        }
      }
    }
    __syncthreads();  // buffers of step s are free for step s + 2
  }

  // dK carries the softmax scale (dK = scale dS^T Q); rows past T are not written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = k0 + kw * 16 + g + 8 * r;
    if (key >= a.T) continue;
    const int64_t at = (b * a.T + key) * a.H_kv * kD + hk * kD + dh * kHalf + 2 * t;
#pragma unroll
    for (int nt = 0; nt < kHt; ++nt) {
      *reinterpret_cast<uint32_t*>(a.dk + at + nt * 8) =
          pack_bf16(dk[nt][2 * r] * a.scale, dk[nt][2 * r + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(a.dv + at + nt * 8) = pack_bf16(dv[nt][2 * r], dv[nt][2 * r + 1]);
    }
  }
}

template <int kD>
void flash_forward_d(const AttentionForwardParams<bf16>& p, cudaStream_t stream) {
  using Tile = FlashForwardTile<kD>;
  const FlashForwardArgs a{dev(p.q), dev(p.k), dev(p.v), dev(p.out), p.lse, p.T, p.H, p.H_kv,
                           1.f / std::sqrt(float(p.D)), kLog2e / std::sqrt(float(p.D))};
  auto kernel = flash_forward_kernel<kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const dim3 grid(unsigned((p.T + Tile::kBlockM - 1) / Tile::kBlockM), unsigned(p.H), unsigned(p.B));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  WEFT_LAUNCH_CHECK(stream, "flash_forward_kernel");
}

template <int kD>
void flash_backward_d(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  using Tile = FlashBackwardTile<kD>;
  char* base = static_cast<char*>(ws.data);
  float* delta = reinterpret_cast<float*>(base);
  float* dq_acc = reinterpret_cast<float*>(base + piece(p.B * p.H * p.T * 4));
  const int64_t rows = p.B * p.T * p.H, n_dq = rows * p.D;
  const float scale = 1.f / std::sqrt(float(p.D));

  flash_delta_kernel<kD><<<blocks(rows * 8, 256), 256, 0, stream>>>(dev(p.out), dev(p.dout), delta, rows,
                                                                      p.T, p.H);
  WEFT_LAUNCH_CHECK(stream, "flash_delta_kernel");
  CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(n_dq) * sizeof(float), stream));

  const FlashBackwardArgs a{dev(p.q), dev(p.k), dev(p.v), dev(p.dout), p.lse, delta, dq_acc, dev(p.dk),
                            dev(p.dv), p.T, p.H, p.H_kv, scale, scale * kLog2e};
  auto kernel = flash_backward_kernel<kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const dim3 grid(unsigned((p.T + Tile::kBlockN - 1) / Tile::kBlockN), unsigned(p.H_kv), unsigned(p.B));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  WEFT_LAUNCH_CHECK(stream, "flash_backward_kernel");

  scale_to_bf16(dq_acc, dev(p.dq), n_dq, scale, stream);
}

}  // namespace

int64_t flash_backward_workspace(const AttentionBackwardParams<bf16>& p) {
  return piece(p.B * p.H * p.T * 4) + piece(p.B * p.T * p.H * p.D * 4);
}

void flash_forward(const AttentionForwardParams<bf16>& p, cudaStream_t stream) {
  if (p.D == 64) flash_forward_d<64>(p, stream);
  else flash_forward_d<128>(p, stream);
}

void flash_backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.D == 64) flash_backward_d<64>(p, ws, stream);
  else flash_backward_d<128>(p, ws, stream);
}

}  // namespace weft::kernels::attention_cuda
