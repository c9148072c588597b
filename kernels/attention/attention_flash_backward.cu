// Flash attention backward on CUDA, bf16, weft's own kernel (the forward is
// in attention_flash.cu; the shared primitives and the tile and resource
// budget in attention_flash.cuh).
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
// A block of the sequence (context parallelism): a key block walks the query
// blocks from the first whose last row sees its first key (row i at q_offset
// + i sees key j at k_offset + j when j <= i + q_offset - k_offset), masks per
// element where a step holds a query that does not see a key or keys past Tk,
// and reads q, out, dout, lse and k, v at their batch row strides. The fp32
// dQ sums stay dense (B, T, H, D) in the workspace; the last kernel writes
// them into dq at its strides, adding to what dq holds when dq_write is
// accumulate, and dK, dV add to dk, dv when dkv_write is. A key block no query
// sees writes zeros (or adds nothing).
#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_flash.cuh"

namespace weft::kernels::attention_cuda {

namespace {

using namespace flash;

// ------------------------------------------------------------- flash backward

// delta = rowsum(dO * O) in fp32, (B, H, T); 8 lanes per (b, t, h) row, 4
// rows per warp. The loop runs alike on all lanes of a warp (the shuffles
// need every lane), and lanes past the last row add zeros.
// out and dout have q_rows rows per sequence (T when dense).
template <int kD>
__global__ void flash_delta_kernel(const nv_bf16* __restrict__ out, const nv_bf16* __restrict__ dout,
                                   float* __restrict__ delta, int64_t rows, int64_t T, int64_t H,
                                   int64_t q_rows) {
  const int part = threadIdx.x % 8;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x / 8;
  const int64_t first = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 8;
  for (int64_t base = first - (threadIdx.x % 32) / 8; base < rows; base += stride) {
    const int64_t row = base + (threadIdx.x % 32) / 8;
    float acc = 0.f;
    const int64_t b = row / (T * H), t = (row / H) % T, h = row % H;
    const int64_t at = ((b * q_rows + t) * H + h) * kD;
    if (row < rows) {
#pragma unroll
      for (int c = part * 8; c < kD; c += 64) {
        const uint4 ou = *reinterpret_cast<const uint4*>(out + at + c);
        const uint4 du = *reinterpret_cast<const uint4*>(dout + at + c);
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
    if (part == 0 && row < rows) delta[(b * H + h) * T + t] = acc;
  }
}

template <int kD>
struct FlashBackwardTile {
  static constexpr int kBlockN = 64;  // keys per block
  static constexpr int kBlockM = 64;  // queries per step
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // Two blocks per SM at D 32 and 64 (128 registers, no spills; 152 uncapped allowed
  // one); at D 128 one block already takes 121 KB of shared memory.
  static constexpr int kMinBlocks = kD <= 64 ? 2 : 1;
  static constexpr int kStride = kD + 8;
  static constexpr int kPStride = kBlockM + 8;  // rows of the P^T and dS^T tiles
  static constexpr int kTileBytes = kBlockM * kStride * int(sizeof(nv_bf16));
  // K, V, Q[2], dO[2], P^T, dS^T, lse[2], delta[2]
  static constexpr int kSmemBytes = 6 * kTileBytes + 2 * kBlockN * kPStride * int(sizeof(nv_bf16)) +
                                    4 * kBlockM * int(sizeof(float));
  static_assert(kBlockM == kBlockN && kWarps == 8 && kBlockN == 4 * 16 && kBlockM == 2 * 32);
};

struct FlashBackwardArgs {
  const nv_bf16* q;     // (B, T, H, D), q_rows rows per sequence
  const nv_bf16* k;     // (B, Tk, H_kv, D), kv_rows rows per sequence
  const nv_bf16* v;     // (B, Tk, H_kv, D), kv_rows rows per sequence
  const nv_bf16* dout;  // (B, T, H, D), q_rows rows per sequence
  const float* lse;     // (B, H, T), lse_rows apart per (sequence, head)
  const float* delta;   // (B, H, T), dense
  float* dq_acc;        // (B, T, H, D), dense, zeroed; unscaled sums of dS K
  nv_bf16* dk;          // (B, Tk, H_kv, D), kv_rows rows per sequence
  nv_bf16* dv;          // (B, Tk, H_kv, D), kv_rows rows per sequence
  int64_t T, H, H_kv;
  int64_t Tk;
  int64_t shift;  // q_offset - k_offset: query i sees keys j <= i + shift
  int64_t q_rows, kv_rows, lse_rows;
  bool dkv_accumulate;  // add into dk and dv rather than overwrite them
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
  // The first query block whose last row sees key k0: query k0 - shift.
  const int64_t first_query = k0 - a.shift;
  const int qb_first = first_query <= 0 ? 0 : int(min(first_query / kBlockM, int64_t(n_qb)));
  const int per_head = n_qb - qb_first;  // query blocks that see some key of this block
  const int n_steps = int(group) * per_head;

  const nv_bf16* kbase = a.k + (b * a.kv_rows * a.H_kv + hk) * kD;
  const nv_bf16* vbase = a.v + (b * a.kv_rows * a.H_kv + hk) * kD;
  auto load_step = [&](int s, int buf) {
    const int64_t h = hk * group + s / per_head;
    const int64_t q0 = int64_t(qb_first + s % per_head) * kBlockM;
    load_tile<kBlockM, kD, kStride, kThreads>(sQ + buf * kBlockM * kStride,
                                              a.q + (b * a.q_rows * a.H + h) * kD, ldq, q0, a.T, tid);
    load_tile<kBlockM, kD, kStride, kThreads>(sdO + buf * kBlockM * kStride,
                                              a.dout + (b * a.q_rows * a.H + h) * kD, ldq, q0, a.T, tid);
    if (tid < 2 * kBlockM) {
      const int i = tid % kBlockM;
      const int64_t row = q0 + i;
      const bool valid = row < a.T;
      const float* src = tid < kBlockM ? a.lse + (b * a.H + h) * a.lse_rows + (valid ? row : 0)
                                       : a.delta + (b * a.H + h) * a.T + (valid ? row : 0);
      float* dst = (tid < kBlockM ? sLse : sDelta) + buf * kBlockM + i;
      cp_async_4(smem_u32(dst), src, valid);
    }
  };

  load_tile<kBlockN, kD, kStride, kThreads>(sK, kbase, ldkv, k0, a.Tk, tid);
  load_tile<kBlockN, kD, kStride, kThreads>(sV, vbase, ldkv, k0, a.Tk, tid);
  if (n_steps > 0) load_step(0, 0);
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
    const int qb = qb_first + s % per_head;
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
    // query does not see the key (the diagonal step of the whole sequence),
    // the query is past T or the key past Tk (the last blocks).
    const bool need_mask = q0 + a.shift < k0 + kBlockN - 1 || q0 + kBlockM > a.T || k0 + kBlockN > a.Tk;
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
          if (need_mask && (key > query + a.shift || query >= a.T || key >= a.Tk)) p = 0.f;
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
  if (n_steps == 0) cp_async_wait<0>();  // K and V were loaded for nothing; let them land

  // dK carries the softmax scale (dK = scale dS^T Q); rows past Tk are not written.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = k0 + kw * 16 + g + 8 * r;
    if (key >= a.Tk) continue;
    const int64_t at = (b * a.kv_rows + key) * a.H_kv * kD + hk * kD + dh * kHalf + 2 * t;
#pragma unroll
    for (int nt = 0; nt < kHt; ++nt) {
      float k_lo = dk[nt][2 * r] * a.scale, k_hi = dk[nt][2 * r + 1] * a.scale;
      float v_lo = dv[nt][2 * r], v_hi = dv[nt][2 * r + 1];
      uint32_t* dk_at = reinterpret_cast<uint32_t*>(a.dk + at + nt * 8);
      uint32_t* dv_at = reinterpret_cast<uint32_t*>(a.dv + at + nt * 8);
      if (a.dkv_accumulate) {
        const float2 k_old = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dk_at));
        const float2 v_old = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dv_at));
        k_lo += k_old.x, k_hi += k_old.y, v_lo += v_old.x, v_hi += v_old.y;
      }
      *dk_at = pack_bf16(k_lo, k_hi);
      *dv_at = pack_bf16(v_lo, v_hi);
    }
  }
}

// dq = bf16(scale dq_acc [+ dq]) for a block: dq_acc dense (B, T, H, D), dq
// with q_rows rows per sequence; 8 elements (16 bytes) a thread.
__global__ void flash_dq_block_kernel(const float* __restrict__ dq_acc, nv_bf16* __restrict__ dq, int64_t n8,
                                      int64_t T, int64_t HD, int64_t q_rows, float scale, bool accumulate) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    const int64_t e = i * 8, row = e / HD, col = e % HD;
    const int64_t b = row / T, t = row % T;
    uint4* dst = reinterpret_cast<uint4*>(dq + (b * q_rows + t) * HD + col);
    const float4 a0 = *reinterpret_cast<const float4*>(dq_acc + e);
    const float4 a1 = *reinterpret_cast<const float4*>(dq_acc + e + 4);
    float x[8] = {a0.x * scale, a0.y * scale, a0.z * scale, a0.w * scale,
                  a1.x * scale, a1.y * scale, a1.z * scale, a1.w * scale};
    if (accumulate) {
      const uint4 old = *dst;
      const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&old);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(o2[k]);
        x[2 * k] += f.x;
        x[2 * k + 1] += f.y;
      }
    }
    *dst = make_uint4(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]), pack_bf16(x[4], x[5]), pack_bf16(x[6], x[7]));
  }
}

template <int kD>
void flash_backward_d(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  using Tile = FlashBackwardTile<kD>;
  char* base = static_cast<char*>(ws.data);
  float* delta = reinterpret_cast<float*>(base);
  float* dq_acc = reinterpret_cast<float*>(base + piece(p.B * p.H * p.T * 4));
  const int64_t rows = p.B * p.T * p.H, n_dq = rows * p.D;
  const float scale = 1.f / std::sqrt(float(p.D));

  const int64_t Tk = p.Tk ? p.Tk : p.T;
  const int64_t q_rows = p.q_batch_rows ? p.q_batch_rows : p.T;
  flash_delta_kernel<kD><<<blocks(rows * 8, 256), 256, 0, stream>>>(dev(p.out), dev(p.dout), delta, rows,
                                                                      p.T, p.H, q_rows);
  WEFT_LAUNCH_CHECK(stream, "flash_delta_kernel");
  CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, size_t(n_dq) * sizeof(float), stream));

  const FlashBackwardArgs a{dev(p.q),
                            dev(p.k),
                            dev(p.v),
                            dev(p.dout),
                            p.lse,
                            delta,
                            dq_acc,
                            dev(p.dk),
                            dev(p.dv),
                            p.T,
                            p.H,
                            p.H_kv,
                            Tk,
                            p.q_offset - p.k_offset,
                            q_rows,
                            p.kv_batch_rows ? p.kv_batch_rows : Tk,
                            p.lse_batch_rows ? p.lse_batch_rows : p.T,
                            p.dkv_write == Write::accumulate,
                            scale,
                            scale * kLog2e};
  auto kernel = flash_backward_kernel<kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const dim3 grid(unsigned((Tk + Tile::kBlockN - 1) / Tile::kBlockN), unsigned(p.H_kv), unsigned(p.B));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  WEFT_LAUNCH_CHECK(stream, "flash_backward_kernel");

  if (q_rows == p.T && p.dq_write == Write::overwrite) {
    scale_to_bf16(dq_acc, dev(p.dq), n_dq, scale, stream);
  } else {
    flash_dq_block_kernel<<<blocks(n_dq / 8, 256), 256, 0, stream>>>(
        dq_acc, dev(p.dq), n_dq / 8, p.T, p.H * p.D, q_rows, scale, p.dq_write == Write::accumulate);
    WEFT_LAUNCH_CHECK(stream, "flash_dq_block_kernel");
  }
}

}  // namespace

int64_t flash_backward_workspace(const AttentionBackwardParams<bf16>& p) {
  return piece(p.B * p.H * p.T * 4) + piece(p.B * p.T * p.H * p.D * 4);
}

void flash_backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.D == 32) flash_backward_d<32>(p, ws, stream);
  else if (p.D == 64) flash_backward_d<64>(p, ws, stream);
  else flash_backward_d<128>(p, ws, stream);
}

}  // namespace weft::kernels::attention_cuda
