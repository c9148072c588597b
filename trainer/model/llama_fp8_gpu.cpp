// The GPU's FP8 casts (bf16; llama_fp8.cpp has the linear layers that call
// them and says how the recipes scale): an operand's scaling slot, the
// per-tensor cast with its amax and scale on the device, block scaling's
// cast with its tile scales, the input and output gradient cast under the
// run's recipe, and the weights' codes, cast once per step.
#include <algorithm>

#include "kernels/fp8/fp8_ops.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using memory::Fp8Gemm;
using memory::kFp8Gemms;

using namespace fp8_detail;

template <typename Elem, typename G>
int64_t LlamaStage<Elem, G>::fp8_slot(const Block& b, Fp8Gemm g, int role) const {
  return role * plan_.layers * kFp8Gemms + b.index * kFp8Gemms + int64_t(g);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_cast(int64_t slot, const Elem* x, int64_t rows, int64_t cols, kernels::Fp8* out,
                                   kernels::Fp8* out_t) {
  const int role = int(slot / (plan_.layers * kFp8Gemms));
  const kernels::Fp8Format f = format_of(role);
  float* amax = fp8_dev_amax_ + slot;
  const bool delayed = l_.fp8 == Fp8Recipe::delayed;
  if (!delayed || fp8_history_len_ == 0) {
    // Current scaling (tensorwise, and delayed scaling's first step, whose
    // history is still empty, as on the CPU): the amax of the whole tensor,
    // over the ranks holding parts of it (device groups, device buffers),
    // then its scale on the device. Delayed scaling keeps the slot's amax
    // for the step's accumulation and works in fp8.first_step instead.
    float* current = delayed ? fp8_dev_first_ : amax;
    float* history = delayed ? fp8_dev_first_ + 1 : fp8_dev_hist_ + slot;
    run(kernels::Fp8AmaxParams<Elem>{.n = rows * cols, .x = x, .amax = current}, "fp8_amax");
    groups_.tp->all_reduce(current, 1, parallel::DType::f32, parallel::ReduceOp::max);
    if (role != 1 && groups_.cp) groups_.cp->all_reduce(current, 1, parallel::DType::f32, parallel::ReduceOp::max);
    run(kernels::Fp8ScaleUpdateParams<Elem>{.count = 1, .history_len = 1, .format = f, .amax = current,
                                            .history = history, .scale = fp8_dev_scale_ + slot,
                                            .scale_inv = fp8_scale_inv(slot)},
        "fp8_scale");
  }
  // Delayed: the step's amax accumulates for fp8_step_end.
  run(kernels::Fp8CastParams<Elem>{.rows = rows, .cols = cols, .format = f, .x = x, .scale = fp8_dev_scale_ + slot,
                                   .out = out, .out_t = out_t, .amax = delayed ? amax : nullptr,
                                   .amax_write = kernels::Write::accumulate, .health = fp8_dev_health_},
      "fp8_cast");
  fp8_counts_.values += rows * cols;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_block_cast(const Elem* x, int64_t rows, int64_t cols, kernels::Fp8Tiles tiles,
                                         const std::array<kernels::Fp8*, 2>& out,
                                         const std::array<float*, 2>& scales) {
  run(kernels::Fp8BlockCastParams<Elem>{.rows = rows, .cols = cols, .format = kernels::Fp8Format::e4m3,
                                        .tiles = tiles, .x = x, .out = out[0], .scale_inv = scales[0],
                                        .out_t = out[1], .scale_inv_t = scales[1], .health = fp8_dev_health_},
      "fp8_block_cast");
  // The CPU quantises an operand again for the weight gradient under 1 x 128
  // tiles (its transpose here), a weight once for both of its products.
  fp8_counts_.values += rows * cols * (tiles == kernels::Fp8Tiles::row128 ? 2 : 1);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_cast_input(const Elem* x, int64_t K) {
  if (l_.fp8 == Fp8Recipe::blockwise) {
    fp8_block_cast(x, M_, K, kernels::Fp8Tiles::row128, fp8_in_, fp8_in_scales_);
    fp8_in_scale_inv_ = fp8_in_scales_[1];
  } else {
    fp8_cast(fp8_in_slot_, x, M_, K, fp8_in_[0], fp8_in_[1]);
    fp8_in_scale_inv_ = fp8_scale_inv(fp8_in_slot_);
  }
  fp8_input_of_ = x;
  fp8_in_t_ = fp8_in_[1];
  fp8_in_ld_ = M_;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_cast_grad(const Block& b, Fp8Gemm g, const Elem* dy, int64_t N) {
  fp8_gr_slot_ = fp8_slot(b, g, 2);
  if (l_.fp8 == Fp8Recipe::blockwise) fp8_block_cast(dy, M_, N, kernels::Fp8Tiles::row128, fp8_gr_, fp8_gr_scales_);
  else fp8_cast(fp8_gr_slot_, dy, M_, N, fp8_gr_[0], fp8_gr_[1]);
  fp8_grad_of_ = dy;
}

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::Fp8WeightCodes LlamaStage<Elem, G>::fp8_weight_codes(const Block& b, Fp8Gemm g,
                                                                                    const Elem* w) {
  const auto& s = fp8_shapes_[size_t(g)];
  const int64_t slot = fp8_slot(b, g, 1);
  const bool blocks = l_.fp8 == Fp8Recipe::blockwise;
  const auto cast = [&](std::array<kernels::Fp8*, 2> out, std::array<float*, 2> scales) -> Fp8WeightCodes {
    if (blocks) fp8_block_cast(w, s.N, s.K, kernels::Fp8Tiles::block128, out, scales);
    else fp8_cast(slot, w, s.N, s.K, out[0], out[1]);
    return {{out[0], out[1]}, blocks ? std::array<const float*, 2>{scales[0], scales[1]}
                                     : std::array<const float*, 2>{fp8_scale_inv(slot), fp8_scale_inv(slot)}};
  };
  if (!fp8_wcodes_[0]) return cast(fp8_wscratch_, fp8_wscratch_scales_);  // ZeRO-3: cast at each use
  const size_t i = size_t(b.index * kFp8Gemms + int64_t(g));
  const int64_t at = fp8_weight_at_[i];
  std::array<float*, 2> scales{};
  if (blocks) {
    scales[0] = fp8_wscales_ + fp8_wscale_at_[i];
    scales[1] = scales[0] + kernels::fp8_tile_scales(kernels::Fp8Tiles::block128, s.N, s.K);
  }
  if (!fp8_weight_ready_[i]) {
    fp8_weight_ready_[i] = 1;
    return cast({fp8_wcodes_[0] + at, fp8_wcodes_[1] + at}, scales);
  }
  return {{fp8_wcodes_[0] + at, fp8_wcodes_[1] + at},
          blocks ? std::array<const float*, 2>{scales[0], scales[1]}
                 : std::array<const float*, 2>{fp8_scale_inv(slot), fp8_scale_inv(slot)}};
}

// The GPU's FP8 helpers, bf16 only.
#define WEFT_LLAMA_FP8_GPU(E, G)                                                                               \
  template int64_t LlamaStage<E, G>::fp8_slot(const Block&, Fp8Gemm, int) const;                              \
  template void LlamaStage<E, G>::fp8_cast(int64_t, const E*, int64_t, int64_t, kernels::Fp8*, kernels::Fp8*); \
  template typename LlamaStage<E, G>::Fp8WeightCodes LlamaStage<E, G>::fp8_weight_codes(const Block&, Fp8Gemm,      \
                                                                                        const E*);                    \
  template void LlamaStage<E, G>::fp8_block_cast(const E*, int64_t, int64_t, kernels::Fp8Tiles,                       \
                                                 const std::array<kernels::Fp8*, 2>&, const std::array<float*, 2>&);  \
  template void LlamaStage<E, G>::fp8_cast_input(const E*, int64_t);                                                  \
  template void LlamaStage<E, G>::fp8_cast_grad(const Block&, Fp8Gemm, const E*, int64_t);
WEFT_LLAMA_FP8_GPU(kernels::bf16, float)
WEFT_LLAMA_FP8_GPU(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_FP8_GPU

}  // namespace weft::trainer
