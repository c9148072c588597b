// The fp8 cast, amax and delayed-scaling update on CUDA (kernels/fp8/fp8_ops.h),
// bf16 inputs, every scale and statistic in device memory.
//
// The cast computes each code with fp8.h's host rule written again for the
// device (encode below: round to nearest even by integer arithmetic on the
// float's bits, subnormals by an exact power-of-two scaling and rintf), not
// with cuda_fp8.h's conversion, so the codes equal the CPU's bit for bit on
// every architecture, NaN's sign included; the GPU test checks that on
// every code boundary. Two kernels:
//   cast_kernel       no transpose: a grid-stride loop over the elements,
//                     8 at a time (one 16-byte load of bf16, one 8-byte store
//                     of codes) where the pointers allow.
//   cast_t_wide_kernel  with out_t, rows, cols and ld_t multiples of 8 and the
//                     pointers aligned: 64 x 64 tiles through shared memory,
//                     every global access 8 elements wide (16-byte loads of
//                     bf16, 8-byte stores of codes, both layouts).
//   cast_t_kernel     with out_t otherwise: 32 x 32 tiles, one element per
//                     access, so both the row-major and the transposed
//                     stores coalesce.
// Both fuse the amax and the health counts: per-thread partials, a block
// reduction, one atomic per block. The amax is the max of |x|'s bits as
// unsigned integers, which orders non-negative floats as their values and
// puts NaN (bits past infinity's) above everything, as fp8_amax's NaN rule
// asks; the atomic is then atomicMax on those bits, in any order with the
// same result. The counts are 64-bit atomic adds of exact integers. So all
// three results repeat run to run.
#include <cuda_bf16.h>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8/fp8_check.h"
#include "kernels/fp8/fp8_device.cuh"
#include "kernels/fp8/fp8_ops.h"

namespace weft::kernels {
namespace {

using gpu::nv_bf16;

using namespace fp8_device;

constexpr int kThreads = 256;

// x (n) -> out (n); vec: x 16-byte and out 8-byte aligned.
template <Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(int64_t n, bool vec, const nv_bf16* __restrict__ x,  // (n)
                const float* __restrict__ scale_ptr,                 // (1)
                uint8_t* __restrict__ out,                           // (n)
                float* amax, Fp8Health* health) {
  const float scale = *scale_ptr;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  Stats st;
  int64_t done = 0;
  if (vec) {
    const int64_t groups = n / gpu::kVec;
    for (int64_t g = t; g < groups; g += stride) {
      const gpu::Float8 v = gpu::load8(x + g * gpu::kVec);
      uint2 codes;
      uint8_t* c = reinterpret_cast<uint8_t*>(&codes);
#pragma unroll
      for (int i = 0; i < gpu::kVec; ++i) c[i] = quantize<F>(v.v[i], scale, st);
      *reinterpret_cast<uint2*>(out + g * gpu::kVec) = codes;
    }
    done = groups * gpu::kVec;
  }
  for (int64_t i = done + t; i < n; i += stride) out[i] = quantize<F>(gpu::to_float(x[i]), scale, st);
  stats_flush(st, amax, health);
}

// x (rows, cols) -> out (rows, cols) and out_t (cols, rows), a 32 x 32 tile
// per block iteration with 256 threads as 8 rows of 32 (one-dimensional, as
// block_reduce asks): each thread loads 4 elements of a column of the tile
// and stores 4 of a row of its transpose.
constexpr int kTile = 32, kTileRows = 8;

template <Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    cast_t_kernel(int64_t rows, int64_t cols, const nv_bf16* __restrict__ x,  // (rows, cols)
                  const float* __restrict__ scale_ptr,                        // (1)
                  uint8_t* __restrict__ out,                                  // (rows, cols)
                  uint8_t* __restrict__ out_t,                                // (cols, ld)
                  int64_t ld, float* amax, Fp8Health* health) {
  __shared__ uint8_t tile[kTile][kTile + 4];  // padded: the transposed reads spread over banks
  const float scale = *scale_ptr;
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = (rows + kTile - 1) / kTile * tiles_c;
  static_assert(kTile * kTileRows == kThreads);
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  Stats st;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
#pragma unroll
    for (int i = 0; i < kTile / kTileRows; ++i) {
      const int64_t r = r0 + ty + i * kTileRows, c = c0 + tx;
      if (r < rows && c < cols) {
        const uint8_t code = quantize<F>(gpu::to_float(x[r * cols + c]), scale, st);
        out[r * cols + c] = code;
        tile[ty + i * kTileRows][tx] = code;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile / kTileRows; ++i) {
      const int64_t c = c0 + ty + i * kTileRows, r = r0 + tx;
      if (r < rows && c < cols) out_t[c * ld + r] = tile[tx][ty + i * kTileRows];
    }
    __syncthreads();
  }
  stats_flush(st, amax, health);
}

// The wide transpose: a 64 x 64 tile per block iteration. Loading, each
// thread takes 8 consecutive columns of a row (8 threads a row, 32 rows a
// pass, two passes), stores their codes in one 8-byte store and keeps them in
// the shared tile; storing the transpose, each thread gathers 8 consecutive
// rows of one column from the tile and stores them in one 8-byte store. The
// tile's rows are 68 bytes apart (17 words), so the column reads of a warp
// fall on different banks but for pairs. rows % 8 == cols % 8 == 0, so a
// group of 8 is wholly inside the tensor or wholly outside it.
constexpr int kWide = 64, kWideStride = kWide + 4;

template <Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    cast_t_wide_kernel(int64_t rows, int64_t cols, const nv_bf16* __restrict__ x,  // (rows, cols)
                       const float* __restrict__ scale_ptr,                        // (1)
                       uint8_t* __restrict__ out,                                  // (rows, cols)
                       uint8_t* __restrict__ out_t,                                // (cols, ld)
                       int64_t ld, float* amax, Fp8Health* health) {
  __shared__ __align__(16) uint8_t tile[kWide * kWideStride];
  const float scale = *scale_ptr;
  const int64_t tiles_c = (cols + kWide - 1) / kWide;
  const int64_t tiles = (rows + kWide - 1) / kWide * tiles_c;
  constexpr int kGroups = kWide / gpu::kVec;  // 8 groups of 8 across a tile
  constexpr int kPassRows = kThreads / kGroups;  // 32 rows a pass
  static_assert(kPassRows * 2 == kWide);
  const int lane_row = threadIdx.x / kGroups, lane_col = threadIdx.x % kGroups * gpu::kVec;
  Stats st;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kWide, c0 = t % tiles_c * kWide;
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int tr = lane_row + pass * kPassRows;
      const int64_t r = r0 + tr, c = c0 + lane_col;
      if (r < rows && c < cols) {
        const gpu::Float8 v = gpu::load8(x + r * cols + c);
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo |= uint32_t(quantize<F>(v.v[i], scale, st)) << (8 * i);
          hi |= uint32_t(quantize<F>(v.v[4 + i], scale, st)) << (8 * i);
        }
        *reinterpret_cast<uint2*>(out + r * cols + c) = make_uint2(lo, hi);
        uint32_t* cell = reinterpret_cast<uint32_t*>(tile + tr * kWideStride + lane_col);
        cell[0] = lo;
        cell[1] = hi;
      }
    }
    __syncthreads();
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int tc = lane_row + pass * kPassRows;
      const int64_t c = c0 + tc, r = r0 + lane_col;
      if (r < rows && c < cols) {
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo |= uint32_t(tile[(lane_col + i) * kWideStride + tc]) << (8 * i);
          hi |= uint32_t(tile[(lane_col + 4 + i) * kWideStride + tc]) << (8 * i);
        }
        *reinterpret_cast<uint2*>(out_t + c * ld + r) = make_uint2(lo, hi);
      }
    }
    __syncthreads();
  }
  stats_flush(st, amax, health);
}

template <Fp8Format F>
void cast_launch(const Fp8CastParams<bf16>& p, cudaStream_t stream) {
  const int64_t n = p.rows * p.cols, ld = p.ld_t > 0 ? p.ld_t : p.rows;
  const nv_bf16* x = gpu::dev(p.x);
  auto* out = reinterpret_cast<uint8_t*>(p.out);
  if (p.out_t == nullptr) {
    const bool vec = gpu::aligned16(p.x) && reinterpret_cast<uintptr_t>(p.out) % 8 == 0;
    const int64_t items = vec ? n / gpu::kVec + gpu::kVec : n;
    cast_kernel<F><<<gpu::grid_blocks(items, kThreads), kThreads, 0, stream>>>(n, vec, x, p.scale, out,
                                                                               p.amax, p.health);
    WEFT_LAUNCH_CHECK(stream, "fp8 cast_kernel");
  } else if (p.rows % gpu::kVec == 0 && p.cols % gpu::kVec == 0 && ld % gpu::kVec == 0 &&
             gpu::aligned16(p.x) && reinterpret_cast<uintptr_t>(p.out) % 8 == 0 &&
             reinterpret_cast<uintptr_t>(p.out_t) % 8 == 0) {
    const int64_t tiles = (p.rows + kWide - 1) / kWide * ((p.cols + kWide - 1) / kWide);
    cast_t_wide_kernel<F><<<gpu::grid_blocks(tiles * kThreads, kThreads), kThreads, 0, stream>>>(
        p.rows, p.cols, x, p.scale, out, reinterpret_cast<uint8_t*>(p.out_t), ld, p.amax, p.health);
    WEFT_LAUNCH_CHECK(stream, "fp8 cast_t_wide_kernel");
  } else {
    const int64_t tiles = (p.rows + kTile - 1) / kTile * ((p.cols + kTile - 1) / kTile);
    cast_t_kernel<F><<<gpu::grid_blocks(tiles * kThreads, kThreads), kThreads, 0, stream>>>(
        p.rows, p.cols, x, p.scale, out, reinterpret_cast<uint8_t*>(p.out_t), ld, p.amax, p.health);
    WEFT_LAUNCH_CHECK(stream, "fp8 cast_t_kernel");
  }
}

Status check(const Fp8CastParams<bf16>& p) { return fp8_detail::params_check(p); }
int64_t scratch(const Fp8CastParams<bf16>&) { return 0; }
Status run(const Fp8CastParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.amax && p.amax_write == Write::overwrite)
    CUDA_CHECK(cudaMemsetAsync(p.amax, 0, sizeof(float), stream));
  // The transpose's padding columns [rows, ld_t) of each of its rows: zeros.
  if (p.out_t && p.ld_t > p.rows && p.cols > 0)
    CUDA_CHECK(cudaMemset2DAsync(reinterpret_cast<uint8_t*>(p.out_t) + p.rows, size_t(p.ld_t), 0,
                                 size_t(p.ld_t - p.rows), size_t(p.cols), stream));
  if (p.rows * p.cols == 0) return Status::ok;
  if (p.format == Fp8Format::e4m3)
    cast_launch<Fp8Format::e4m3>(p, stream);
  else
    cast_launch<Fp8Format::e5m2>(p, stream);
  return Status::ok;
}

// Amax alone: the cast's loop without the codes.
__global__ void __launch_bounds__(kThreads)
    amax_kernel(int64_t n, bool vec, const nv_bf16* __restrict__ x,  // (n)
                float* amax) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t m = 0;
  int64_t done = 0;
  if (vec) {
    const int64_t groups = n / gpu::kVec;
    for (int64_t g = t; g < groups; g += stride) {
      const gpu::Float8 v = gpu::load8(x + g * gpu::kVec);
#pragma unroll
      for (int i = 0; i < gpu::kVec; ++i) m = max(m, __float_as_uint(v.v[i]) & 0x7fffffffu);
    }
    done = groups * gpu::kVec;
  }
  for (int64_t i = done + t; i < n; i += stride)
    m = max(m, __float_as_uint(gpu::to_float(x[i])) & 0x7fffffffu);
  m = gpu::block_reduce(m, UMaxOp{}, 0u);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
}

Status check(const Fp8AmaxParams<bf16>& p) { return fp8_detail::params_check(p); }
int64_t scratch(const Fp8AmaxParams<bf16>&) { return 0; }
Status run(const Fp8AmaxParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.write == Write::overwrite) CUDA_CHECK(cudaMemsetAsync(p.amax, 0, sizeof(float), stream));
  if (p.n == 0) return Status::ok;
  const bool vec = gpu::aligned16(p.x);
  const int64_t items = vec ? p.n / gpu::kVec + gpu::kVec : p.n;
  amax_kernel<<<gpu::grid_blocks(items, kThreads), kThreads, 0, stream>>>(p.n, vec, gpu::dev(p.x), p.amax);
  WEFT_LAUNCH_CHECK(stream, "fp8 amax_kernel");
  return Status::ok;
}

// The scale update: one thread per tensor, fp8_scale_update_one (fp8_ops_cpu.cpp)
// step for step. The divisions are IEEE (no fast-math), so the scales equal
// the host's bit for bit.
__global__ void __launch_bounds__(kThreads) scale_update_kernel(int64_t count, int64_t len, float format_max,
                                                                const float* __restrict__ amax,  // (count)
                                                                float* __restrict__ history,  // (count, len)
                                                                float* __restrict__ scale,    // (count)
                                                                float* __restrict__ scale_inv,  // (count, stride)
                                                                int64_t stride) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= count) return;
  const float a = amax[t];
  float s = scale[t];
  if (isfinite(a)) {
    float* h = history + t * len;
    float m = a;
    for (int64_t i = len - 1; i > 0; --i) {
      const float v = h[i - 1];
      h[i] = v;
      m = isnan(v) || isnan(m) ? NAN : fmaxf(m, v);
    }
    h[0] = a;
    // fp8_scale(m, format, s).
    if (isfinite(m)) {
      if (m == 0.0f) {
        s = 1.0f;
      } else {
        const float q = format_max / m;
        if (isfinite(q)) s = q;
      }
    }
    scale[t] = s;
  }
  scale_inv[t * stride] = 1.0f / s;
}

Status check(const Fp8ScaleUpdateParams<bf16>& p) { return fp8_detail::params_check(p); }
int64_t scratch(const Fp8ScaleUpdateParams<bf16>&) { return 0; }
Status run(const Fp8ScaleUpdateParams<bf16>& p, Workspace, cudaStream_t stream) {
  if (p.count == 0) return Status::ok;
  const int64_t blocks = (p.count + kThreads - 1) / kThreads;
  scale_update_kernel<<<blocks, kThreads, 0, stream>>>(p.count, p.history_len, fp8_max(p.format), p.amax,
                                                       p.history, p.scale, p.scale_inv, p.scale_inv_stride);
  WEFT_LAUNCH_CHECK(stream, "fp8 scale_update_kernel");
  return Status::ok;
}

}  // namespace

WEFT_CUDA_INSTANTIATE(Fp8CastParams)
WEFT_CUDA_INSTANTIATE(Fp8AmaxParams)
WEFT_CUDA_INSTANTIATE(Fp8ScaleUpdateParams)

}  // namespace weft::kernels
