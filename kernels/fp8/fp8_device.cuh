// The fp8 ops' device helpers, shared by kernels/fp8/fp8.cu (the tensorwise
// cast, amax and scale update) and kernels/fp8/fp8_block.cu (block
// scaling's cast): fp8.h's encode rule written again for the device, one
// element's quantisation with its statistics, and a block's statistics
// flushed into the outputs (fp8.cu's header says why each repeats run to
// run and equals the CPU's bit for bit).
#pragma once

#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8/fp8.h"

namespace weft::kernels::fp8_device {

// fp8.h's formats as template parameters.
template <Fp8Format F>
struct Format;
template <>
struct Format<Fp8Format::e4m3> {
  static constexpr int kMantissa = 3, kBias = 7;
  static constexpr uint32_t kMaxCode = 0x7e, kOverflowCode = 0x7e;  // no infinity: saturate
  static constexpr float kMax = 448.0f, kOverflowAt = 464.0f;
};
template <>
struct Format<Fp8Format::e5m2> {
  static constexpr int kMantissa = 2, kBias = 15;
  static constexpr uint32_t kMaxCode = 0x7b, kOverflowCode = 0x7c;  // infinity
  static constexpr float kMax = 57344.0f, kOverflowAt = 61440.0f;
};

// fp8_encode (kernels/fp8/fp8_cpu.cpp), step for step.
template <Fp8Format F>
__device__ __forceinline__ uint8_t encode(float x) {
  using B = Format<F>;
  const uint32_t u = __float_as_uint(x);
  const uint32_t sign = (u >> 31) << 7;
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return uint8_t(sign | 0x7f);
  if (mag == 0x7f800000u) return uint8_t(sign | B::kOverflowCode);
  constexpr uint32_t kMinNormalExp = uint32_t(127 + 1 - B::kBias);
  uint32_t code;
  if ((mag >> 23) >= kMinNormalExp) {
    constexpr int kShift = 23 - B::kMantissa;
    const uint32_t rounded = (mag + ((1u << (kShift - 1)) - 1) + ((mag >> kShift) & 1u)) >> kShift;
    code = rounded - ((kMinNormalExp - 1) << B::kMantissa);
  } else {
    // Multiplying by a power of two is exact here (no overflow), and rintf
    // rounds to nearest even, as the host's nearbyint in double does.
    constexpr float kUnits = float(1u << (B::kBias - 1 + B::kMantissa));
    code = uint32_t(rintf(fabsf(x) * kUnits));
  }
  if (code > B::kMaxCode) code = B::kOverflowCode;
  return uint8_t(sign | code);
}

// One element's code and statistics (fp8_quantize and fp8_qdq's counts).
struct Stats {
  uint32_t amax_bits = 0;
  unsigned long long over = 0, under = 0;
};

template <Fp8Format F>
__device__ __forceinline__ uint8_t quantize(float x, float scale, Stats& st) {
  using B = Format<F>;
  float s = x * scale;
  const bool over = fabsf(s) > B::kOverflowAt;
  if (s > B::kMax) s = B::kMax;
  if (s < -B::kMax) s = -B::kMax;  // NaN passes both and stays NaN
  uint8_t code = encode<F>(s);
  // NaN keeps its sign, as fp8_encode on the host does. A device multiply
  // returns the canonical NaN, and the compiler may treat any NaN as any
  // other, so the sign is taken from x's bits with integer operations.
  const uint32_t xb = __float_as_uint(x);
  if ((xb & 0x7fffffffu) > 0x7f800000u) code = uint8_t(((xb >> 31) << 7) | 0x7fu);
  st.amax_bits = max(st.amax_bits, __float_as_uint(x) & 0x7fffffffu);
  st.over += over;
  st.under += (code & 0x7f) == 0 && x != 0.0f;
  return code;
}

struct UMaxOp {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};

// The block's statistics into the outputs: one atomic each from thread 0.
// Every thread of the block calls it.
__device__ inline void stats_flush(Stats st, float* amax, Fp8Health* health) {
  if (amax) st.amax_bits = gpu::block_reduce(st.amax_bits, UMaxOp{}, 0u);
  if (health) {
    st.over = gpu::block_reduce(st.over, gpu::SumOp{}, 0ull);
    st.under = gpu::block_reduce(st.under, gpu::SumOp{}, 0ull);
  }
  if (threadIdx.x != 0) return;
  if (amax) atomicMax(reinterpret_cast<unsigned int*>(amax), st.amax_bits);
  if (health) {
    static_assert(sizeof(Fp8Health) == 2 * sizeof(unsigned long long));
    auto* counts = reinterpret_cast<unsigned long long*>(health);
    if (st.over) atomicAdd(counts, st.over);
    if (st.under) atomicAdd(counts + 1, st.under);
  }
}

}  // namespace weft::kernels::fp8_device
