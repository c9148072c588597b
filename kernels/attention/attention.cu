// attention on CUDA, bf16: weft's own flash attention (forward and backward),
// the materialized variant through cuBLAS and cuDNN's fused SDPA, behind the
// protocol of kernels/attention/attention.h. All compute what
// attention_cpu.cpp computes: causal softmax(scale Q K^T) V, scale =
// 1 / sqrt(D), query head h reading kv head h / (H / H_kv). Flash also takes
// blocks of the sequence (context parallelism: Tk, offsets, batch row
// strides, accumulated gradients), cudnn the blocks causal to their end and
// the fully visible ones (attention_cudnn.h), materialized none
// (Status::unsupported). No kind computes chunked attention yet (attention.h:
// a chunk that masks some key of the call is Status::unsupported here).
//
// The flash kernels are in attention_flash.cu (their algorithm and tiles are
// described there); the cudnn kind's graphs in attention_cudnn.cpp, compiled
// only when CMake found the cuDNN frontend (WEFT_HAVE_CUDNN_FRONTEND);
// without it the kind is unsupported.
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
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_check.h"
#include "kernels/attention/attention_cuda.cuh"
#include "kernels/cuda_common.cuh"
#include "kernels/gemm/gemm_lt.cuh"
#ifdef WEFT_HAVE_CUDNN_FRONTEND
#include "kernels/attention/attention_cudnn.h"
#endif

namespace weft::kernels {

namespace attention_cuda {

namespace {

using gpu::dev;
using gpu::nv_bf16;

using gpu::cublas_handle;  // kernels/gemm/gemm_lt.cuh

// The flash kernels use bf16 tensor-core MMA, sm_80 and newer.
bool device_has_bf16_mma() {
  int device = 0, major = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

bool aligned(const void* p, uintptr_t to) { return reinterpret_cast<uintptr_t>(p) % to == 0; }


// out = bf16(scale * in), elementwise.
__global__ void scale_to_bf16_kernel(const float* __restrict__ in, nv_bf16* __restrict__ out, int64_t n,
                                     float scale) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __float2bfloat16_rn(in[i] * scale);
}

// dst[b * dst_stride + j] += src[b * n + j] for B rows of n, in fp32 and
// rounded once (a cudnn backward's gradients added into an accumulating
// block's).
__global__ void add_rows_kernel(nv_bf16* __restrict__ dst, const nv_bf16* __restrict__ src, int64_t B, int64_t n,
                                int64_t dst_stride) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, total = B * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    nv_bf16& d = dst[(i / n) * dst_stride + i % n];
    d = __float2bfloat16_rn(__bfloat162float(d) + __bfloat162float(src[i]));
  }
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


constexpr int64_t kGridYZ = 65535;  // gridDim.y and .z limit
constexpr int64_t kInt = 2147483647;

// Flash: D of 32, 64 or 128, 16-byte aligned bf16 tensors (cp.async and vector
// stores), heads and batch within the grid's y and z limits.
template <typename P>
bool flash_handles(const P& p) {
  return (p.D == 32 || p.D == 64 || p.D == 128) && p.B <= kGridYZ && p.H <= kGridYZ && p.T <= kInt - 64 && p.Tk <= kInt - 64 &&
         gpu::aligned16(p.q) && gpu::aligned16(p.k) && gpu::aligned16(p.v);
}

// Materialized: cuBLAS takes 32-bit sizes, leading dimensions and batch counts.
template <typename P>
bool materialized_handles(const P& p) {
  return p.T <= kInt && p.H * p.D <= kInt && p.B * p.H <= kInt;
}

// cudnn: what attention_cudnn.h says its graphs take, in builds that have it.
template <typename P>
bool cudnn_handles(const P& p) {
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  return attention_cudnn::shape_handled(p.T, p.D) && gpu::aligned16(p.q) && gpu::aligned16(p.k) &&
         gpu::aligned16(p.v) && gpu::aligned16(p.lse);
#else
  (void)p;
  return false;
#endif
}

// Blocks of the sequence (context parallelism): flash takes every one,
// cudnn the blocks causal to their end and the fully visible ones
// (attention_cudnn.h: the ring's and the all-gather's), materialized none.
template <typename P>
bool block_taken(const P& p) {
  if (p.kind == AttentionKind::flash) return true;
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  if (p.kind == AttentionKind::cudnn) return attention_cudnn::block_mask(p.T, p.Tk, p.q_offset, p.k_offset, nullptr);
#endif
  return false;
}

// The shared rules for valid params (attention_check.h, invalid_argument),
// then what this backend implements (unsupported).
Status check(const AttentionForwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  if (attention_is_block(p) && !block_taken(p)) return Status::unsupported;
  // Chunked attention (attention.h) is computed on the CPU only so far: no
  // CUDA kind masks the keys before a query's chunk.
  if (attention_chunk_masks(p)) return Status::unsupported;
  if (p.kind == AttentionKind::cudnn)
    return cudnn_handles(p) && gpu::aligned16(p.out) ? Status::ok : Status::unsupported;
  if (p.kind == AttentionKind::flash)
    return flash_handles(p) && gpu::aligned16(p.out) && aligned(p.lse, 4) ? Status::ok : Status::unsupported;
  return materialized_handles(p) ? Status::ok : Status::unsupported;
}

Status check(const AttentionBackwardParams<bf16>& p) {
  if (Status s = params_check(p); s != Status::ok) return s;
  if (attention_is_block(p) && !block_taken(p)) return Status::unsupported;
  if (attention_chunk_masks(p)) return Status::unsupported;
  if (p.kind == AttentionKind::cudnn)
    return cudnn_handles(p) && gpu::aligned16(p.out) && gpu::aligned16(p.dout) && gpu::aligned16(p.dq) &&
                   gpu::aligned16(p.dk) && gpu::aligned16(p.dv)
               ? Status::ok
               : Status::unsupported;
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
//   cudnn:                 the bound of attention_cudnn.h (cuDNN lays it out);
//                          accumulating, then the bf16 dQ, dK and dV it writes
int64_t pointer_bytes(int64_t B, int64_t H) { return piece(kPtrArrays * B * H * int64_t(sizeof(void*))); }

int64_t scratch(const AttentionForwardParams<bf16>& p) {
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  if (p.kind == AttentionKind::cudnn) return attention_cudnn::forward_workspace_bound(p.B, p.T, p.H, p.H_kv, p.D);
#endif
  if (p.kind == AttentionKind::flash) return 0;
  return pointer_bytes(p.B, p.H);
}

int64_t scratch(const AttentionBackwardParams<bf16>& p) {
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  if (p.kind == AttentionKind::cudnn)
    return attention_cudnn::backward_workspace_bound(p.B, p.T, p.H, p.H_kv, p.D, p.Tk,
                                                     p.dq_write == Write::accumulate,
                                                     p.dkv_write == Write::accumulate,
                                                     p.lse_batch_rows != 0 && p.lse_batch_rows != p.T);
#endif
  if (p.kind == AttentionKind::flash) return flash_backward_workspace(p);
  return piece(p.B * p.H * p.T * p.T * 2) + 2 * piece(p.B * p.T * p.H_kv * p.D * 4) + pointer_bytes(p.B, p.H);
}

// Blocks for a grid-stride kernel over `threads` threads' work; the row
// kernels give each row a warp.
unsigned row_blocks(int64_t rows) { return blocks(rows * 32, kRowWarps * 32); }

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
  scale_to_bf16(dk_acc, dev(p.dk), n_grad, 1.f, stream);
  scale_to_bf16(dv_acc, dev(p.dv), n_grad, 1.f, stream);
}

Status run(const AttentionForwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.B == 0 || p.T == 0) return Status::ok;
  if (!device_has_bf16_mma()) return Status::unsupported;
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  if (p.kind == AttentionKind::cudnn) return attention_cudnn::forward(p, ws, stream);
#endif
  if (p.kind == AttentionKind::materialized)
    materialized_forward(p, ws, stream);
  else
    flash_forward(p, stream);
  return Status::ok;
}

#ifdef WEFT_HAVE_CUDNN_FRONTEND
// cuDNN writes its gradients; where the block accumulates, it writes them
// dense into the workspace after its own part, and they are added in. A
// block's lse rows inside a larger tensor are packed there first (cuDNN's
// backward takes its stats packed).
Status cudnn_backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  const bool dq_add = p.dq_write == Write::accumulate, dkv_add = p.dkv_write == Write::accumulate;
  const bool lse_pack = p.lse_batch_rows != 0 && p.lse_batch_rows != p.T;
  if (!dq_add && !dkv_add && !lse_pack) return attention_cudnn::backward(p, ws, stream);
  const int64_t keys = p.Tk > 0 ? p.Tk : p.T, nq = p.T * p.H * p.D, nkv = keys * p.H_kv * p.D;
  const int64_t own = attention_cudnn::backward_workspace_bound(p.B, p.T, p.H, p.H_kv, p.D, keys);
  char* at = static_cast<char*>(ws.data) + own;
  AttentionBackwardParams<bf16> to = p;
  if (dq_add) {
    to.dq = reinterpret_cast<bf16*>(at);
    at += piece(p.B * nq * 2);
  }
  if (dkv_add) {
    to.dk = reinterpret_cast<bf16*>(at);
    at += piece(p.B * nkv * 2);
    to.dv = reinterpret_cast<bf16*>(at);
    at += piece(p.B * nkv * 2);
  }
  if (lse_pack) {
    float* packed = reinterpret_cast<float*>(at);
    CUDA_CHECK(cudaMemcpy2DAsync(packed, size_t(p.T) * 4, p.lse, size_t(p.lse_batch_rows) * 4, size_t(p.T) * 4,
                                 size_t(p.B * p.H), cudaMemcpyDeviceToDevice, stream));
    to.lse = packed;
    to.lse_batch_rows = 0;
  }
  if (Status s = attention_cudnn::backward_to(to, dq_add ? p.T : 0, dkv_add ? keys : 0, Workspace{ws.data, own},
                                              stream);
      s != Status::ok)
    return s;
  const auto add = [&](bf16* dst, const bf16* src, int64_t n, int64_t rows, int64_t width) {
    add_rows_kernel<<<blocks(p.B * n, 256), 256, 0, stream>>>(dev(dst), dev(src), p.B, n, rows * width);
    WEFT_LAUNCH_CHECK(stream, "add_rows_kernel");
  };
  if (dq_add) add(p.dq, to.dq, nq, p.q_batch_rows > 0 ? p.q_batch_rows : p.T, p.H * p.D);
  if (dkv_add) {
    const int64_t rows = p.kv_batch_rows > 0 ? p.kv_batch_rows : keys;
    add(p.dk, to.dk, nkv, rows, p.H_kv * p.D);
    add(p.dv, to.dv, nkv, rows, p.H_kv * p.D);
  }
  return Status::ok;
}
#endif

Status run(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  if (p.B == 0 || p.T == 0) return Status::ok;
  if (!device_has_bf16_mma()) return Status::unsupported;
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  if (p.kind == AttentionKind::cudnn) return cudnn_backward(p, ws, stream);
#endif
  if (p.kind == AttentionKind::materialized)
    materialized_backward(p, ws, stream);
  else
    flash_backward(p, ws, stream);
  return Status::ok;
}

}  // namespace

void scale_to_bf16(const float* in, nv_bf16* out, int64_t n, float scale, cudaStream_t stream) {
  scale_to_bf16_kernel<<<blocks(n, 256), 256, 0, stream>>>(in, out, n, scale);
  WEFT_LAUNCH_CHECK(stream, "scale_to_bf16_kernel");
}

}  // namespace attention_cuda

namespace {
using attention_cuda::check;
using attention_cuda::run;
using attention_cuda::scratch;
}  // namespace

WEFT_CUDA_INSTANTIATE(AttentionForwardParams)
WEFT_CUDA_INSTANTIATE(AttentionBackwardParams)

namespace {
template <typename P>
int64_t graph_workspace(const P& p) {
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  return attention_cudnn::graph_workspace(p);
#else
  (void)p;
  return -1;
#endif
}
}  // namespace

int64_t cudnn_graph_workspace(const AttentionForwardParams<bf16>& p) { return graph_workspace(p); }
int64_t cudnn_graph_workspace(const AttentionBackwardParams<bf16>& p) { return graph_workspace(p); }

bool attention_available(AttentionKind kind, Backend backend) {
  if (backend == Backend::cpu) return kind != AttentionKind::cudnn;  // as attention_cpu.cpp's check
#ifdef WEFT_HAVE_CUDNN_FRONTEND
  return true;
#else
  return kind != AttentionKind::cudnn;
#endif
}

}  // namespace weft::kernels
