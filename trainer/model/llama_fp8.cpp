// FP8 GEMMs of the blocks' linear layers (Layout::fp8). On the CPU they are
// emulated: each operand is quantised with its scale and dequantised
// (kernels/fp8/fp8.h) into the arena's FP8 buffers, and the fp32 GEMM
// multiplies those, which is what an FP8 GEMM with fp32 accumulation
// computes up to the order of its sums.
//
// Operands and formats: the input and the weight in E4M3, the output
// gradient in E5M2 (dgrad: dY x W, wgrad: dY^T x X), per-tensor scales.
//
// Scales agree across layouts. Tensorwise: a tensor's amax is reduced over
// the ranks that each hold a part of it before its scale is taken, tp and cp
// for activations and gradients (tp splits features, cp the sequence; a
// tensor every tp rank holds whole reduces to itself), tp for weights (cp
// and dp ranks hold the same weights; ZeRO-3 gathers them whole before use).
// So every rank quantises its part as one rank holding the whole tensor
// would. Delayed: a step's scales come from the amax history of earlier
// steps, identical on every rank; the step's amaxes are reduced over all
// ranks of the stage at its end. Micro-batches are quantised one at a time in
// both, so dp and pipelining, which change only which rank runs a
// micro-batch and when, change no scale.
#include <cmath>
#include <limits>

#include "kernels/fp8/fp8.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using memory::Fp8Gemm;
using memory::kFp8Gemms;

namespace {

constexpr int kRoles = 3;  // input, weight, output gradient
constexpr int64_t kSlot = kFp8DelayedHistory + 2;  // history, the step's amax, the step's scale
constexpr int64_t kStepAmax = kFp8DelayedHistory, kScale = kFp8DelayedHistory + 1;

kernels::Fp8Format format_of(int role) { return role == 2 ? kernels::Fp8Format::e5m2 : kernels::Fp8Format::e4m3; }

// MPI's max of NaN is undefined: a NaN amax travels as +inf, which keeps the
// previous scale (fp8_scale) just as NaN would.
float reducible(float amax) { return std::isnan(amax) ? std::numeric_limits<float>::infinity() : amax; }

}  // namespace

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_setup() {
  if (l_.fp8 == Fp8Recipe::off) return;
  if constexpr (!std::is_same_v<Elem, float>) {
    throw InputError(fmt::format("layout {}: FP8 GEMMs run on the CPU trainer (emulated) only so far; the CUDA "
                                 "FP8 kernels are not wired into the {} trainer",
                                 l_.to_string(), on_device() ? "GPU" : "fp64"));
  } else {
    if (table_->has("fp8.weights")) {
      fp8_weights_ = table_->get<Elem>("fp8.weights");
      int64_t at = 0;
      for (int64_t i = 0; i < plan_.layers; ++i) {
        const bool fp8 = l_.fp8_layer(m_, memory::global_layer(m_, l_, plan_.stage, i / Lc_, i % Lc_));
        for (const auto& s : fp8_shapes_) {
          fp8_weight_at_.push_back(fp8 && s.fp8 ? at : -1);
          if (fp8 && s.fp8) at += s.K * s.N;
        }
      }
      WEFT_ASSERT(at == table_->elements("fp8.weights"));
      fp8_weight_ready_.assign(fp8_weight_at_.size(), 0);
    }
    if (table_->has("scratch.fp8_weight")) fp8_weight_scratch_ = table_->get<Elem>("scratch.fp8_weight");
    if (table_->has("scratch.fp8_input")) {
      fp8_input_ = table_->get<Elem>("scratch.fp8_input");
      fp8_grad_ = table_->get<Elem>("scratch.fp8_grad");
    }
    if (table_->has("fp8.scaling")) {
      fp8_scaling_ = table_->get<float>("fp8.scaling");
      const int64_t n = table_->elements("fp8.scaling");
      WEFT_ASSERT(n == plan_.layers * kFp8Gemms * kRoles * kSlot);
      for (int64_t i = 0; i < n; ++i) fp8_scaling_[i] = (i % kSlot) == kScale ? 1.0f : 0.0f;
    }
  }
}

template <typename Elem, typename G>
bool LlamaStage<Elem, G>::fp8_gemm(const Block& b, Fp8Gemm g) const {
  return b.fp8 && fp8_shapes_[size_t(g)].fp8;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_quantize(const Block& b, Fp8Gemm g, int role, const Elem* x, int64_t n, Elem* out) {
  if constexpr (!std::is_same_v<Elem, float>) {
    throw InternalError("FP8 quantisation outside the CPU trainer");
  } else {
    const kernels::Fp8Format f = format_of(role);
    float amax = kernels::fp8_amax(x, n);
    float* st = fp8_scaling_ ? fp8_scaling_ + ((b.index * kFp8Gemms + int64_t(g)) * kRoles + role) * kSlot : nullptr;
    float scale;
    if (st) st[kStepAmax] = std::max(st[kStepAmax], reducible(amax));
    if (st && fp8_history_len_ > 0) {
      scale = st[kScale];
    } else {
      // Current scaling: the amax of the whole tensor, over the ranks holding parts of it.
      amax = reducible(amax);
      groups_.tp->all_reduce(&amax, 1, parallel::DType::f32, parallel::ReduceOp::max);
      if (role != 1 && groups_.cp) groups_.cp->all_reduce(&amax, 1, parallel::DType::f32, parallel::ReduceOp::max);
      scale = kernels::fp8_scale(amax, f);
    }
    const kernels::Fp8Health h = kernels::fp8_qdq(x, out, n, scale, f);
    fp8_counts_.values += n;
    fp8_counts_.overflow += h.overflow;
    fp8_counts_.underflow += h.underflow;
  }
}

template <typename Elem, typename G>
const Elem* LlamaStage<Elem, G>::fp8_weight(const Block& b, Fp8Gemm g, const Elem* w) {
  const auto& s = fp8_shapes_[size_t(g)];
  if (!fp8_weights_) {  // ZeRO-3: quantised at each use
    fp8_quantize(b, g, 1, w, s.K * s.N, fp8_weight_scratch_);
    return fp8_weight_scratch_;
  }
  const size_t i = size_t(b.index * kFp8Gemms + int64_t(g));
  Elem* q = fp8_weights_ + fp8_weight_at_[i];
  if (!fp8_weight_ready_[i]) {
    fp8_quantize(b, g, 1, w, s.K * s.N, q);
    fp8_weight_ready_[i] = 1;
  }
  return q;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::linear_forward(const Block& b, Fp8Gemm g, const Elem* x, bool x_same, const Elem* w,
                                         Elem* y, const char* op) {
  const int64_t K = fp8_shapes_[size_t(g)].K, N = fp8_shapes_[size_t(g)].N;
  if (!fp8_gemm(b, g)) {
    if (!x_same) fp8_input_of_ = nullptr;  // a later x_same call must not reuse an older quantisation
    run(kernels::linear_forward_gemm(M_, K, N, x, w, y), op);
    return;
  }
  if (!(x_same && fp8_input_of_ == x)) {
    fp8_quantize(b, g, 0, x, M_ * K, fp8_input_);
    fp8_input_of_ = x;
  }
  run(kernels::linear_forward_gemm(M_, K, N, static_cast<const Elem*>(fp8_input_), fp8_weight(b, g, w), y), op);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::linear_dgrad(const Block& b, Fp8Gemm g, const Elem* dy, bool dy_same, const Elem* w,
                                       Elem* dx, kernels::Write write, const char* op) {
  const auto& shape = fp8_shapes_[size_t(g)];
  if (!fp8_gemm(b, g)) {
    if (!dy_same) fp8_grad_of_ = nullptr;
    run(kernels::linear_dgrad_gemm(M_, shape.K, shape.N, dy, w, dx, write), op);
    return;
  }
  if (!(dy_same && fp8_grad_of_ == dy)) {
    fp8_quantize(b, g, 2, dy, M_ * shape.N, fp8_grad_);
    fp8_grad_of_ = dy;
  }
  run(kernels::linear_dgrad_gemm(M_, shape.K, shape.N, static_cast<const Elem*>(fp8_grad_), fp8_weight(b, g, w), dx,
                                 write),
      op);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::linear_wgrad(const Block& b, Fp8Gemm g, const Elem* dy, bool dy_same, const Elem* x,
                                       bool x_same, G* dw, const char* op) {
  const auto& shape = fp8_shapes_[size_t(g)];
  if (!fp8_gemm(b, g)) {
    if (!dy_same) fp8_grad_of_ = nullptr;
    if (!x_same) fp8_input_of_ = nullptr;
    run(kernels::linear_wgrad_gemm(M_, shape.K, shape.N, dy, x, dw), op);
    return;
  }
  if (!(dy_same && fp8_grad_of_ == dy)) {
    fp8_quantize(b, g, 2, dy, M_ * shape.N, fp8_grad_);
    fp8_grad_of_ = dy;
  }
  if (!(x_same && fp8_input_of_ == x)) {
    fp8_quantize(b, g, 0, x, M_ * shape.K, fp8_input_);
    fp8_input_of_ = x;
  }
  run(kernels::linear_wgrad_gemm(M_, shape.K, shape.N, static_cast<const Elem*>(fp8_grad_),
                                 static_cast<const Elem*>(fp8_input_), dw),
      op);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_step_begin() {
  fp8_counts_ = {};
  std::fill(fp8_weight_ready_.begin(), fp8_weight_ready_.end(), 0);
  fp8_input_of_ = fp8_grad_of_ = nullptr;
  if (!fp8_scaling_) return;
  const int64_t slots = plan_.layers * kFp8Gemms * kRoles;
  for (int64_t i = 0; i < slots; ++i) fp8_scaling_[i * kSlot + kStepAmax] = 0.0f;
}

template <typename Elem, typename G>
typename LlamaStage<Elem, G>::Fp8Counts LlamaStage<Elem, G>::fp8_step_end() {
  const Fp8Counts counts = fp8_counts_;
  fp8_counts_ = {};
  if (!fp8_scaling_) return counts;
  // The step's amaxes, reduced over every rank that holds this stage: tp,
  // then dp x cp. Then each slot's history gains it, and the next step's
  // scale is the format's max over the history's largest amax.
  const int64_t slots = plan_.layers * kFp8Gemms * kRoles;
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
  if (!fp8_scaling_) return out;
  const int64_t slots = plan_.layers * kFp8Gemms * kRoles, H = kFp8DelayedHistory;
  out.reserve(size_t(slots * H));
  // Unrolled from the ring: when it is full the oldest entry sits at the next write.
  const int64_t first = fp8_history_len_ == H ? fp8_history_next_ : 0;
  for (int64_t i = 0; i < slots; ++i)
    for (int64_t h = 0; h < H; ++h) out.push_back(fp8_scaling_[i * kSlot + (first + h) % H]);
  return out;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_history_set(const std::vector<float>& history, int64_t len) {
  if (!fp8_scaling_) return;
  const int64_t slots = plan_.layers * kFp8Gemms * kRoles, H = kFp8DelayedHistory;
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

#define WEFT_LLAMA_FP8(E, G)                                                                                    \
  template void LlamaStage<E, G>::fp8_setup();                                                                 \
  template bool LlamaStage<E, G>::fp8_gemm(const Block&, Fp8Gemm) const;                                      \
  template void LlamaStage<E, G>::fp8_quantize(const Block&, Fp8Gemm, int, const E*, int64_t, E*);             \
  template const E* LlamaStage<E, G>::fp8_weight(const Block&, Fp8Gemm, const E*);                             \
  template void LlamaStage<E, G>::linear_forward(const Block&, Fp8Gemm, const E*, bool, const E*, E*,          \
                                                 const char*);                                                 \
  template void LlamaStage<E, G>::linear_dgrad(const Block&, Fp8Gemm, const E*, bool, const E*, E*,            \
                                               kernels::Write, const char*);                                   \
  template void LlamaStage<E, G>::linear_wgrad(const Block&, Fp8Gemm, const E*, bool, const E*, bool, G*,      \
                                               const char*);                                                   \
  template void LlamaStage<E, G>::fp8_step_begin();                                                            \
  template typename LlamaStage<E, G>::Fp8Counts LlamaStage<E, G>::fp8_step_end();                             \
  template std::vector<float> LlamaStage<E, G>::fp8_history() const;                                           \
  template void LlamaStage<E, G>::fp8_history_set(const std::vector<float>&, int64_t);
WEFT_LLAMA_FP8(float, float)
WEFT_LLAMA_FP8(double, double)
WEFT_LLAMA_FP8(kernels::bf16, float)
WEFT_LLAMA_FP8(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_FP8

}  // namespace weft::trainer
