#include "core/flops.h"

#include <algorithm>
#include <array>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace weft {

namespace {

// Layers attending within chunks: the RoPE layers of a model with
// attention_chunk > 0 (NoPE layers are (i + 1) % nope_interval == 0, i < L).
int64_t chunked_layers(const ModelSpec& m, int64_t seq) {
  const AttentionVariant& a = m.attention;
  if (a.attention_chunk <= 0 || seq <= a.attention_chunk) return 0;
  return m.layers - (a.nope_interval > 0 ? m.layers / a.nope_interval : 0);
}

// Causal (query, key) pairs of a sequence of n positions.
double causal_pairs(double n) { return n * (n + 1) / 2; }

}  // namespace

double attention_widths(const ModelSpec& m, int64_t seq) {
  const int64_t chunked = chunked_layers(m, seq);
  const double T = double(seq);
  if (chunked == 0) return double(m.layers) * T;
  return double(m.layers - chunked) * T + double(chunked) * double(m.attention.attention_chunk);
}

double attention_pair_fraction(const ModelSpec& m, int64_t seq) {
  const int64_t chunked = chunked_layers(m, seq);
  if (chunked == 0 || m.layers == 0) return 1.0;
  const int64_t w = m.attention.attention_chunk;
  const double chunk_pairs = double(seq / w) * causal_pairs(double(w)) + causal_pairs(double(seq % w));
  const double L = double(m.layers);
  return (L - double(chunked)) / L + double(chunked) / L * chunk_pairs / causal_pairs(double(seq));
}

double model_flops_per_token(const ModelSpec& m, int64_t seq) {
  return 6.0 * double(m.flop_params()) + 12.0 * double(m.hidden) * attention_widths(m, seq);
}

namespace {

// (in + out) of each linear layer of a block: q, k, v, o, gate, up, down.
std::array<double, kLinears> linear_io(const ModelSpec& m) {
  const double C = double(m.hidden), D = double(m.head_dim), F = double(m.intermediate);
  const double q = double(m.heads) * D, kv = double(m.kv_heads) * D;
  return {C + q, C + kv, C + kv, q + C, C + F, C + F, F + C};
}

std::string count_text(double n) {
  return n >= 1e9 ? fmt::format("{:.2f}B", n / 1e9) : n >= 1e6 ? fmt::format("{:.1f}M", n / 1e6)
                                                                : fmt::format("{:.1f}K", n / 1e3);
}

// r (in + out) of the adapters one token passes in one block, summed over
// the targeted layers; in an MoE block its k routed experts' (`active`) or
// all E's (the parameters), and its shared expert's.
double lora_io(const ModelSpec& m, const LoraSpec& lora, bool moe, bool active) {
  const auto io = linear_io(m);
  const double r = double(lora.rank);
  double n = 0;
  for (int g = 0; g < kLinears; ++g)
    if (lora.targets_linear(Linear(g)) && (!moe || g < int(Linear::gate))) n += r * io[size_t(g)];
  if (!moe) return n;
  const double C = double(m.hidden), Fe = double(m.moe.expert_intermediate), Fs = double(m.moe.shared_intermediate);
  const double experts = active ? double(m.moe.top_k) : double(m.moe.experts);
  // gate_up: one A, one B (at its own rank where it has one)
  if (lora.targets_linear(Linear::gate)) n += experts * double(lora.experts_gate_up_rank()) * (C + 2 * Fe);
  if (lora.targets_linear(Linear::down)) n += experts * r * (Fe + C);
  if (Fs > 0)
    for (Linear g : {Linear::gate, Linear::up, Linear::down})
      if (lora.targets_linear(g)) n += r * (C + Fs);
  return n;
}

}  // namespace

int64_t lora_params(const ModelSpec& m, const LoraSpec& lora) {
  if (!lora.enabled()) return 0;
  const int64_t moe = m.moe.enabled() ? m.moe_layers() : 0;
  return int64_t(double(m.layers - moe) * lora_io(m, lora, false, false) +
                 double(moe) * lora_io(m, lora, true, false));
}

std::string mfu_flops_text(const ModelSpec& m) {
  const double n = double(m.flop_params()), all = double(m.param_count());
  const double embedding = double(m.vocab) * double(m.hidden);
  const int64_t chunked = chunked_layers(m, std::numeric_limits<int64_t>::max());
  const std::string widths =
      chunked > 0 ? fmt::format(" (T at most the chunk of {} in the {} chunked layers)", m.attention.attention_chunk,
                                chunked)
                  : "";
  return fmt::format("6N + 12 L C T model FLOPs a token{}, N = {} (the parameters but the input embedding's {}: a "
                     "lookup, no matmul; {} in all)",
                     widths, count_text(n), count_text(embedding), count_text(all));
}

void lora_check_model(const ModelSpec& m, const LoraSpec& lora) {
  if (!lora.enabled()) return;
  const bool ffn = lora.targets_linear(Linear::gate) || lora.targets_linear(Linear::up) ||
                   lora.targets_linear(Linear::down);
  if (lora.gate_up_rank > 0 && !(m.moe.enabled() && lora.targets_linear(Linear::gate)))
    throw InputError(fmt::format("--lora-gate-up-rank {} sets an MoE model's routed experts' gate_up adapters' rank, "
                                 "but {} has none{}",
                                 lora.gate_up_rank, m.name, m.moe.enabled() ? " among --lora-targets" : ""));
  if (m.moe.enabled() && ffn) {
    // The routed experts' gate and up are one tensor (transformers'
    // gate_up_proj), which PEFT adapts as one.
    if (lora.targets_linear(Linear::gate) != lora.targets_linear(Linear::up))
      throw InputError(fmt::format("--lora-targets {} on the MoE model {}: its routed experts' gate and up are one "
                                   "tensor (gate_up_proj) with one adapter; target gate and up together, or neither",
                                   lora.targets_text(), m.name));
    if (lora.dropout > 0)
      throw InputError(fmt::format("--lora-dropout {:g} with LoRA on {}'s routed experts (--lora-targets {}): an "
                                   "adapter on a 3-D expert tensor cannot factor dropout out of its input (PEFT "
                                   "refuses it too); use --lora-dropout 0 or --lora-targets q,k,v,o",
                                   lora.dropout, m.name, lora.targets_text()));
  }
  const int64_t C = m.hidden, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim, F = m.intermediate;
  const std::array<std::pair<int64_t, int64_t>, kLinears> in_out = {
      {{C, q}, {C, kv}, {C, kv}, {q, C}, {C, F}, {C, F}, {F, C}}};
  const char* names[kLinears] = {"q", "k", "v", "o", "gate", "up", "down"};
  const auto check = [&](const std::string& layer, int64_t in, int64_t out, int64_t rank, const char* flag) {
    if (rank > std::min(in, out))
      throw InputError(fmt::format("{} {} is past the width of {}'s {} layer ({} x {}): a rank is at most {} "
                                   "there; give a rank of at most {} or leave it out of --lora-targets",
                                   flag, rank, m.name, layer, out, in, std::min(in, out), std::min(in, out)));
  };
  // The dense layers' FFN (every layer's attention).
  const bool dense_ffn = !m.moe.enabled() || m.moe_layers() < m.layers;
  for (int g = 0; g < kLinears; ++g) {
    if (!lora.targets_linear(Linear(g)) || (g >= int(Linear::gate) && !dense_ffn)) continue;
    check(names[g], in_out[size_t(g)].first, in_out[size_t(g)].second, lora.rank, "--lora");
  }
  if (m.moe.enabled() && ffn) {
    const int64_t Fe = m.moe.expert_intermediate, Fs = m.moe.shared_intermediate;
    if (lora.targets_linear(Linear::gate))
      check("experts' gate_up", C, 2 * Fe, lora.experts_gate_up_rank(),
            lora.gate_up_rank > 0 ? "--lora-gate-up-rank" : "--lora");
    if (lora.targets_linear(Linear::down)) check("experts' down", Fe, C, lora.rank, "--lora");
    if (Fs > 0) check("shared expert's", std::min(C, Fs), std::max(C, Fs), lora.rank, "--lora");
  }
}

std::string lora_summary(const ModelSpec& m, const LoraSpec& lora) {
  if (!lora.enabled()) return {};
  const double n = double(lora_params(m, lora)), total = double(m.param_count());
  return fmt::format("LoRA r {}, alpha {:g}{} on {}{}: {} trainable of {} parameters ({:.2f}%)", lora.rank, lora.alpha,
                     lora.dropout > 0 ? fmt::format(", dropout {:g}", lora.dropout) : "", lora.targets_text(),
                     lora.gate_up_rank > 0 ? fmt::format(" (the experts' gate_up at r {}, alpha {:g})", lora.gate_up_rank,
                                                         lora.experts_gate_up_alpha())
                                           : "",
                     count_text(n), count_text(total), 100.0 * n / total);
}

double model_flops_per_step(const ModelSpec& m, const RunSpec& run) {
  if (!run.lora.enabled()) return model_flops_per_token(m, run.seq) * double(run.tokens_per_step());
  const double C = double(m.hidden);
  // Each adapter a token passes: 6 r (in + out) (forward, input and weight
  // gradients), through its k routed experts' in an MoE layer.
  const int64_t moe = m.moe.enabled() ? m.moe_layers() : 0;
  const double adapters = 6.0 * (double(m.layers - moe) * lora_io(m, run.lora, false, true) +
                                 double(moe) * lora_io(m, run.lora, true, true));
  const double per_token = 4.0 * double(m.flop_params()) + 12.0 * C * attention_widths(m, run.seq) + adapters;
  return per_token * double(run.tokens_per_step());
}

double mfu(double model_flops_per_second, int64_t devices, double peak_flops_per_device) {
  return model_flops_per_second / (double(devices) * peak_flops_per_device);
}

}  // namespace weft
