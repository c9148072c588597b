// rope: rotary position embedding in the Hugging Face Llama layout, in place
// on q and k.
//
// Element i of a head pairs with element i + D/2 (rotate_half); the pair
// rotates by angle pos * inv_freq_i with inv_freq_i = theta^(-2i / D), for
// i < D/2, rescaled by `scaling` when set (Llama 3.1 and 3.2's rope_type
// "llama3", core/rope_scaling.h: the unscaled value in fp32, then the rule in
// double, rounded once; plain RoPE takes exactly the unscaled path). The position of row t is position_offset + t, so a sequence shard
// that starts mid-sequence passes its first position. The backward is the
// inverse rotation (the rotation's transpose) applied to dq and dk.
#pragma once

#include <cstdint>

#include "core/rope_scaling.h"
#include "kernels/kernel.h"

namespace weft::kernels {

enum class RopeDirection { forward, backward };

template <typename Elem>
struct RopeParams {
  RopeDirection direction = RopeDirection::forward;
  int64_t B = 0;
  int64_t T = 0;
  int64_t H = 0;
  int64_t H_kv = 0;
  int64_t D = 0;  // even
  int64_t position_offset = 0;
  double theta = 10000.0;
  RopeScaling scaling = {};  // type none: plain RoPE
  Elem* q = nullptr;  // (B, T, H, D) in place; dq for the backward
  Elem* k = nullptr;  // (B, T, H_kv, D) in place; dk for the backward
};

// Workspace: the cos and sin table, (T, D/2) each, in Acc.
template <typename Elem>
bool supports(const RopeParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
int64_t workspace_bytes(const RopeParams<Elem>& p, Backend backend = Backend::cpu);
template <typename Elem>
Status launch(const RopeParams<Elem>& p, Workspace ws, Stream stream = {});

}  // namespace weft::kernels
