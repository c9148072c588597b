// attention on CUDA, bf16: weft's own flash attention (forward and backward)
// and the materialized variant through cuBLAS, behind the protocol of
// kernels/attention/attention.h. Both compute what attention_cpu.cpp computes:
// causal softmax(scale Q K^T) V, scale = 1 / sqrt(D), query head h reading kv
// head h / (H / H_kv).
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
// Materialized, as an eager framework runs it: one batched cuBLAS GEMM
// (bf16 in, fp32 compute, bf16 out) writes the scaled scores straight into
// the saved probabilities, a fused kernel masks, softmaxes (fp32) and writes
// P in place with zeros above the diagonal (and lse), and a second GEMM
// forms O = P V. The backward forms dP = dO V^T into the workspace, a fused
// kernel turns it into dS = P (dP - rowsum(P dP)) in place, and GEMMs form
// dQ = scale dS K, dK = scale dS^T Q and dV = P^T dO, the last two summing
// the group's query heads into fp32 workspace (beta = 1) that is rounded to
// bf16 once. GEMMs go through cublasGemmBatchedEx with pointer arrays built
// on the device, since a (batch, head) slice of (B, T, H, D) has no single
// batch stride once GQA maps several heads to one kv head.
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
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_check.h"
#include "kernels/cuda_common.cuh"

namespace weft::kernels {
namespace {

using gpu::dev;
using gpu::nv_bf16;

// One cuBLAS handle per thread and device: a handle must not be driven from
// two threads at once, and creating one costs milliseconds. Handles are never
// destroyed: at thread or process exit the CUDA context may already be gone.
cublasHandle_t cublas_handle(cudaStream_t stream) {
  thread_local std::vector<cublasHandle_t> handles;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (handles.size() <= size_t(device)) handles.resize(size_t(device) + 1, nullptr);
  if (handles[device] == nullptr) CUBLAS_CHECK(cublasCreate(&handles[device]));
  CUBLAS_CHECK(cublasSetStream(handles[device], stream));
  return handles[device];
}

// The flash kernels use bf16 tensor-core MMA, sm_80 and newer.
bool device_has_bf16_mma() {
  int device = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

bool aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }

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
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

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

// out = bf16(scale * in), elementwise.
__global__ void scale_to_bf16_kernel(const float* __restrict__ in, nv_bf16* __restrict__ out, int64_t n,
                                     float scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16_rn(in[i] * scale);
}

// ------------------------------------------------------------- materialized

__device__ __forceinline__ void warp_max_sum(float& m, float& l) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), l2 = __shfl_xor_sync(0xffffffffu, l, off);
    const float mn = fmaxf(m, m2);
    l = (m == -INFINITY ? 0.f : l * __expf(m - mn)) + (m2 == -INFINITY ? 0.f : l2 * __expf(m2 - mn));
    m = mn;
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// W consecutive bf16 as floats: one 16-byte access when W is 8.
template <int W>
__device__ __forceinline__ void load_bf16(const nv_bf16* p, float (&x)[W]) {
  if constexpr (W == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      x[2 * e] = f.x;
      x[2 * e + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) x[e] = __bfloat162float(p[e]);
  }
}
template <int W>
__device__ __forceinline__ void store_bf16(nv_bf16* p, const float (&x)[W]) {
  if constexpr (W == 8) {
    uint4 u;
    u.x = pack_bf16(x[0], x[1]);
    u.y = pack_bf16(x[2], x[3]);
    u.z = pack_bf16(x[4], x[5]);
    u.w = pack_bf16(x[6], x[7]);
    *reinterpret_cast<uint4*>(p) = u;
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) p[e] = __float2bfloat16_rn(x[e]);
  }
}

constexpr int kRowWarps = 8;  // rows (one per warp) per block of the row kernels

// Row r of (B, H, T, T) holds the scaled scores of query i = r % T: softmax
// over keys 0..i in fp32, in place, zeros after; lse (when given) per row.
// W = 8 reads 16 bytes at a time and needs T % 8 == 0.
template <int W>
__global__ void __launch_bounds__(kRowWarps * 32)
    softmax_causal_forward_kernel(nv_bf16* probs, float* lse, int64_t rows, int64_t T) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < rows; r += warps) {
    nv_bf16* row = probs + r * T;
    const int64_t visible = r % T + 1;
    float m = -INFINITY, l = 0.f;
    for (int64_t j0 = int64_t(lane) * W; j0 < visible; j0 += 32 * W) {
      float x[W];
      load_bf16<W>(row + j0, x);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        if (j0 + e >= visible) break;
        if (x[e] > m) {
          l = l * __expf(m - x[e]) + 1.f;
          m = x[e];
        } else {
          l += __expf(x[e] - m);
        }
      }
    }
    warp_max_sum(m, l);
    const float inv = 1.f / l;
    for (int64_t j0 = int64_t(lane) * W; j0 < T; j0 += 32 * W) {
      float x[W] = {};
      if (j0 < visible) load_bf16<W>(row + j0, x);
#pragma unroll
      for (int e = 0; e < W; ++e) x[e] = j0 + e < visible ? __expf(x[e] - m) * inv : 0.f;
      store_bf16<W>(row + j0, x);
    }
    if (lse != nullptr && lane == 0) lse[r] = m + logf(l);
  }
}

// dS = P (dP - rowsum(P dP)) per row, in place over dP; zeros after the diagonal.
template <int W>
__global__ void __launch_bounds__(kRowWarps * 32)
    softmax_causal_backward_kernel(const nv_bf16* probs, nv_bf16* ds, int64_t rows, int64_t T) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32; r < rows; r += warps) {
    const nv_bf16* prow = probs + r * T;
    nv_bf16* drow = ds + r * T;
    const int64_t visible = r % T + 1;
    float delta = 0.f;
    for (int64_t j0 = int64_t(lane) * W; j0 < visible; j0 += 32 * W) {
      float p[W], d[W];
      load_bf16<W>(prow + j0, p);
      load_bf16<W>(drow + j0, d);
#pragma unroll
      for (int e = 0; e < W; ++e)
        if (j0 + e < visible) delta = fmaf(p[e], d[e], delta);
    }
    delta = warp_sum(delta);
    for (int64_t j0 = int64_t(lane) * W; j0 < T; j0 += 32 * W) {
      float p[W] = {}, d[W] = {};
      if (j0 < visible) {
        load_bf16<W>(prow + j0, p);
        load_bf16<W>(drow + j0, d);
      }
#pragma unroll
      for (int e = 0; e < W; ++e) d[e] = j0 + e < visible ? p[e] * (d[e] - delta) : 0.f;
      store_bf16<W>(drow + j0, d);
    }
  }
}

// The per-(batch, head) matrices the batched GEMMs read and write, as arrays
// of device pointers in the order (g, b, hk) with h = hk * group + g: the
// whole array batches over every head, and the slice of one g batches over
// (b, hk), which is how dK and dV sum the group's heads (one GEMM per g,
// beta = 1 after the first).
enum PtrArray { kPtrQ, kPtrK, kPtrV, kPtrProbs, kPtrRows, kPtrScratch, kPtrDq, kPtrDk, kPtrDv, kPtrArrays };

struct PtrFill {
  // Bases by PtrArray (null: unused). kPtrRows is out (forward) or dout
  // (backward), (B, T, H, D); kPtrScratch the dP / dS workspace, (B, H, T, T);
  // kPtrDk and kPtrDv fp32 sums, (B, T, H_kv, D); the rest as in the params.
  const char* base[kPtrArrays];
  void** arrays;  // kPtrArrays x B H
  int64_t B, T, H, H_kv, D;
};

__global__ void fill_pointers_kernel(const PtrFill f) {
  const int64_t n = f.B * f.H;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int64_t per_g = f.B * f.H_kv;
  const int64_t g = idx / per_g, b = (idx % per_g) / f.H_kv, hk = idx % f.H_kv;
  const int64_t h = hk * (f.H / f.H_kv) + g;
  const int64_t e2 = sizeof(nv_bf16), e4 = sizeof(float);
  const int64_t q_off = (b * f.T * f.H + h) * f.D, kv_off = (b * f.T * f.H_kv + hk) * f.D;
  const int64_t tt_off = (b * f.H + h) * f.T * f.T;
  const int64_t offsets[kPtrArrays] = {q_off * e2,  kv_off * e2, kv_off * e2, tt_off * e2, q_off * e2,
                                       tt_off * e2, q_off * e2,  kv_off * e4, kv_off * e4};
#pragma unroll
  for (int a = 0; a < kPtrArrays; ++a)
    if (f.base[a] != nullptr) f.arrays[a * n + idx] = const_cast<char*>(f.base[a]) + offsets[a];
}

// Row-major C = alpha op(A) op(B) + beta C per batch entry, through cuBLAS's
// column-major view (a row-major matrix is its transpose in column major).
// Each call passes the column-major operands directly; the comments at the
// call sites say which product that is.
void gemm_batched(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                  int64_t k, float alpha, void* const* A, int64_t lda, void* const* B, int64_t ldb,
                  float beta, void* const* C, cudaDataType_t c_type, int64_t ldc, int64_t batch) {
  CUBLAS_CHECK(cublasGemmBatchedEx(handle, ta, tb, int(m), int(n), int(k), &alpha,
                                        const_cast<const void* const*>(A), CUDA_R_16BF, int(lda),
                                        const_cast<const void* const*>(B), CUDA_R_16BF, int(ldb), &beta, C,
                                        c_type, int(ldc), int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ------------------------------------------------------------- protocol

int64_t piece(int64_t bytes) { return cpu::align_up(bytes); }

constexpr int64_t kGridYZ = 65535;  // gridDim.y and .z limit
constexpr int64_t kInt = 2147483647;

// Flash: D of 64 or 128, 16-byte aligned bf16 tensors (cp.async and vector
// stores), heads and batch within the grid's y and z limits.
template <typename P>
bool flash_handles(const P& p) {
  return (p.D == 64 || p.D == 128) && p.B <= kGridYZ && p.H <= kGridYZ && p.T <= kInt - 64 &&
         gpu::aligned16(p.q) && gpu::aligned16(p.k) && gpu::aligned16(p.v);
}

// Materialized: cuBLAS takes 32-bit sizes, leading dimensions and batch counts.
template <typename P>
bool materialized_handles(const P& p) {
  return p.T <= kInt && p.H * p.D <= kInt && p.B * p.H <= kInt;
}

// The shared rules for valid params (attention_check.h, invalid_argument),
// then what this backend implements (unsupported).
Status check(const AttentionForwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  if (p.kind == AttentionKind::flash)
    return flash_handles(p) && gpu::aligned16(p.out) && aligned(p.lse, 4) ? Status::ok : Status::unsupported;
  return materialized_handles(p) ? Status::ok : Status::unsupported;
}

Status check(const AttentionBackwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  if (p.kind == AttentionKind::flash)
    return flash_handles(p) && gpu::aligned16(p.out) && gpu::aligned16(p.dout) && gpu::aligned16(p.dq) &&
                   gpu::aligned16(p.dk) && gpu::aligned16(p.dv) && aligned(p.lse, 4) && p.H_kv <= kGridYZ
               ? Status::ok
               : Status::unsupported;
  return materialized_handles(p) ? Status::ok : Status::unsupported;
}

// Workspace pieces, each 64-byte aligned, in this order.
//   flash forward:         none
//   flash backward:        delta (B, H, T) fp32; dQ sums (B, T, H, D) fp32
//   materialized forward:  pointer arrays
//   materialized backward: dP, overwritten by dS, (B, H, T, T) bf16; dK and dV sums
//                          (B, T, H_kv, D) fp32 each; pointer arrays
int64_t pointer_bytes(int64_t B, int64_t H) { return piece(kPtrArrays * B * H * int64_t(sizeof(void*))); }

int64_t scratch(const AttentionForwardParams<bf16>& p) {
  if (p.kind == AttentionKind::flash) return 0;
  return pointer_bytes(p.B, p.H);
}

int64_t scratch(const AttentionBackwardParams<bf16>& p) {
  if (p.kind == AttentionKind::flash) return piece(p.B * p.H * p.T * 4) + piece(p.B * p.T * p.H * p.D * 4);
  return piece(p.B * p.H * p.T * p.T * 2) + 2 * piece(p.B * p.T * p.H_kv * p.D * 4) + pointer_bytes(p.B, p.H);
}

// Blocks for a grid-stride kernel over `threads` threads' work; the row
// kernels give each row a warp.
unsigned blocks(int64_t threads, int block) { return unsigned(gpu::grid_blocks(threads, block)); }
unsigned row_blocks(int64_t rows) { return blocks(rows * 32, kRowWarps * 32); }

template <int kD>
void flash_forward(const AttentionForwardParams<bf16>& p, cudaStream_t stream) {
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
void flash_backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
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

  scale_to_bf16_kernel<<<blocks(n_dq, 256), 256, 0, stream>>>(dq_acc, dev(p.dq), n_dq, scale);
  WEFT_LAUNCH_CHECK(stream, "scale_to_bf16_kernel");
}

void fill_pointers(const PtrFill& f, cudaStream_t stream) {
  const int64_t n = f.B * f.H;
  fill_pointers_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(f);
  WEFT_LAUNCH_CHECK(stream, "fill_pointers_kernel");
}

// The row kernels read 16 bytes at a time when every row starts 16-byte aligned.
bool rows_vectorizable(int64_t T, const void* a, const void* b) {
  return T % 8 == 0 && aligned(a, 16) && aligned(b, 16);
}

void materialized_forward(const AttentionForwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  const int64_t n = p.B * p.H;
  void** arrays = static_cast<void**>(ws.data);
  PtrFill f{};
  f.base[kPtrQ] = reinterpret_cast<const char*>(p.q);
  f.base[kPtrK] = reinterpret_cast<const char*>(p.k);
  f.base[kPtrV] = reinterpret_cast<const char*>(p.v);
  f.base[kPtrProbs] = reinterpret_cast<const char*>(p.probs);
  f.base[kPtrRows] = reinterpret_cast<const char*>(p.out);
  f.arrays = arrays;
  f.B = p.B, f.T = p.T, f.H = p.H, f.H_kv = p.H_kv, f.D = p.D;
  fill_pointers(f, stream);
  auto at = [&](PtrArray a) { return arrays + a * n; };
  cublasHandle_t handle = cublas_handle(stream);
  const float scale = 1.f / std::sqrt(float(p.D));
  const int64_t ld_q = p.H * p.D, ld_kv = p.H_kv * p.D;

  // Column-major S^T (keys x queries, ld T) = scale K Q^T: the probs rows.
  gemm_batched(handle, CUBLAS_OP_T, CUBLAS_OP_N, p.T, p.T, p.D, scale, at(kPtrK), ld_kv, at(kPtrQ), ld_q, 0.f,
               at(kPtrProbs), CUDA_R_16BF, p.T, n);
  const int64_t rows = n * p.T;
  if (rows_vectorizable(p.T, p.probs, p.probs))
    softmax_causal_forward_kernel<8><<<row_blocks(rows), kRowWarps * 32, 0, stream>>>(
        dev(p.probs), p.lse, rows, p.T);
  else
    softmax_causal_forward_kernel<1><<<row_blocks(rows), kRowWarps * 32, 0, stream>>>(
        dev(p.probs), p.lse, rows, p.T);
  WEFT_LAUNCH_CHECK(stream, "softmax_causal_forward_kernel");
  // Column-major O^T (D x queries, ld H D) = V^T P^T.
  gemm_batched(handle, CUBLAS_OP_N, CUBLAS_OP_N, p.D, p.T, p.T, 1.f, at(kPtrV), ld_kv, at(kPtrProbs), p.T, 0.f,
               at(kPtrRows), CUDA_R_16BF, ld_q, n);
}

void materialized_backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  const int64_t n = p.B * p.H, n_kv = p.B * p.H_kv, group = p.H / p.H_kv;
  char* base = static_cast<char*>(ws.data);
  nv_bf16* ds = reinterpret_cast<nv_bf16*>(base);
  base += piece(n * p.T * p.T * 2);
  float* dk_acc = reinterpret_cast<float*>(base);
  base += piece(p.B * p.T * p.H_kv * p.D * 4);
  float* dv_acc = reinterpret_cast<float*>(base);
  base += piece(p.B * p.T * p.H_kv * p.D * 4);
  void** arrays = reinterpret_cast<void**>(base);

  PtrFill f{};
  f.base[kPtrQ] = reinterpret_cast<const char*>(p.q);
  f.base[kPtrK] = reinterpret_cast<const char*>(p.k);
  f.base[kPtrV] = reinterpret_cast<const char*>(p.v);
  f.base[kPtrProbs] = reinterpret_cast<const char*>(p.probs);
  f.base[kPtrRows] = reinterpret_cast<const char*>(p.dout);
  f.base[kPtrScratch] = reinterpret_cast<const char*>(ds);
  f.base[kPtrDq] = reinterpret_cast<const char*>(p.dq);
  f.base[kPtrDk] = reinterpret_cast<const char*>(dk_acc);
  f.base[kPtrDv] = reinterpret_cast<const char*>(dv_acc);
  f.arrays = arrays;
  f.B = p.B, f.T = p.T, f.H = p.H, f.H_kv = p.H_kv, f.D = p.D;
  fill_pointers(f, stream);
  auto at = [&](PtrArray a, int64_t g = 0) { return arrays + a * n + g * n_kv; };
  cublasHandle_t handle = cublas_handle(stream);
  const float scale = 1.f / std::sqrt(float(p.D));
  const int64_t ld_q = p.H * p.D, ld_kv = p.H_kv * p.D;

  // Column-major dP^T (keys x queries, ld T) = V dO^T: dP rows.
  gemm_batched(handle, CUBLAS_OP_T, CUBLAS_OP_N, p.T, p.T, p.D, 1.f, at(kPtrV), ld_kv, at(kPtrRows), ld_q, 0.f,
               at(kPtrScratch), CUDA_R_16BF, p.T, n);
  const int64_t rows = n * p.T;
  if (rows_vectorizable(p.T, p.probs, ds))
    softmax_causal_backward_kernel<8><<<row_blocks(rows), kRowWarps * 32, 0, stream>>>(
        dev(p.probs), ds, rows, p.T);
  else
    softmax_causal_backward_kernel<1><<<row_blocks(rows), kRowWarps * 32, 0, stream>>>(
        dev(p.probs), ds, rows, p.T);
  WEFT_LAUNCH_CHECK(stream, "softmax_causal_backward_kernel");
  // Column-major dQ^T (D x queries, ld H D) = scale K^T dS^T.
  gemm_batched(handle, CUBLAS_OP_N, CUBLAS_OP_N, p.D, p.T, p.T, scale, at(kPtrK), ld_kv, at(kPtrScratch), p.T,
               0.f, at(kPtrDq), CUDA_R_16BF, ld_q, n);
  // Column-major dK^T (D x keys, ld H_kv D) = scale Q^T dS and dV^T = dO^T P,
  // summed over the group's heads in fp32.
  for (int64_t g = 0; g < group; ++g) {
    const float beta = g == 0 ? 0.f : 1.f;
    gemm_batched(handle, CUBLAS_OP_N, CUBLAS_OP_T, p.D, p.T, p.T, scale, at(kPtrQ, g), ld_q, at(kPtrScratch, g),
                 p.T, beta, at(kPtrDk, g), CUDA_R_32F, ld_kv, n_kv);
    gemm_batched(handle, CUBLAS_OP_N, CUBLAS_OP_T, p.D, p.T, p.T, 1.f, at(kPtrRows, g), ld_q, at(kPtrProbs, g),
                 p.T, beta, at(kPtrDv, g), CUDA_R_32F, ld_kv, n_kv);
  }
  const int64_t n_grad = p.B * p.T * p.H_kv * p.D;
  scale_to_bf16_kernel<<<blocks(n_grad, 256), 256, 0, stream>>>(dk_acc, dev(p.dk), n_grad, 1.f);
  WEFT_LAUNCH_CHECK(stream, "scale_to_bf16_kernel");
  scale_to_bf16_kernel<<<blocks(n_grad, 256), 256, 0, stream>>>(dv_acc, dev(p.dv), n_grad, 1.f);
  WEFT_LAUNCH_CHECK(stream, "scale_to_bf16_kernel");
}

Status run(const AttentionForwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.B == 0 || p.T == 0) return Status::ok;
  if (!device_has_bf16_mma()) return Status::unsupported;
  if (p.kind == AttentionKind::materialized)
    materialized_forward(p, ws, stream);
  else if (p.D == 64)
    flash_forward<64>(p, stream);
  else
    flash_forward<128>(p, stream);
  return Status::ok;
}

Status run(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.B == 0 || p.T == 0) return Status::ok;
  if (!device_has_bf16_mma()) return Status::unsupported;
  if (p.kind == AttentionKind::materialized)
    materialized_backward(p, ws, stream);
  else if (p.D == 64)
    flash_backward<64>(p, ws, stream);
  else
    flash_backward<128>(p, ws, stream);
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(AttentionForwardParams)
WEFT_CUDA_INSTANTIATE(AttentionBackwardParams)

}  // namespace weft::kernels
