// The FP8 part of the tensor table (memory/shapes.h): which GEMMs run in FP8
// and the buffers they need.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/fp8/fp8_ops.h"
#include "memory/shapes.h"
#include "memory/shapes_detail.h"

namespace weft::memory {

std::array<Fp8GemmShape, kFp8Gemms> fp8_gemm_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l) {
  const int64_t M = l.mb * l.local_seq(run);
  std::array<Fp8GemmShape, kFp8Gemms> g{};
  for (int i = 0; i < kFp8Gemms; ++i) {
    const LinearShape ls = linear_shape(m, l, Linear(i));
    g[size_t(i)] = {ls.K, ls.N};
  }
  const int64_t run_of_tokens = fp8_token_run(run, l);
  for (auto& s : g)
    s.fp8 = l.fp8 != Fp8Recipe::off && (l.fp8 == Fp8Recipe::blockwise ? fp8_block_dims(run_of_tokens, s.K, s.N)
                                                                        : fp8_gemm_dims(M, s.K, s.N));
  return g;
}

std::string fp8_bf16_gemms_text(const ModelSpec& m, const RunSpec& run, const Layout& l) {
  if (l.fp8 == Fp8Recipe::off) return {};
  static const char* const kNames[kFp8Gemms] = {"q", "k", "v", "o", "gate", "up", "down"};
  const auto g = fp8_gemm_shapes(m, run, l);
  std::vector<std::string> bf16;
  int first = -1;
  // (A model of MoE blocks alone has no dense FFN.)
  const bool dense_ffn = !m.moe.enabled() || m.moe_layers() < m.layers;
  for (int i = 0; i < kFp8Gemms; ++i)
    if (!g[size_t(i)].fp8 && (dense_ffn || i < int(Fp8Gemm::gate))) {
      bf16.push_back(kNames[i]);
      if (first < 0) first = i;
    }
  // An MoE block's experts, by their own rule (moe_fp8_experts).
  std::string experts;
  if (m.moe.enabled() && !moe_fp8_experts(m, l))
    experts = fmt::format("the routed experts stay in {}: FP8 needs C and each expert's local width multiples of "
                          "{} (C {}, width {})",
                          to_string(run.precision), l.fp8 == Fp8Recipe::blockwise ? kFp8BlockTile : 16, m.hidden,
                          m.moe.expert_intermediate / std::max<int64_t>(1, l.etp));
  if (bf16.empty()) return experts;
  std::string names;
  for (size_t i = 0; i < bf16.size(); ++i)
    names += (i == 0 ? "" : i + 1 == bf16.size() ? " and " : ", ") + bf16[i];
  const Fp8GemmShape& s = g[size_t(first)];
  const std::string why =
      l.fp8 == Fp8Recipe::blockwise
          ? fmt::format("block scaling needs K, N and the run of tokens one rank holds multiples of {} ({}: K {}, N "
                        "{}, a run of {} tokens)",
                        kFp8BlockTile, kNames[first], s.K, s.N, fp8_token_run(run, l))
          : fmt::format("FP8 tensor cores need M, K and N multiples of 16 ({}: M {}, K {}, N {})", kNames[first],
                        l.mb * l.local_seq(run), s.K, s.N);
  return fmt::format("{} {} in {} on every rank: {}{}{}", names, bf16.size() == 1 ? "stays" : "stay",
                     to_string(run.precision), why, experts.empty() ? "" : "; ", experts);
}

bool fp8_any_gemm(const ModelSpec& m, const RunSpec& run, const Layout& l) {
  if (l.fp8 == Fp8Recipe::off) return false;
  // The attention's GEMMs, a dense FFN's where the model has one, an MoE
  // block's experts by their own rule.
  const bool dense_ffn = !m.moe.enabled() || m.moe_layers() < m.layers;
  const auto g = fp8_gemm_shapes(m, run, l);
  bool shape = moe_fp8_experts(m, l) || moe_fp8_shared(m, l);
  for (int i = 0; i < kFp8Gemms; ++i) shape = shape || (g[size_t(i)].fp8 && (dense_ffn || i < int(Fp8Gemm::gate)));
  if (!shape) return false;
  for (int64_t i = 0; i < m.layers; ++i)
    if (l.fp8_layer(m, i)) return true;
  return false;
}

std::string fp8_runs_none(const ModelSpec& m, const RunSpec& run, const Layout& l) {
  if (l.fp8 == Fp8Recipe::off || fp8_any_gemm(m, run, l)) return {};
  const std::string why = fp8_bf16_gemms_text(m, run, l);
  return fmt::format("no GEMM runs in FP8 under {}{}; use fp8:off, or a recipe and layout whose GEMMs qualify",
                     gemm_precision_text(l),
                     why.empty() ? fmt::format(" (fp8@{} keeps all {} blocks in bf16)", l.fp8_bf16_layers, m.layers)
                                 : fmt::format(" ({})", why));
}

bool fp8_gemm_dims(int64_t M, int64_t K, int64_t N) {
  return M > 0 && K > 0 && N > 0 && M % 16 == 0 && K % 16 == 0 && N % 16 == 0;
}

int64_t fp8_token_run(const RunSpec& run, const Layout& l) { return l.cp > 1 ? run.seq / (2 * l.cp) : run.seq; }

bool fp8_block_dims(int64_t token_run, int64_t K, int64_t N) {
  const int64_t t = kFp8BlockTile;
  return token_run > 0 && K > 0 && N > 0 && token_run % t == 0 && K % t == 0 && N % t == 0;
}

int64_t fp8_stage_blocks(const ModelSpec& m, const Layout& l, const StagePlan& plan) {
  if (l.fp8 == Fp8Recipe::off) return 0;
  // The FP8 blocks are the global layers [N, L - N) (Layout::fp8_layer):
  // each chunk's share of them, counted without walking its blocks.
  const int64_t lo = l.fp8_bf16_layers, hi = m.layers - l.fp8_bf16_layers;
  if (lo == 0) return l.stage_layers(m, plan.stage);
  // Chunk c of the stage is virtual stage c * pp + stage: its first layer
  // follows the pp virtual stages from the previous chunk's first on.
  int64_t n = 0, first = l.virtual_first_layer(m, plan.stage);
  for (int64_t c = 0; c < l.vpp; ++c) {
    const int64_t v = c * l.pp + plan.stage, last = first + l.virtual_layers(m, v);
    n += std::max<int64_t>(0, std::min(last, hi) - std::max(first, lo));
    for (int64_t u = v; u < v + l.pp && c + 1 < l.vpp; ++u) first += l.virtual_layers(m, u);
  }
  return n;
}

int64_t fp8_stage_dense_blocks(const ModelSpec& m, const Layout& l, const StagePlan& plan) {
  if (!m.moe.enabled()) return fp8_stage_blocks(m, l, plan);
  if (l.fp8 == Fp8Recipe::off || (m.moe.step == 1 && m.moe.dense_layers.empty())) return 0;  // (every block MoE)
  int64_t n = 0;
  for (int64_t c = 0; c < l.vpp; ++c) {
    const int64_t layers = l.virtual_layers(m, c * l.pp + plan.stage);
    for (int64_t i = 0; i < layers; ++i) {
      const int64_t g = global_layer(m, l, plan.stage, c, i);
      n += l.fp8_layer(m, g) && !m.moe_layer(g);
    }
  }
  return n;
}

namespace {

// An MoE FFN's GEMM of K and N in FP8 under the layout's recipe, whatever
// its rows.
bool moe_fp8_dims(const Layout& l, int64_t K, int64_t N) {
  if (l.fp8 == Fp8Recipe::off) return false;
  if (l.fp8 == Fp8Recipe::blockwise) return K > 0 && N > 0 && K % kFp8BlockTile == 0 && N % kFp8BlockTile == 0;
  return fp8_gemm_dims(16, K, N);
}

}  // namespace

bool moe_fp8_experts(const ModelSpec& m, const Layout& l) {
  return m.moe.enabled() && moe_fp8_dims(l, m.hidden, m.moe.expert_intermediate / std::max<int64_t>(1, l.etp));
}

bool moe_fp8_shared(const ModelSpec& m, const Layout& l) {
  return m.moe.enabled() && m.moe.shared_intermediate > 0 &&
         moe_fp8_dims(l, m.hidden, m.moe.shared_intermediate / l.tp);
}

bool moe_fp8_row_copies(const ModelSpec& m, const LoraSpec& lora, const Layout& l) {
  const bool ffn_lora = lora.enabled() && (lora.targets_linear(Linear::gate) || lora.targets_linear(Linear::up) ||
                                           lora.targets_linear(Linear::down));
  return (moe_fp8_experts(m, l) || moe_fp8_shared(m, l)) && (ffn_lora || l.fp8 == Fp8Recipe::blockwise);
}

bool moe_fp8_wgrad_tiles(const ModelSpec& m, const LoraSpec& lora, const Layout& l) {
  return (moe_fp8_experts(m, l) || moe_fp8_shared(m, l)) && l.fp8 == Fp8Recipe::blockwise && !lora.enabled();
}

Fp8SavedInputs fp8_saved_inputs(const ModelSpec& m, const RunSpec& run, const Layout& l, const StagePlan& plan) {
  if (l.fp8 != Fp8Recipe::tensorwise && l.fp8 != Fp8Recipe::delayed) return {};
  // (An MoE model keeps its FP8 blocks' inputs in the compute type.)
  if (m.moe.enabled()) return {};
  if (run.lora.enabled() || plan.layers == 0 || fp8_stage_blocks(m, l, plan) != plan.layers) return {};
  const auto g = fp8_gemm_shapes(m, run, l);
  const auto on = [&](Fp8Gemm x) { return g[size_t(x)].fp8; };
  return {.qkv = on(Fp8Gemm::q) && on(Fp8Gemm::k) && on(Fp8Gemm::v),
          .gate_up = on(Fp8Gemm::gate) && on(Fp8Gemm::up),
          .down = on(Fp8Gemm::down)};
}

bool fp8_saved_name(const char* name) {
  const size_t n = std::strlen(name);
  return n > 4 && std::strcmp(name + n - 4, "_fp8") == 0;
}

namespace detail {

void fp8_buffer_shapes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                       const StagePlan& plan, const Dims& d, std::vector<TensorShape>& out) {
  const int64_t ways = l.zero_shards();
  const bool lora = plan.lora.enabled();
  // FP8 GEMMs: each FP8 weight quantised once per step and kept (under
  // ZeRO-3, whose weights exist only while gathered, quantised at each use
  // into one buffer instead), and the quantised input and output gradient of
  // the GEMM running. On the CPU they hold the quantised-dequantised values
  // in the compute type (emulated FP8); on a GPU the FP8 codes, each with its
  // transpose (Hopper's FP8 GEMMs take only the TN layout, so the backward's
  // products need the other orientation). Delayed scaling keeps, per FP8
  // block, GEMM and operand (input, weight, output gradient), the amax
  // history, the step's amax and the scale.
  if (const int64_t n8 = fp8_stage_blocks(m, l, plan); n8 > 0) {
    const auto g = fp8_gemm_shapes(m, run, l);
    const bool gpu = device.kind == DeviceKind::gpu;
    const int64_t eb = gpu ? 1 : d.a, copies = gpu ? 2 : 1;
    // An MoE block has no dense FFN: its blocks quantise only the
    // attention's four weights here (their experts' below).
    const int64_t n8_dense = fp8_stage_dense_blocks(m, l, plan);
    int64_t weights = 0, widest_w = 0, widest_k = 0, widest_n = 0;
    for (int i = 0; i < kFp8Gemms; ++i) {
      const auto& s = g[size_t(i)];
      if (!s.fp8) continue;
      weights += s.K * s.N * (i >= int(Fp8Gemm::gate) ? n8_dense : n8);
      widest_w = std::max(widest_w, s.K * s.N);
      widest_k = std::max(widest_k, s.K);
      widest_n = std::max(widest_n, s.N);
    }
    // The shared expert quantises its input and output gradient (all rows,
    // C wide) in the same buffers, whether or not a dense GEMM runs in FP8
    // (block scaling's dense GEMMs need runs of 128 tokens, its experts not).
    const bool shared_io = moe_fp8_shared(m, l) && plan.moe_layers > 0;
    if (shared_io) {
      widest_k = std::max(widest_k, m.hidden);
      widest_n = std::max(widest_n, m.hidden);
    }
    if (weights > 0 || shared_io) {
      out.push_back({"scratch.fp8_input", Category::workspace, d.B * d.T * widest_k, eb, copies});
      out.push_back({"scratch.fp8_grad", Category::workspace, d.B * d.T * widest_n, eb, copies});
    }
    if (weights > 0) {
      if (ways > 1 && l.zero >= 3 && !lora)
        out.push_back({"scratch.fp8_weight", Category::workspace, widest_w, eb, copies});
      else
        out.push_back({"fp8.weights", Category::weights, weights, eb, copies});
      const int64_t slots = plan.layers * kFp8Gemms * 3;
      if (gpu && l.fp8 == Fp8Recipe::blockwise) {
        // Block scaling keeps a float per tile beside the codes, in the
        // layouts cuBLASLt reads (kernels::Fp8Tiles): the input's and the
        // output gradient's 1 x 128 tiles, each with its transpose's (tiles
        // down the tokens, for the weight gradient), and each weight's 128 x
        // 128 blocks laid out for it and for its transpose. Each array's
        // length is a multiple of 4 floats, so every one starts 16-byte
        // aligned as cuBLASLt needs.
        using kernels::Fp8Tiles;
        const auto both = [](Fp8Tiles t, int64_t rows, int64_t k) {
          return kernels::fp8_tile_scales(t, rows, k) + kernels::fp8_tile_scales(t, k, rows);
        };
        const int64_t M = d.B * d.T;
        out.push_back({"fp8.input_scales", Category::workspace, both(Fp8Tiles::row128, M, widest_k), kFp32, 1});
        out.push_back({"fp8.grad_scales", Category::workspace, both(Fp8Tiles::row128, M, widest_n), kFp32, 1});
        int64_t all_blocks = 0, widest = 0, widest_t = 0;
        for (int i = 0; i < kFp8Gemms; ++i) {
          const auto& s = g[size_t(i)];
          if (!s.fp8) continue;
          all_blocks += both(Fp8Tiles::block128, s.N, s.K) * (i >= int(Fp8Gemm::gate) ? n8_dense : n8);
          widest = std::max(widest, kernels::fp8_tile_scales(Fp8Tiles::block128, s.N, s.K));
          widest_t = std::max(widest_t, kernels::fp8_tile_scales(Fp8Tiles::block128, s.K, s.N));
        }
        // ZeRO-3 casts one weight at a time: the widest of each layout.
        if (ways > 1 && l.zero >= 3 && !lora)
          out.push_back({"scratch.fp8_weight_scales", Category::workspace, widest + widest_t, kFp32, 1});
        else
          out.push_back({"fp8.weight_scales", Category::weights, all_blocks, kFp32, 1});
        out.push_back({"fp8.health", Category::workspace, 2, 8, 1});
      } else if (gpu) {
        // On a GPU the scales live on the device for both recipes, per slot:
        // the amax history (one deep for tensorwise, whose scale update
        // turns the amax just reduced into the scale), the amax, the scale
        // and its inverse (the GEMMs' scale pointers, 16-byte aligned:
        // fp8_scaling_elements); and the step's overflow and underflow
        // counts, two int64.
        const int64_t history = l.fp8 == Fp8Recipe::delayed ? kFp8DelayedHistory : 1;
        out.push_back({"fp8.scaling", l.fp8 == Fp8Recipe::delayed ? Category::optimizer : Category::workspace,
                       fp8_scaling_elements(slots, history), kFp32, 1});
        out.push_back({"fp8.health", Category::workspace, 2, 8, 1});
        // Delayed scaling's first step scales from each tensor's own amax
        // (its history is empty): that amax and a one-deep history.
        if (l.fp8 == Fp8Recipe::delayed) out.push_back({"fp8.first_step", Category::workspace, 2, kFp32, 1});
      }
    }
    // An MoE block's FFN (llama_moe_fp8.cpp): its routed experts' weights
    // (this rank's E / ep, each's gate, up and down) and its shared
    // expert's, quantised at each use into one buffer on the CPU. A GPU
    // would quantise them once per step and keep the codes with their
    // transposes, per block, as it keeps the others (the trainer does not
    // run FP8 MoE blocks on a GPU yet: this is what the dry-run plans).
    // The experts' inputs, SwiGLU outputs and output gradients are
    // quantised in place; under LoRA on the FFN into one scratch, the widest
    // of them (moe_fp8_row_copies): the routed experts' rows C or Fe wide,
    // the shared expert's SwiGLU output and its gate's and up's output
    // gradients, all rows by its tp share.
    const bool routed = moe_fp8_experts(m, l), shared = moe_fp8_shared(m, l);
    const int64_t moe8 = n8 - n8_dense;
    if (moe8 > 0 && (routed || shared)) {
      const int64_t C = m.hidden, El = m.moe.experts / l.ep, Fe = m.moe.expert_intermediate / l.etp;
      const int64_t per_block = (routed ? 3 * El * Fe * C : 0) + (shared ? 3 * (m.moe.shared_intermediate / l.tp) * C : 0);
      if (gpu && !(ways > 1 && l.zero >= 3 && !lora))
        out.push_back({"fp8.expert_weights", Category::weights, moe8 * per_block, 1, 2});
      else
        out.push_back({"scratch.moe_fp8_weight", Category::workspace, per_block, eb, copies});
      if (moe_fp8_row_copies(m, plan.lora, l)) {
        const int64_t rows = routed ? moe_expert_input_rows(m, l, d) * std::max(C, Fe) : 0;
        const int64_t shared_rows = shared ? d.B * d.T * (m.moe.shared_intermediate / l.tp) : 0;
        out.push_back({"scratch.moe_fp8_rows", Category::workspace, std::max(rows, shared_rows), eb, copies});
      }
      // Block scaling's weight gradients: the routed experts' two operands
      // of one GEMM down the tokens (output gradient and input, C + Fe
      // wide), the shared expert's SwiGLU output or gate's or up's output
      // gradient (its C-wide operands go through scratch.fp8_input and
      // fp8_grad, as a dense FFN's).
      if (moe_fp8_wgrad_tiles(m, plan.lora, l)) {
        const int64_t rows = routed ? moe_expert_input_rows(m, l, d) * (C + Fe) : 0;
        const int64_t shared_rows = shared ? d.B * d.T * (m.moe.shared_intermediate / l.tp) : 0;
        out.push_back({"scratch.moe_fp8_wgrad", Category::workspace, std::max(rows, shared_rows), eb, copies});
      }
    }
    // Delayed scaling on the CPU keeps, per block and operand (the dense
    // GEMMs', then each routed expert's: fp8_delayed_slots_per_block), the
    // amax history, the step's amax and the scale.
    if (!gpu && l.fp8 == Fp8Recipe::delayed && (weights > 0 || (moe8 > 0 && (routed || shared))))
      out.push_back({"fp8.scaling", Category::optimizer,
                     plan.layers * fp8_delayed_slots_per_block(m) * (kFp8DelayedHistory + 2), kFp32, 1});
  }
}

}  // namespace detail
}  // namespace weft::memory
