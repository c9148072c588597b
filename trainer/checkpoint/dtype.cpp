#include "trainer/checkpoint/dtype.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::checkpoint {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int64_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::F64, "F64", 8},   {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},   {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},
};

const DTypeInfo& info(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i;
  WEFT_ASSERT(false);
  return kDTypes[0];
}

}  // namespace

const char* to_string(DType d) { return info(d).name; }

int64_t dtype_size(DType d) { return info(d).size; }

bool dtype_parse(std::string_view s, DType& out) {
  for (const auto& i : kDTypes) {
    if (s == i.name) {
      out = i.dtype;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in fp32.
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}

void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(in[i]);
}

void to_f32(DType d, const void* in, float* out, int64_t n) {
  const auto* p = static_cast<const unsigned char*>(in);
  switch (d) {
    case DType::F32: std::memcpy(out, p, static_cast<size_t>(n) * 4); return;
    case DType::BF16:
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = d == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) {
        double x;
        std::memcpy(&x, p + 8 * i, 8);
        out[i] = static_cast<float>(x);
      }
      return;
    default: throw InputError(fmt::format("cannot convert a {} tensor to F32", to_string(d)));
  }
}

}  // namespace weft::checkpoint
