// FP8 GEMMs of the blocks' linear layers (Layout::fp8). On the CPU they are
// emulated: each operand is quantised with its scale and dequantised
// (kernels/fp8/fp8.h) into the arena's FP8 buffers, and the fp32 GEMM
// multiplies those, which is what an FP8 GEMM with fp32 accumulation
// computes up to the order of its sums.
//
// On a GPU (bf16) they run on FP8 tensor cores (kernels/fp8/fp8_ops.h): each
// operand is cast to FP8 codes and their transpose in one pass (the GEMMs
// take only the TN form), the weights once per step, and cuBLASLt multiplies
// the codes with the scale_invs in device memory. The forward accumulates in
// the fast mode, dgrad and wgrad in split mode (the public recipes' choice);
// wgrad adds into the main gradients (beta 1). The scales follow the same
// rules as the CPU's, on the device: tensorwise takes an amax pass, reduces
// it over tp (and cp) on the device groups and turns it into a scale with a
// one-deep scale update before the cast; delayed casts with the history's
// scale (on its first step, with no history yet, with the tensor's own, as
// tensorwise does) while accumulating the step's amax, and fp8_step_end reduces the
// amaxes and runs the scale updates there. The health counts are summed on
// the device and read back once per step, in fp8_step_end (the one host
// synchronisation FP8 adds to a step). The CPU and the GPU differ only where
// an amax is not finite: the CPU records it (as +inf) and keeps scale 1
// (tensorwise) or the previous scale for the history's length (delayed);
// the GPU's scale update leaves such a step out of the history and keeps
// the previous scale.
//
// Operands and formats: the input and the weight in E4M3, the output
// gradient in E5M2 (dgrad: dY x W, wgrad: dY^T x X), per-tensor scales.
// Block scaling takes every operand in E4M3 with a scale per tile
// (core/layout.h), each tile's from its own amax: nothing is reduced across
// ranks, and the weight gradient quantises its operands again with tiles
// down their tokens. On a GPU one block cast writes both (the codes with 1 x
// 128 tiles and the transpose with tiles down the tokens; a weight's 128 x
// 128 blocks serve both of its layouts), and cuBLASLt's block-scaled GEMMs
// read the tile scales in place (kernels::Fp8Tiles), all three with split
// accumulation (it has no fast block-scaled kernels).
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

#include "kernels/elementwise/elementwise.h"
#include "kernels/fp8/fp8.h"
#include "kernels/fp8/fp8_ops.h"
#include "trainer/model/llama_run.h"

namespace weft::trainer {

using memory::Fp8Gemm;
using memory::kFp8Gemms;

using namespace fp8_detail;

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_weight_offsets() {
  // Where each (block, GEMM)'s quantised weight sits in fp8.weights, in
  // block order (-1: a GEMM outside FP8), and on a GPU under block scaling
  // where its two scale arrays are in fp8.weight_scales.
  int64_t at = 0, scales_at = 0;
  [[maybe_unused]] const auto block_scales = [](int64_t rows, int64_t k) {
    return kernels::fp8_tile_scales(kernels::Fp8Tiles::block128, rows, k);
  };
  for (int64_t i = 0; i < plan_.layers; ++i) {
    const bool block8 = l_.fp8_layer(m_, memory::global_layer(m_, l_, plan_.stage, chunk_of(i), i - chunk_begin_[size_t(chunk_of(i))]));
    // (An MoE block has no dense FFN: llama_moe_fp8.cpp quantises its experts.)
    const bool moe = params_.block_moe[size_t(i)];
    for (int gi = 0; gi < kFp8Gemms; ++gi) {
      const auto& s = fp8_shapes_[size_t(gi)];
      const bool fp8 = block8 && s.fp8 && !(moe && gi >= int(Fp8Gemm::gate));
      fp8_weight_at_.push_back(fp8 ? at : -1);
      if (fp8) at += s.K * s.N;
      if constexpr (kGpu<Elem>) {
        if (!fp8_wscales_) continue;
        fp8_wscale_at_.push_back(fp8 ? scales_at : -1);
        if (fp8) scales_at += block_scales(s.N, s.K) + block_scales(s.K, s.N);
      }
    }
  }
  WEFT_ASSERT(at == table_->elements("fp8.weights"));
  WEFT_ASSERT(!fp8_wscales_ || scales_at == table_->elements("fp8.weight_scales"));
  fp8_weight_ready_.assign(fp8_weight_at_.size(), 0);
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_setup() {
  if (l_.fp8 == Fp8Recipe::off) return;
  if constexpr (kGpu<Elem>) {
    if (l_.fp8 == Fp8Recipe::blockwise) {
      const auto halves = [&](const char* name, int64_t first) {
        float* p = table_->get<float>(name);
        return std::array<float*, 2>{p, p + first};
      };
      if (table_->has("fp8.weight_scales")) fp8_wscales_ = table_->get<float>("fp8.weight_scales");
      int64_t widest_k = 0, widest_n = 0, widest_w = 0;
      for (const auto& s : fp8_shapes_)
        if (s.fp8) {
          widest_k = std::max(widest_k, s.K);
          widest_n = std::max(widest_n, s.N);
          widest_w = std::max(widest_w, kernels::fp8_tile_scales(kernels::Fp8Tiles::block128, s.N, s.K));
        }
      if (table_->has("fp8.input_scales")) {
        fp8_in_scales_ = halves("fp8.input_scales", kernels::fp8_tile_scales(kernels::Fp8Tiles::row128, M_, widest_k));
        fp8_gr_scales_ = halves("fp8.grad_scales", kernels::fp8_tile_scales(kernels::Fp8Tiles::row128, M_, widest_n));
      }
      if (table_->has("scratch.fp8_weight_scales")) fp8_wscratch_scales_ = halves("scratch.fp8_weight_scales", widest_w);
      if (table_->has("fp8.health")) {
        fp8_dev_health_ = reinterpret_cast<kernels::Fp8Health*>(table_->get<int64_t>("fp8.health"));
        run(kernels::FillParams<float>{.n = 4, .value = 0.0, .x = reinterpret_cast<float*>(fp8_dev_health_)}, "fill");
      }
    }
    const auto both = [&](const char* name) {
      return std::array<kernels::Fp8*, 2>{table_->get<kernels::Fp8>(name, 0), table_->get<kernels::Fp8>(name, 1)};
    };
    if (table_->has("fp8.weights")) {
      fp8_wcodes_ = both("fp8.weights");
      fp8_weight_offsets();
    }
    if (table_->has("scratch.fp8_weight")) fp8_wscratch_ = both("scratch.fp8_weight");
    if (table_->has("scratch.fp8_input")) {
      fp8_in_ = both("scratch.fp8_input");
      fp8_gr_ = both("scratch.fp8_grad");
    }
    if (table_->has("fp8.scaling")) {
      const int64_t S = plan_.layers * kFp8Gemms * kRoles;
      fp8_dev_history_ = l_.fp8 == Fp8Recipe::delayed ? kFp8DelayedHistory : 1;
      WEFT_ASSERT(table_->elements("fp8.scaling") == memory::fp8_scaling_elements(S, fp8_dev_history_));
      fp8_dev_hist_ = table_->get<float>("fp8.scaling");
      fp8_dev_amax_ = fp8_dev_hist_ + S * fp8_dev_history_;
      fp8_dev_scale_ = fp8_dev_amax_ + S;
      // Each slot's scale_inv 16 bytes from the next (fp8_scale_inv), so
      // cuBLASLt reads it in place.
      fp8_dev_scale_inv_ = fp8_dev_hist_ + memory::fp8_scale_inv_offset(S, fp8_dev_history_);
      // Empty histories and amaxes, scales of 1.
      run(kernels::FillParams<float>{.n = S * (fp8_dev_history_ + 1), .value = 0.0, .x = fp8_dev_hist_}, "fill");
      run(kernels::FillParams<float>{.n = S, .value = 1.0, .x = fp8_dev_scale_}, "fill");
      run(kernels::FillParams<float>{.n = memory::kFp8ScaleInvStride * S, .value = 1.0, .x = fp8_dev_scale_inv_},
          "fill");
      if (table_->has("fp8.first_step")) fp8_dev_first_ = table_->get<float>("fp8.first_step");
      fp8_dev_health_ = reinterpret_cast<kernels::Fp8Health*>(table_->get<int64_t>("fp8.health"));
      static_assert(sizeof(kernels::Fp8Health) == 2 * sizeof(int64_t));
      // Two int64 zeros are four fp32 zeros.
      run(kernels::FillParams<float>{.n = 4, .value = 0.0, .x = reinterpret_cast<float*>(fp8_dev_health_)}, "fill");
    }
  } else if constexpr (!std::is_same_v<Elem, float>) {
    throw InputError(fmt::format("layout {}: FP8 GEMMs run on the CPU trainer (emulated, fp32) and the GPU "
                                 "trainer (bf16); the fp64 trainer has none",
                                 l_.to_string()));
  } else {
    if (table_->has("fp8.weights")) {
      fp8_weights_ = table_->get<Elem>("fp8.weights");
      fp8_weight_offsets();
    }
    if (table_->has("scratch.fp8_weight")) fp8_weight_scratch_ = table_->get<Elem>("scratch.fp8_weight");
    if (table_->has("scratch.fp8_input")) {
      fp8_input_ = table_->get<Elem>("scratch.fp8_input");
      fp8_grad_ = table_->get<Elem>("scratch.fp8_grad");
    }
    if (table_->has("fp8.scaling")) {
      fp8_scaling_ = table_->get<float>("fp8.scaling");
      fp8_slots_per_block_ = memory::fp8_delayed_slots_per_block(m_);
      const int64_t n = table_->elements("fp8.scaling");
      WEFT_ASSERT(n == plan_.layers * fp8_slots_per_block_ * kSlot);
      for (int64_t i = 0; i < n; ++i) fp8_scaling_[i] = (i % kSlot) == kScale ? 1.0f : 0.0f;
    }
  }
}

template <typename Elem, typename G>
float* LlamaStage<Elem, G>::fp8_state(const Block& b, Fp8Gemm g, int role) const {
  if (!fp8_scaling_) return nullptr;
  return fp8_scaling_ + (b.index * fp8_slots_per_block_ + int64_t(g) * kRoles + role) * kSlot;
}

template <typename Elem, typename G>
float* LlamaStage<Elem, G>::fp8_expert_state(const Block& b, int64_t e, int gemm, int role) const {
  if (!fp8_scaling_) return nullptr;
  WEFT_ASSERT(e >= 0 && e < m_.moe.experts && gemm >= 0 && gemm < 3);
  const int64_t slot = int64_t{kFp8Gemms} * kRoles + (e * 3 + gemm) * kRoles + role;
  return fp8_scaling_ + (b.index * fp8_slots_per_block_ + slot) * kSlot;
}

template <typename Elem, typename G>
bool LlamaStage<Elem, G>::fp8_gemm(const Block& b, Fp8Gemm g) const {
  return b.fp8 && fp8_shapes_[size_t(g)].fp8;
}

template <typename Elem, typename G>
bool LlamaStage<Elem, G>::fp8_gathers_codes(const Block& b, Fp8Gemm first) const {
  if (!l_.sp || run_.lora.enabled() || (l_.fp8 != Fp8Recipe::tensorwise && l_.fp8 != Fp8Recipe::delayed))
    return false;
  if (first == Fp8Gemm::q) return fp8_gemm(b, Fp8Gemm::q) && fp8_gemm(b, Fp8Gemm::k) && fp8_gemm(b, Fp8Gemm::v);
  WEFT_ASSERT(first == Fp8Gemm::gate);
  return fp8_gemm(b, Fp8Gemm::gate) && fp8_gemm(b, Fp8Gemm::up);
}

template <typename Elem, typename G>
float LlamaStage<Elem, G>::fp8_quantize(const Block& b, Fp8Gemm g, int role, const Elem* x, int64_t rows,
                                        int64_t cols, bool over_tokens, Elem* out) {
  if constexpr (!std::is_same_v<Elem, float>) {
    throw InternalError("FP8 quantisation outside the CPU trainer");
  } else {
    const int64_t n = rows * cols;
    if (l_.fp8 == Fp8Recipe::blockwise) {
      // A scale per tile, from the tile alone: 128 x 128 blocks of a weight,
      // 1 x 128 along the reduction of an activation or output gradient, or
      // 128 x 1 down its tokens for the weight gradient.
      const int64_t t = kFp8BlockTile;
      const int64_t tile_rows = role == 1 || over_tokens ? t : 1, tile_cols = role == 1 || !over_tokens ? t : 1;
      const kernels::Fp8Health h =
          kernels::fp8_qdq_tiles(x, out, rows, cols, tile_rows, tile_cols, kernels::Fp8Format::e4m3);
      fp8_counts_.values += n;
      fp8_counts_.overflow += h.overflow;
      fp8_counts_.underflow += h.underflow;
      return 0.0f;
    }
    const kernels::Fp8Format f = format_of(role);
    float amax = kernels::fp8_amax(x, n);
    float* st = fp8_state(b, g, role);
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
    return scale;
  }
}

template <typename Elem, typename G>
const Elem* LlamaStage<Elem, G>::fp8_weight(const Block& b, Fp8Gemm g, const Elem* w) {
  const auto& s = fp8_shapes_[size_t(g)];
  if (!fp8_weights_) {  // ZeRO-3: quantised at each use
    fp8_quantize(b, g, 1, w, s.N, s.K, false, fp8_weight_scratch_);
    return fp8_weight_scratch_;
  }
  const size_t i = size_t(b.index * kFp8Gemms + int64_t(g));
  Elem* q = fp8_weights_ + fp8_weight_at_[i];
  if (!fp8_weight_ready_[i]) {
    fp8_quantize(b, g, 1, w, s.N, s.K, false, q);
    fp8_weight_ready_[i] = 1;
  }
  return q;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::linear_forward(const Block& b, Fp8Gemm g, const Elem* x, bool x_same, const Elem* w,
                                         Elem* y, const char* op, const Fp8Kept* keep, bool x_rows) {
  const int64_t K = fp8_shapes_[size_t(g)].K, N = fp8_shapes_[size_t(g)].N;
  if (!fp8_gemm(b, g)) {
    WEFT_ASSERT(!x_rows);
    if (!x_same) fp8_input_of_ = nullptr;  // a later x_same call must not reuse an older quantisation
    run(kernels::linear_forward_gemm(M_, K, N, x, w, y), op);
    return;
  }
  if (keep && !keep->codes) keep = nullptr;
  // Cast first, then gather: this rank's rows go to its own block of the
  // (M, K) operand, with the scale of the whole tensor (its amax is reduced
  // over tp, or the history's), and the blocks are gathered in place.
  const int64_t row0 = x_rows ? groups_.tp->rank() * Msp_ : 0, rows = x_rows ? Msp_ : M_;
  if constexpr (kGpu<Elem>) {
    if (x_rows && !(x_same && fp8_input_of_ == x)) {
      fp8_in_slot_ = fp8_slot(b, g, 0);
      // Kept: the transposed codes of these rows are the kept ones as cast.
      fp8_cast(fp8_in_slot_, x, rows, K, fp8_in_[0] + row0 * K, keep ? reinterpret_cast<kernels::Fp8*>(keep->codes) : nullptr);
      groups_.tp->all_gather(fp8_in_[0] + row0 * K, fp8_in_[0], rows * K, parallel::DType::u8);
      fp8_input_of_ = x;
      if (keep) copy(keep->scale_inv, fp8_scale_inv(fp8_in_slot_), int64_t(sizeof(float)));
    } else if (!(x_same && fp8_input_of_ == x)) {
      fp8_in_slot_ = fp8_slot(b, g, 0);
      fp8_cast_input(x, K);
      if (keep) {
        // This rank's rows of the transposed codes: columns [row0, row0 +
        // rows) of (K, M), and the scale_inv they were cast with.
        memory::copy_2d(keep->codes, keep->rows, fp8_in_[1] + keep->row0, M_, keep->rows, K, stream_);
        copy(keep->scale_inv, fp8_scale_inv(fp8_in_slot_), int64_t(sizeof(float)));
      }
    }
    const auto wq = fp8_weight_codes(b, g, w);
    const bool blocks = l_.fp8 == Fp8Recipe::blockwise;
    // y (M, N) = x (M, K) W (N, K)^T.
    run(kernels::Fp8GemmParams<Elem>{.m = M_, .n = N, .k = K, .alpha = 1, .beta = 0,
                                     .a = fp8_in_[0], .lda = K, .a_format = kernels::Fp8Format::e4m3,
                                     .a_scale_inv = blocks ? fp8_in_scales_[0] : fp8_scale_inv(fp8_in_slot_),
                                     .a_tiles = blocks ? kernels::Fp8Tiles::row128 : kernels::Fp8Tiles::tensor,
                                     .b = wq.codes[0], .ldb = K, .b_format = kernels::Fp8Format::e4m3,
                                     .b_scale_inv = wq.scales[0],
                                     .b_tiles = blocks ? kernels::Fp8Tiles::block128 : kernels::Fp8Tiles::tensor,
                                     .c = y, .ldc = N,
                                     .accumulation = blocks ? kernels::Fp8Accumulation::split
                                                            : kernels::Fp8Accumulation::fast},
        op);
  } else {
    if (!(x_same && fp8_input_of_ == x && !fp8_input_over_tokens_)) {
      const float scale = fp8_quantize(b, g, 0, x, rows, K, false, fp8_input_ + row0 * K);
      if (x_rows) groups_.tp->all_gather(fp8_input_ + row0 * K, fp8_input_, rows * K);
      fp8_input_of_ = x;
      fp8_input_over_tokens_ = false;
      if (keep) {
        // This rank's rows' codes, row-major, as fp8_qdq formed them.
        const Elem* mine = x + (x_rows ? 0 : keep->row0 * K);
        const int64_t n = keep->rows * K;
        for (int64_t i = 0; i < n; ++i) keep->codes[i] = kernels::fp8_quantize(mine[i], scale, kernels::Fp8Format::e4m3);
        *keep->scale_inv = 1.0f / scale;
      }
    }
    run(kernels::linear_forward_gemm(M_, K, N, static_cast<const Elem*>(fp8_input_), fp8_weight(b, g, w), y), op);
  }
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
  if constexpr (kGpu<Elem>) {
    const int64_t K = shape.K, N = shape.N;
    if (!(dy_same && fp8_grad_of_ == dy)) fp8_cast_grad(b, g, dy, N);
    const auto wq = fp8_weight_codes(b, g, w);
    const bool blocks = l_.fp8 == Fp8Recipe::blockwise;
    // dx (M, K) = dy (M, N) (W^T (K, N))^T.
    run(kernels::Fp8GemmParams<Elem>{.m = M_, .n = K, .k = N, .alpha = 1,
                                     .beta = write == kernels::Write::accumulate ? 1.0f : 0.0f,
                                     .a = fp8_gr_[0], .lda = N, .a_format = format_of_grad(),
                                     .a_scale_inv = blocks ? fp8_gr_scales_[0] : fp8_scale_inv(fp8_gr_slot_),
                                     .a_tiles = blocks ? kernels::Fp8Tiles::row128 : kernels::Fp8Tiles::tensor,
                                     .b = wq.codes[1], .ldb = N, .b_format = kernels::Fp8Format::e4m3,
                                     .b_scale_inv = wq.scales[1],
                                     .b_tiles = blocks ? kernels::Fp8Tiles::block128 : kernels::Fp8Tiles::tensor,
                                     .c = dx, .ldc = K, .accumulation = kernels::Fp8Accumulation::split},
        op);
  } else {
    if (!(dy_same && fp8_grad_of_ == dy && !fp8_grad_over_tokens_)) {
      fp8_quantize(b, g, 2, dy, M_, shape.N, false, fp8_grad_);
      fp8_grad_of_ = dy;
      fp8_grad_over_tokens_ = false;
    }
    run(kernels::linear_dgrad_gemm(M_, shape.K, shape.N, static_cast<const Elem*>(fp8_grad_), fp8_weight(b, g, w),
                                   dx, write),
        op);
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_kept_inputs(Block& b, int64_t slot, int64_t layer) const {
  // Where the block keeps a GEMM input as FP8 codes (none where the layer
  // rebuilds it), the compute-type copy lives in scratch: the forward's, or
  // a recomputing layer's rebuilt one.
  const int64_t C = m_.hidden, Fl = m_.intermediate / l_.tp;
  const int64_t sp_row0 = l_.sp ? groups_.tp->rank() * Msp_ : 0;
  auto kept = [&](const char* name, int64_t row0, int64_t rows, int64_t K) {
    Fp8Kept k;
    const int64_t i = table_->has(name) ? instance(name, slot, layer) : -1;
    if (i < 0) return k;
    k.codes = table_->get<uint8_t>(name, i);
    k.scale_inv = reinterpret_cast<float*>(k.codes + memory::fp8_saved_bytes(rows * K) - 16);
    k.row0 = row0;
    k.rows = rows;
    return k;
  };
  b.in_qkv = kept("layer.attn_norm.output_fp8", sp_row0, Msp_, C);
  b.in_gate_up = kept("layer.mlp_norm.output_fp8", sp_row0, Msp_, C);
  b.in_down = kept("layer.mlp.act_fp8", 0, M_, Fl);
  if (!b.ln1) b.ln1 = table_->get<Elem>("scratch.attn_norm_out");
  if (!b.ln2) b.ln2 = table_->get<Elem>("scratch.mlp_norm_out");
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_restore(const Fp8Kept& kept, int64_t K) {
  fp8_restore_end(kept, K, fp8_restore_begin(kept, K).get());
}

template <typename Elem, typename G>
std::unique_ptr<parallel::CommRequest> LlamaStage<Elem, G>::fp8_restore_begin(const Fp8Kept& kept, int64_t K) {
  const bool gathers = kept.rows < M_;  // sequence parallelism: this rank's rows only
  if constexpr (kGpu<Elem>) {
    if (!gathers) return nullptr;
    // Each tp rank's (K, rows) block lands in fp8_in_[0], one after another.
    return groups_.tp_beside().iall_gather(kept.codes, fp8_in_[0], K * kept.rows, parallel::DType::u8);
  } else {
    // The values fp8_qdq gave the forward: decode(code) * scale_inv, this
    // rank's rows in place, then every rank's gathered around them.
    const float scale_inv = *kept.scale_inv;
    Elem* mine = fp8_input_ + kept.row0 * K;
    const int64_t n = kept.rows * K;
    for (int64_t i = 0; i < n; ++i) mine[i] = kernels::fp8_decode(kept.codes[i], kernels::Fp8Format::e4m3) * scale_inv;
    if (!gathers) return nullptr;
    return groups_.tp_beside().iall_gather(mine, fp8_input_, n);
  }
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::fp8_restore_end(const Fp8Kept& kept, int64_t K, parallel::CommRequest* pending) {
  if (pending) pending->wait();
  if constexpr (kGpu<Elem>) {
    fp8_in_scale_inv_ = kept.scale_inv;
    fp8_in_ld_ = M_;
    if (kept.rows == M_) {
      fp8_in_t_ = reinterpret_cast<const kernels::Fp8*>(kept.codes);  // (K, M) as the forward cast them
    } else {
      // Each rank's block to its columns of the (K, M) operand in fp8_in_[1].
      const auto* blocks = reinterpret_cast<const uint8_t*>(fp8_in_[0]);
      const int64_t part = K * kept.rows;
      for (int64_t r = 0; r < l_.tp; ++r)
        memory::copy_2d(fp8_in_[1] + r * kept.rows, M_, blocks + r * part, kept.rows, kept.rows, K, stream_);
      fp8_in_t_ = fp8_in_[1];
    }
  } else {
    (void)K;
  }
  fp8_input_of_ = kept.codes;
  fp8_input_over_tokens_ = false;
  fp8_restored_ = kept.codes;
}

template <typename Elem, typename G>
void LlamaStage<Elem, G>::linear_wgrad(const Block& b, Fp8Gemm g, const Elem* dy, bool dy_same, const Elem* x,
                                       bool x_same, G* dw, const char* op, const Fp8Kept* kept) {
  if (!dw) return;  // a frozen weight (LoRA)
  const auto& shape = fp8_shapes_[size_t(g)];
  if (kept && !kept->codes) kept = nullptr;
  // Restored by end_input beside the input gradients: the first weight
  // gradient reading them takes them as they are.
  const bool fresh = kept && fp8_restored_ == kept->codes;
  if (kept) fp8_restored_ = nullptr;
  if (!fp8_gemm(b, g)) {
    WEFT_ASSERT(!kept);  // kept only where every GEMM reading the input runs in FP8
    if (!dy_same) fp8_grad_of_ = nullptr;
    if (!x_same) fp8_input_of_ = nullptr;
    run(kernels::linear_wgrad_gemm(M_, shape.K, shape.N, dy, x, dw), op);
    return;
  }
  if constexpr (kGpu<Elem>) {
    const int64_t K = shape.K, N = shape.N;
    if (!(dy_same && fp8_grad_of_ == dy)) fp8_cast_grad(b, g, dy, N);
    if (kept) {
      if (!((x_same || fresh) && fp8_input_of_ == kept->codes)) fp8_restore(*kept, K);
    } else if (!(x_same && fp8_input_of_ == x)) {
      fp8_in_slot_ = fp8_slot(b, g, 0);
      fp8_cast_input(x, K);
    }
    // dW (N, K) += dy^T (N, M) (x^T (K, M))^T, into the main gradients;
    // under block scaling both with tiles down the tokens.
    const bool blocks = l_.fp8 == Fp8Recipe::blockwise;
    const kernels::Fp8Tiles tiles = blocks ? kernels::Fp8Tiles::row128 : kernels::Fp8Tiles::tensor;
    using Gemm = std::conditional_t<std::is_same_v<G, Elem>, kernels::Fp8GemmParams<Elem>,
                                    kernels::Fp8GemmAccParams<Elem>>;
    run(Gemm{.m = N, .n = K, .k = M_, .alpha = 1, .beta = 1,
             .a = fp8_gr_[1], .lda = M_, .a_format = format_of_grad(),
             .a_scale_inv = blocks ? fp8_gr_scales_[1] : fp8_scale_inv(fp8_gr_slot_), .a_tiles = tiles,
             .b = fp8_in_t_, .ldb = fp8_in_ld_, .b_format = kernels::Fp8Format::e4m3,
             .b_scale_inv = fp8_in_scale_inv_, .b_tiles = tiles,
             .c = dw, .ldc = K, .accumulation = kernels::Fp8Accumulation::split},
        op);
  } else {
    // Block scaling reduces the weight gradient over tokens, so both operands
    // take tiles down their tokens here (the other recipes reuse the
    // forward's and dgrad's quantisation).
    const bool over_tokens = l_.fp8 == Fp8Recipe::blockwise;
    if (!(dy_same && fp8_grad_of_ == dy && fp8_grad_over_tokens_ == over_tokens)) {
      fp8_quantize(b, g, 2, dy, M_, shape.N, over_tokens, fp8_grad_);
      fp8_grad_of_ = dy;
      fp8_grad_over_tokens_ = over_tokens;
    }
    if (kept) {
      if (!((x_same || fresh) && fp8_input_of_ == kept->codes)) fp8_restore(*kept, shape.K);
    } else if (!(x_same && fp8_input_of_ == x && fp8_input_over_tokens_ == over_tokens)) {
      fp8_quantize(b, g, 0, x, M_, shape.K, over_tokens, fp8_input_);
      fp8_input_of_ = x;
      fp8_input_over_tokens_ = over_tokens;
    }
    run(kernels::linear_wgrad_gemm(M_, shape.K, shape.N, static_cast<const Elem*>(fp8_grad_),
                                   static_cast<const Elem*>(fp8_input_), dw),
        op);
  }
}

#define WEFT_LLAMA_FP8(E, G)                                                                                    \
  template void LlamaStage<E, G>::fp8_setup();                                                                 \
  template bool LlamaStage<E, G>::fp8_gemm(const Block&, Fp8Gemm) const;                                      \
  template float* LlamaStage<E, G>::fp8_state(const Block&, Fp8Gemm, int) const;                               \
  template float* LlamaStage<E, G>::fp8_expert_state(const Block&, int64_t, int, int) const;                   \
  template float LlamaStage<E, G>::fp8_quantize(const Block&, Fp8Gemm, int, const E*, int64_t, int64_t, bool, E*); \
  template void LlamaStage<E, G>::fp8_weight_offsets();                                                         \
  template const E* LlamaStage<E, G>::fp8_weight(const Block&, Fp8Gemm, const E*);                             \
  template void LlamaStage<E, G>::linear_forward(const Block&, Fp8Gemm, const E*, bool, const E*, E*,          \
                                                 const char*, const Fp8Kept*, bool);                           \
  template bool LlamaStage<E, G>::fp8_gathers_codes(const Block&, Fp8Gemm) const;                              \
  template void LlamaStage<E, G>::linear_dgrad(const Block&, Fp8Gemm, const E*, bool, const E*, E*,            \
                                               kernels::Write, const char*);                                   \
  template void LlamaStage<E, G>::linear_wgrad(const Block&, Fp8Gemm, const E*, bool, const E*, bool, G*,      \
                                               const char*, const Fp8Kept*);                                   \
  template void LlamaStage<E, G>::fp8_restore(const Fp8Kept&, int64_t);                                        \
  template std::unique_ptr<parallel::CommRequest> LlamaStage<E, G>::fp8_restore_begin(const Fp8Kept&, int64_t); \
  template void LlamaStage<E, G>::fp8_restore_end(const Fp8Kept&, int64_t, parallel::CommRequest*);           \
  template void LlamaStage<E, G>::fp8_kept_inputs(Block&, int64_t, int64_t) const;
WEFT_LLAMA_FP8(float, float)
WEFT_LLAMA_FP8(double, double)
WEFT_LLAMA_FP8(kernels::bf16, float)
WEFT_LLAMA_FP8(kernels::bf16, kernels::bf16)
#undef WEFT_LLAMA_FP8

}  // namespace weft::trainer
