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
// folded into one FMA). Causal by absolute position: query row i (at
// q_offset + i) sees key j (at k_offset + j) when j <= i + q_offset -
// k_offset, so a query block visits key blocks 0.. the last one its last row
// sees, and only those holding keys its first row does not see, or keys past
// Tk, need a per-element mask; rows past T and keys past Tk are zero-filled
// and masked. For the whole sequence (offsets equal, Tk = T) that is blocks
// 0..its own with the diagonal one masked. A block whose rows see no key
// visits none and writes out 0, lse -inf, as does any row that sees no key.
// Blocks start with the longest query blocks so that the short ones fill the
// tail. Saves lse = scale m + ln(l) per row for the backward.
//
// The shared primitives and the tile and resource budget of both kernels are
// in attention_flash.cuh.
#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_flash.cuh"

namespace weft::kernels::attention_cuda {

namespace {

using namespace flash;

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
  const nv_bf16* q;  // (B, T, H, D), q_rows rows per sequence
  const nv_bf16* k;  // (B, Tk, H_kv, D), kv_rows rows per sequence
  const nv_bf16* v;  // (B, Tk, H_kv, D), kv_rows rows per sequence
  nv_bf16* out;      // (B, T, H, D), q_rows rows per sequence
  float* lse;        // (B, H, T), lse_rows apart per (sequence, head)
  int64_t T, H, H_kv;
  int64_t Tk;
  int64_t shift;  // q_offset - k_offset: row i sees keys j <= i + shift
  int64_t q_rows, kv_rows, lse_rows;
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
  const nv_bf16* q = a.q + (b * a.q_rows * a.H + h) * kD;
  const nv_bf16* k = a.k + (b * a.kv_rows * a.H_kv + hk) * kD;
  const nv_bf16* v = a.v + (b * a.kv_rows * a.H_kv + hk) * kD;
  nv_bf16* out = a.out + (b * a.q_rows * a.H + h) * kD;
  float* lse = a.lse + (b * a.H + h) * a.lse_rows;
  const int64_t q0 = int64_t(qb) * kBlockM;

  // Key blocks the block's rows see: 0 .. the one holding the last row's last
  // key. Those from `masked` on hold keys its first row does not see, or keys
  // past Tk, and take a per-element mask.
  const int64_t last_key = min(q0 + kBlockM, a.T) - 1 + a.shift;  // may be negative
  const int n_kv = last_key < 0 ? 0 : int(min(last_key / kBlockN + 1, (a.Tk + kBlockN - 1) / kBlockN));
  const int64_t first_key = q0 + a.shift;  // the first row sees keys <= first_key
  const int masked = first_key < kBlockN - 1 ? 0 : int(min((first_key + 1) / kBlockN, a.Tk / kBlockN));

  if (n_kv == 0) {  // no row of the block sees a key: out 0, lse -inf
    for (int i = tid; i < kBlockM * kD / 8; i += Tile::kThreads) {
      const int64_t row = q0 + i / (kD / 8);
      if (row < a.T) *reinterpret_cast<uint4*>(out + row * ldq + (i % (kD / 8)) * 8) = make_uint4(0, 0, 0, 0);
    }
    if (tid < kBlockM && q0 + tid < a.T) lse[q0 + tid] = -INFINITY;
    return;
  }

  load_tile<kBlockM, kD, kStride, Tile::kThreads>(sQ, q, ldq, q0, a.T, tid);
  cp_async_commit();
  load_tile<kBlockN, kD, kStride, Tile::kThreads>(sK, k, ldkv, 0, a.Tk, tid);
  cp_async_commit();

  uint32_t qf[kD / 16][4];
  float o[kDt][4];
#pragma unroll
  for (int i = 0; i < kDt; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // Per thread two rows, g and g + 8 of the warp's 16: running max (raw
  // score units) and this thread's part of the running sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const uint32_t sQ_u = smem_u32(sQ), sK_u = smem_u32(sK), sV_u = smem_u32(sV);

  for (int j = 0; j < n_kv; ++j) {
    // V(j) streams in while S(j) is computed; K(j + 1) while P V(j) is.
    load_tile<kBlockN, kD, kStride, Tile::kThreads>(sV, v, ldkv, int64_t(j) * kBlockN, a.Tk, tid);
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
      load_tile<kBlockN, kD, kStride, Tile::kThreads>(sK, k, ldkv, int64_t(j + 1) * kBlockN, a.Tk, tid);
    cp_async_commit();  // possibly empty, so that the group count stays regular

    if (j >= masked) {  // keys after the row's position, or past Tk, are masked
      const int64_t see0 = q0 + warp * 16 + g + a.shift, key0 = int64_t(j) * kBlockN + 2 * t;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int64_t key = key0 + nt * 8 + (c & 1);
          if (key > see0 + (c >= 2 ? 8 : 0) || key >= a.Tk) s[nt][c] = -INFINITY;
        }
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that sees no key (so far, or at all in a block of the
      // sequence) keeps m -inf, l 0 and O 0 rather than NaN.
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
  // A row that saw no key has l 0: out 0 and lse -inf.
  const float inv[2] = {l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f};
  nv_bf16* sO = sQ + warp * 16 * kStride;
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    *reinterpret_cast<uint32_t*>(sO + g * kStride + dt * 8 + 2 * t) =
        pack_bf16(o[dt][0] * inv[0], o[dt][1] * inv[0]);
    *reinterpret_cast<uint32_t*>(sO + (g + 8) * kStride + dt * 8 + 2 * t) =
        pack_bf16(o[dt][2] * inv[1], o[dt][3] * inv[1]);
  }
  __syncwarp();
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
      if (row < a.T) lse[row] = l[r] > 0.f ? m[r] * a.scale + logf(l[r]) : -INFINITY;
    }
  }
}

template <int kD>
void flash_forward_d(const AttentionForwardParams<bf16>& p, cudaStream_t stream) {
  using Tile = FlashForwardTile<kD>;
  const int64_t Tk = p.Tk ? p.Tk : p.T;
  const FlashForwardArgs a{dev(p.q),
                           dev(p.k),
                           dev(p.v),
                           dev(p.out),
                           p.lse,
                           p.T,
                           p.H,
                           p.H_kv,
                           Tk,
                           p.q_offset - p.k_offset,
                           p.q_batch_rows ? p.q_batch_rows : p.T,
                           p.kv_batch_rows ? p.kv_batch_rows : Tk,
                           p.lse_batch_rows ? p.lse_batch_rows : p.T,
                           1.f / std::sqrt(float(p.D)),
                           kLog2e / std::sqrt(float(p.D))};
  auto kernel = flash_forward_kernel<kD>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const dim3 grid(unsigned((p.T + Tile::kBlockM - 1) / Tile::kBlockM), unsigned(p.H), unsigned(p.B));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  WEFT_LAUNCH_CHECK(stream, "flash_forward_kernel");
}

}  // namespace

void flash_forward(const AttentionForwardParams<bf16>& p, cudaStream_t stream) {
  if (p.D == 32) flash_forward_d<32>(p, stream);
  else if (p.D == 64) flash_forward_d<64>(p, stream);
  else flash_forward_d<128>(p, stream);
}

}  // namespace weft::kernels::attention_cuda
