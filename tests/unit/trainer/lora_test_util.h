// Helpers of the LoRA tests against peft (test_lora.cpp, test_moe_lora.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/params.h"

namespace weft::trainer::test_lora {

// ||got - want|| / ||want|| over want's elements, in fp64.
template <typename T, typename U>
double rel_l2(const T* got, const std::vector<U>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += std::pow(double(got[i]) - double(want[i]), 2);
    den += std::pow(double(want[i]), 2);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// One rank's flat buffer of `specs` (whole tensors: no tp) from `read(name)`,
// a tensor widened to A.
template <typename A, typename Read>
std::vector<A> gather(const std::vector<ParamSpec>& specs, int64_t elements, Read read) {
  std::vector<A> out(static_cast<size_t>(elements));
  std::vector<float> buf;
  for (const auto& p : specs) {
    buf.resize(size_t(p.local_elements()));
    checkpoint::tensor_read_f32_block(read(p.name), 0, p.rows, 0, p.cols, buf.data());
    std::copy(buf.begin(), buf.end(), out.begin() + p.offset);
  }
  return out;
}

}  // namespace weft::trainer::test_lora
