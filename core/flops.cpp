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

}  // namespace

int64_t lora_params(const ModelSpec& m, const LoraSpec& lora) {
  if (!lora.enabled()) return 0;
  const auto io = linear_io(m);
  int64_t n = 0;
  for (int g = 0; g < kLinears; ++g)
    if (lora.targets_linear(Linear(g))) n += lora.rank * int64_t(io[size_t(g)]);
  return n * m.layers;
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
  if (m.moe.enabled() && (lora.targets_linear(Linear::gate) || lora.targets_linear(Linear::up) ||
                          lora.targets_linear(Linear::down)))
    throw InputError(fmt::format("--lora-targets {} on the MoE model {}: adapters on its FFN (gate, up, down: the "
                                 "experts' projections) are not computed yet; --lora-targets q,k,v,o adapts the "
                                 "attention, the experts and router frozen",
                                 lora.targets_text(), m.name));
  const int64_t C = m.hidden, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim, F = m.intermediate;
  const std::array<std::pair<int64_t, int64_t>, kLinears> in_out = {
      {{C, q}, {C, kv}, {C, kv}, {q, C}, {C, F}, {C, F}, {F, C}}};
  const char* names[kLinears] = {"q", "k", "v", "o", "gate", "up", "down"};
  for (int g = 0; g < kLinears; ++g) {
    if (!lora.targets_linear(Linear(g))) continue;
    const auto [in, out] = in_out[size_t(g)];
    if (lora.rank > std::min(in, out))
      throw InputError(fmt::format("--lora {} is past the width of {}'s {} layer ({} x {}): a rank is at most {} "
                                   "there; give a rank of at most {} or leave {} out of --lora-targets",
                                   lora.rank, m.name, names[g], out, in, std::min(in, out), std::min(in, out),
                                   names[g]));
  }
}

std::string lora_summary(const ModelSpec& m, const LoraSpec& lora) {
  if (!lora.enabled()) return {};
  const double n = double(lora_params(m, lora)), total = double(m.param_count());
  return fmt::format("LoRA r {}, alpha {:g}{} on {}: {} trainable of {} parameters ({:.2f}%)", lora.rank, lora.alpha,
                     lora.dropout > 0 ? fmt::format(", dropout {:g}", lora.dropout) : "", lora.targets_text(),
                     count_text(n), count_text(total), 100.0 * n / total);
}

double model_flops_per_step(const ModelSpec& m, const RunSpec& run) {
  if (!run.lora.enabled()) return model_flops_per_token(m, run.seq) * double(run.tokens_per_step());
  const double C = double(m.hidden);
  const auto io = linear_io(m);
  double adapters = 0;
  for (int g = 0; g < kLinears; ++g)
    if (run.lora.targets_linear(Linear(g))) adapters += 6.0 * double(run.lora.rank) * io[size_t(g)];
  const double per_token = 4.0 * double(m.flop_params()) + 12.0 * C * attention_widths(m, run.seq) +
                           double(m.layers) * adapters;
  return per_token * double(run.tokens_per_step());
}

double mfu(double model_flops_per_second, int64_t devices, double peak_flops_per_device) {
  return model_flops_per_second / (double(devices) * peak_flops_per_device);
}

}  // namespace weft
