// Element types of stored tensors, with the safetensors names ("F32", "BF16",
// ...) and the conversions between fp32 and the 16-bit float formats.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

namespace weft::checkpoint {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

// The safetensors spelling, e.g. "BF16".
const char* to_string(DType d);
// Bytes per element.
int64_t dtype_size(DType d);
// Parses the safetensors spelling; false when unknown.
bool dtype_parse(std::string_view s, DType& out);

// bf16 keeps fp32's exponent and the top 7 mantissa bits. Rounds to nearest,
// ties to even, so that round-tripping a bf16 value through fp32 is exact and
// the rounding error is unbiased. NaN stays NaN (quiet bit forced, so that
// truncation never turns a NaN payload into infinity).
inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// IEEE half to fp32, exact (subnormals, infinities and NaN included).
float f16_to_f32(uint16_t h);

// Array forms. `out` holds n elements.
void f32_to_bf16(const float* in, uint16_t* out, int64_t n);
void bf16_to_f32(const uint16_t* in, float* out, int64_t n);

// Converts n elements of a floating-point tensor (F32, BF16, F16 or F64) to
// fp32. `in` need not be aligned (a safetensors data buffer may not be).
// Throws InputError for a non-floating-point dtype.
void to_f32(DType d, const void* in, float* out, int64_t n);

}  // namespace weft::checkpoint
