// FLOP accounting and MFU, exactly as the design states:
//   model FLOPs per token = 6 N + 12 L C T
// with N = ModelSpec::flop_params() (every matmul weight: the blocks, the final
// norm and the LM head, but not the input-embedding lookup) and T the sequence
// length (the attention score and value matmuls, counted without the causal
// halving). Recomputation is not counted.
//
// Chunked attention (Llama 4's RoPE layers, ModelSpec::attention.
// attention_chunk) attends to at most `chunk` keys a query, so such a layer
// counts min(T, chunk) in place of T: 12 L C T becomes 12 C times the sum
// of each layer's width (attention_widths). A model without chunks, or a
// sequence within one chunk, counts 12 L C T as before.
//
// LoRA (RunSpec::lora) trains only adapters: the frozen weights need no
// weight gradients, so a token costs 4 N (forward and input gradients) plus
// the attention's 12 L C T plus each adapter's 6 r (in + out) per targeted
// layer (two forward GEMMs, four backward), the FLOPs the run needs. MFU
// against 6 N would overstate a LoRA run's utilisation by half.
#pragma once

#include <cstdint>
#include <string>

#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft {

double model_flops_per_token(const ModelSpec& m, int64_t seq);
// The keys a query attends to, summed over the layers, as the model FLOPs
// count them (no causal halving): seq in a layer over the whole sequence,
// min(seq, attention_chunk) in a chunked one. L seq without chunks.
double attention_widths(const ModelSpec& m, int64_t seq);
// The (query, key) pairs a sequence's causal attention visits, averaged
// over the layers, as a fraction of the whole causal seq (seq + 1) / 2:
// 1 without chunks; a chunked layer visits chunk (chunk + 1) / 2 per whole
// chunk and r (r + 1) / 2 for the r positions of the last, partial one.
// The cost model prices the flash kinds' work by it.
double attention_pair_fraction(const ModelSpec& m, int64_t seq);
// LoRA's trainable parameters: the adapters, L x sum over targets of r (in + out).
int64_t lora_params(const ModelSpec& m, const LoraSpec& lora);
// Which N MFU's 6N counts, for headers: "6N + 12 L C T model FLOPs a token,
// N = 7.50B (the parameters but the input embedding's 525.3M: a lookup, no
// matmul; 8.03B in all)".
std::string mfu_flops_text(const ModelSpec& m);
// InputError when `lora`'s rank is past the width of a targeted layer of
// `m` (the rank of an adapter pair B A is at most min(in, out): beyond it
// the adapters are larger than the weight they adapt), naming the layer;
// and for an MoE model's FFN targets (its experts: not computed yet).
void lora_check_model(const ModelSpec& m, const LoraSpec& lora);
// "LoRA r 16, alpha 32 on q,k,v,o,gate,up,down: 207.1M trainable of 70.55B
// parameters (0.29%)"; empty without LoRA. The run headers, the dry-run and
// the reports print it.
std::string lora_summary(const ModelSpec& m, const LoraSpec& lora);
double model_flops_per_step(const ModelSpec& m, const RunSpec& run);
// MFU = model FLOPs per second / (devices x dense peak per device).
double mfu(double model_flops_per_second, int64_t devices, double peak_flops_per_device);

}  // namespace weft
