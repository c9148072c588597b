// The single-rank MoE stage's tests share these: a tiny model of each
// family (Mixtral, Qwen3-MoE, Llama 4) and a stage that takes a step's
// objective with its gradients, or the objective and routes alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/model_spec.h"
#include "stage_test_util.h"

namespace weft::trainer::test_moe {

using test_stage::Batch;

// V=96 C=32 H=4 H_kv=2 D=8, 3 layers, 4 experts of width 24, top-2.
inline ModelSpec moe_model(const char* family, int64_t step = 1) {
  ModelSpec m = model_preset("tiny-test");
  m.name = fmt::format("tiny-{}", family);
  m.layers = 3;
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_intermediate = 24;
  m.moe.step = step;
  m.moe.aux_loss_coef = 0.3;  // large, so its gradient matters
  const std::string f = family;
  if (f == "qwen3") {  // scores not renormalised, the per-layer loss, RMS norms of q and k
    m.moe.weights = RouterWeights::scores;
    m.moe.aux_scope = AuxLossScope::per_layer;
    m.attention.qk_norm = QkNorm::rms;
  } else if (f == "llama4") {  // sigmoid, top-1 on the input, a shared expert; NoPE, temperature, L2 norm
    m.attention.qk_norm = QkNorm::l2;
    m.attention.nope_interval = 2;       // layer 1 (and 3) without RoPE
    m.attention.temperature_scale = 0.5;
    m.attention.temperature_floor = 2;   // the factor grows every 2 positions
    m.attention.attention_chunk = 64;    // past every test's sequence
    m.moe.top_k = 1;
    m.moe.score = RouterScore::sigmoid;
    m.moe.weights = RouterWeights::scores;
    m.moe.gate_on = GateOn::input;
    m.moe.shared_intermediate = 16;
  }
  m.validate();
  return m;
}

template <typename Elem>
struct Harness : test_stage::Stage<Elem> {
  using test_stage::Stage<Elem>::Stage;
  using test_stage::Stage<Elem>::stage;
  // The step's objective (mean token loss plus the mean balancing loss),
  // gradients accumulated over the micro-batches.
  double step(const Batch& b, int64_t micro_batches, double scale_to = 0) {
    stage.zero_grads();
    const int64_t rows = int64_t(b.tokens.size()) / micro_batches;
    const double scale = scale_to > 0 ? scale_to : 1.0 / double(b.tokens.size());
    double loss = 0;
    for (int64_t i = 0; i < micro_batches; ++i) {
      stage.forward(0, b.tokens.data() + i * rows, b.targets.data() + i * rows, scale);
      loss += stage.take_loss();
      stage.backward(0);
    }
    return (loss + stage.take_aux_loss()) * scale;
  }
  // The same objective, forwards only; and every MoE layer's choices.
  double objective(const Batch& b, int64_t micro_batches, std::vector<int32_t>* routes) {
    const int64_t rows = int64_t(b.tokens.size()) / micro_batches;
    const double scale = 1.0 / double(b.tokens.size());
    double loss = 0;
    for (int64_t i = 0; i < micro_batches; ++i) {
      stage.forward(0, b.tokens.data() + i * rows, b.targets.data() + i * rows, scale);
      loss += stage.take_loss();
      if (routes) {
        auto& t = stage.tensors();
        const int32_t* e = t.template get<int32_t>("layer.moe.experts", 0);
        routes->insert(routes->end(), e, e + t.count("layer.moe.experts") * t.elements("layer.moe.experts"));
      }
    }
    return (loss + stage.take_aux_loss()) * scale;
  }
};

}  // namespace weft::trainer::test_moe
