// Llama 4's stored form of its parameters, both ways. Its published
// checkpoints (and transformers' Llama4ForCausalLM) keep each MoE layer's
// routed experts fused, "feed_forward.experts.gate_up_proj" (E, C, 2F), gate
// in columns [0, F) and up in [F, 2F), and "feed_forward.experts.down_proj"
// (E, F, C): each expert's weights transposed against weft's per-expert
// (F, C) and (C, F). Its q and k projections pair rotary dimensions as
// neighbours (2i, 2i + 1) within each head, where weft (and the Hugging
// Face Llama) pairs (i, i + D/2): their rows are permuted within each head,
// and attention computes the same, since queries and keys are permuted
// alike. Elements are moved, never converted: any dtype goes through.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/safetensors.h"

namespace weft::checkpoint {

// The stored tensor a parameter of hf_param_table(m) is read from, and its
// shape; std::nullopt where the parameter is stored under its own name and
// shape (every parameter of another family's model).
struct Llama4Source {
  std::string tensor;
  std::vector<int64_t> shape;
};
std::optional<Llama4Source> llama4_source(const ModelSpec& m, const ParamInfo& p);

// The rows of a q or k projection, or of its LoRA B (PEFT's adapters act in
// the base's row order), from weft's pairs to Meta's, or back.
std::vector<std::byte> llama4_rows_to_meta(const TensorRef& t, int64_t head_dim);
std::vector<std::byte> llama4_rows_from_meta(const TensorRef& t, int64_t head_dim);

// Parameter p in weft's form from its stored tensor t (llama4_source's).
std::vector<std::byte> llama4_from_stored(const ModelSpec& m, const ParamInfo& p, const TensorRef& t);

// The other way: `tensors`, the parameters of hf_param_table(m) in weft's
// form under their names (any order; every expert of a layer in one dtype),
// as Llama 4 stores them, in the same order, each layer's fused pair where
// its first expert tensor was. The bytes of converted tensors go into
// `buffers`, which must outlive the result. InternalError for an expert
// tensor whose layer lacks one of the others, or has another dtype.
std::vector<TensorRef> llama4_to_stored(const ModelSpec& m, const std::vector<TensorRef>& tensors,
                                        std::vector<std::vector<std::byte>>& buffers);

}  // namespace weft::checkpoint
