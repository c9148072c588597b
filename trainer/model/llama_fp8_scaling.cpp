// FP8 scaling state per step (Layout::fp8; see llama_fp8.cpp for the
// recipes): the step's start and end (delayed scaling's amax reduction and
// scale update, the health counts read back) and the amax history that
// checkpoints carry, oldest first, on the CPU and the GPU alike.
#include <algorithm>
#include <cmath>

#include "kernels/elementwise/elementwise.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_ops.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using memory::kFp8Gemms;
using namespace fp8_detail;

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_step_begin() {
  fp8_counts_ = {};
  std::fill(fp8_weight_ready_.begin(), fp8_weight_ready_.end(), 0);
  fp8_input_of_ = fp8_grad_of_ = nullptr;
  if constexpr (kGpu<Elem>) {
    // Block scaling keeps health counts and no scaling state.
    if (!fp8_dev_health_) return;
    run(kernels::FillParams<float>{.n = 4, .value = 0.0, .x = reinterpret_cast<float*>(fp8_dev_health_)}, "fill");
    if (fp8_dev_hist_ && l_.fp8 == Fp8Recipe::delayed)
      run(kernels::FillParams<float>{.n = plan_.layers * kFp8Gemms * kRoles, .value = 0.0, .x = fp8_dev_amax_},
          "fill");
    return;
  }
  if (!fp8_scaling_) return;
  const int64_t slots = plan_.layers * fp8_slots_per_block_;
  for (int64_t i = 0; i < slots; ++i) fp8_scaling_[i * kSlot + kStepAmax] = 0.0f;
}

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::Fp8Counts LlamaStage<Elem, G>::fp8_step_end(bool commit) {
  Fp8Counts counts = fp8_counts_;
  fp8_counts_ = {};
  if constexpr (kGpu<Elem>) {
    if (!fp8_dev_health_) return counts;
    const int64_t S = plan_.layers * kFp8Gemms * kRoles, BG = plan_.layers * kFp8Gemms;
    if (commit && fp8_dev_hist_ && l_.fp8 == Fp8Recipe::delayed) {
      // As on the CPU: the step's amaxes over tp, then dp x cp (device
      // groups), then each format's slots gain them in one scale update.
      groups_.tp->all_reduce(fp8_dev_amax_, S, parallel::DType::f32, parallel::ReduceOp::max);
      if (groups_.dpcp)
        groups_.dpcp->all_reduce(fp8_dev_amax_, S, parallel::DType::f32, parallel::ReduceOp::max);
      // Input and weight slots (E4M3), then the output gradients' (E5M2).
      for (int f = 0; f < 2; ++f) {
        const int64_t first = f == 0 ? 0 : 2 * BG, count = f == 0 ? 2 * BG : BG;
        run(kernels::Fp8ScaleUpdateParams<Elem>{.count = count, .history_len = fp8_dev_history_,
                                                .format = f == 0 ? kernels::Fp8Format::e4m3 : kernels::Fp8Format::e5m2,
                                                .amax = fp8_dev_amax_ + first,
                                                .history = fp8_dev_hist_ + first * fp8_dev_history_,
                                                .scale = fp8_dev_scale_ + first,
                                                .scale_inv = fp8_scale_inv(first),
                                                .scale_inv_stride = memory::kFp8ScaleInvStride},
            "fp8_scale_update");
      }
      run(kernels::FillParams<float>{.n = S, .value = 0.0, .x = fp8_dev_amax_}, "fill");
      fp8_history_len_ = std::min(fp8_history_len_ + 1, kFp8DelayedHistory);
    }
    // The step's health counts: the one host synchronisation FP8 adds.
    kernels::Fp8Health h;
    memory::copy(&h, fp8_dev_health_, sizeof h, stream_);
    memory::synchronize(stream_);
    counts.overflow = h.overflow;
    counts.underflow = h.underflow;
    return counts;
  }
  if (!fp8_scaling_ || !commit) return counts;  // (the next fp8_step_begin clears the step's amaxes)
  // The step's amaxes, reduced over every rank that holds this stage: tp,
  // then dp x cp (an MoE block's expert slots take their amaxes from the
  // ranks holding the expert, zero elsewhere; ep's ranks are among these).
  // Then each slot's history gains it, and the next step's scale is the
  // format's max over the history's largest amax.
  const int64_t slots = plan_.layers * fp8_slots_per_block_;
  std::vector<float> amax(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) amax[size_t(i)] = fp8_scaling_[i * kSlot + kStepAmax];
  const auto& host = groups_.host_groups();
  host.tp->all_reduce(amax.data(), slots, parallel::DType::f32, parallel::ReduceOp::max);
  host.dpcp->all_reduce(amax.data(), slots, parallel::DType::f32, parallel::ReduceOp::max);
  const int64_t len = std::min(fp8_history_len_ + 1, kFp8DelayedHistory);
  for (int64_t i = 0; i < slots; ++i) {
    float* st = fp8_scaling_ + i * kSlot;
    st[fp8_history_next_] = amax[size_t(i)];
    float largest = 0.0f;
    for (int64_t h = 0; h < len; ++h) largest = std::max(largest, st[h]);
    st[kScale] = kernels::fp8_scale(largest, format_of(int(i % kRoles)), st[kScale]);
    st[kStepAmax] = 0.0f;
  }
  fp8_history_len_ = len;
  fp8_history_next_ = (fp8_history_next_ + 1) % kFp8DelayedHistory;
  return counts;
}

template <typename Elem, typename G>
std::vector<float> LlamaStage<Elem, G>::fp8_history() const {
  std::vector<float> out;
  if constexpr (kGpu<Elem>) {
    if (!fp8_dev_hist_ || l_.fp8 != Fp8Recipe::delayed) return out;
    // The device rows are newest first, per slot role * BG + block gemm; the
    // checkpoint's, the CPU's order: per block gemm and role, oldest first,
    // the filled entries, then zeros.
    const int64_t S = plan_.layers * kFp8Gemms * kRoles, BG = plan_.layers * kFp8Gemms, H = kFp8DelayedHistory;
    std::vector<float> dev(size_t(S * H));
    memory::copy(dev.data(), fp8_dev_hist_, S * H * int64_t(sizeof(float)), stream_);
    memory::synchronize(stream_);
    const int64_t len = fp8_history_len_;
    out.assign(size_t(S * H), 0.0f);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t slot = (i % kRoles) * BG + i / kRoles;
      for (int64_t h = 0; h < len; ++h) out[size_t(i * H + h)] = dev[size_t(slot * H + len - 1 - h)];
    }
    return out;
  }
  if (!fp8_scaling_) return out;
  const int64_t slots = plan_.layers * fp8_slots_per_block_, H = kFp8DelayedHistory;
  out.reserve(size_t(slots * H));
  // Unrolled from the ring: when it is full the oldest entry sits at the next write.
  const int64_t first = fp8_history_len_ == H ? fp8_history_next_ : 0;
  for (int64_t i = 0; i < slots; ++i)
    for (int64_t h = 0; h < H; ++h) out.push_back(fp8_scaling_[i * kSlot + (first + h) % H]);
  return out;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_history_set(const std::vector<float>& history, int64_t len) {
  if constexpr (kGpu<Elem>) {
    if (!fp8_dev_hist_ || l_.fp8 != Fp8Recipe::delayed) return;
    const int64_t S = plan_.layers * kFp8Gemms * kRoles, BG = plan_.layers * kFp8Gemms, H = kFp8DelayedHistory;
    WEFT_ASSERT(int64_t(history.size()) == S * H && len >= 0 && len <= H);
    // The device state (history, amax, scale, the aligned scale_invs; see
    // fp8_setup) from the oldest-first entries, scales as the CPU sets them.
    const int64_t inv_at = memory::fp8_scale_inv_offset(S, H);
    std::vector<float> dev(size_t(memory::fp8_scaling_elements(S, H)), 1.0f);
    std::fill(dev.begin(), dev.begin() + S * (H + 1), 0.0f);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t slot = (i % kRoles) * BG + i / kRoles;
      float largest = 0.0f;
      for (int64_t h = 0; h < len; ++h) {
        const float v = history[size_t(i * H + h)];
        dev[size_t(slot * H + len - 1 - h)] = v;
        largest = std::max(largest, v);
      }
      const float scale = kernels::fp8_scale(largest, format_of(int(i % kRoles)), 1.0f);
      dev[size_t(S * (H + 1) + slot)] = scale;
      dev[size_t(inv_at + memory::kFp8ScaleInvStride * slot)] = 1.0f / scale;
    }
    memory::copy(fp8_dev_hist_, dev.data(), int64_t(dev.size() * sizeof(float)), stream_);
    memory::synchronize(stream_);
    fp8_history_len_ = len;
    fp8_history_next_ = len % H;
    return;
  }
  if (!fp8_scaling_) return;
  const int64_t slots = plan_.layers * fp8_slots_per_block_, H = kFp8DelayedHistory;
  WEFT_ASSERT(int64_t(history.size()) == slots * H && len >= 0 && len <= H);
  for (int64_t i = 0; i < slots; ++i) {
    float* st = fp8_scaling_ + i * kSlot;
    float largest = 0.0f;
    for (int64_t h = 0; h < H; ++h) {
      st[h] = history[size_t(i * H + h)];
      if (h < len) largest = std::max(largest, st[h]);
    }
    st[kStepAmax] = 0.0f;
    st[kScale] = kernels::fp8_scale(largest, format_of(int(i % kRoles)), 1.0f);
  }
  fp8_history_len_ = len;
  fp8_history_next_ = len % H;
}

#define WEFT_LLAMA_FP8_SCALING(E, G)                                                \
  template void LlamaStage<E, G>::fp8_step_begin();                                \
  template typename LlamaStage<E, G>::Fp8Counts LlamaStage<E, G>::fp8_step_end(bool); \
  template std::vector<float> LlamaStage<E, G>::fp8_history() const;               \
  template void LlamaStage<E, G>::fp8_history_set(const std::vector<float>&, int64_t);
WEFT_LLAMA_FP8_SCALING(float, float)
WEFT_LLAMA_FP8_SCALING(double, double)
WEFT_LLAMA_FP8_SCALING(kernels::bf16, float)
WEFT_LLAMA_FP8_SCALING(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_FP8_SCALING

}  // namespace weft::trainer
