// A model and optimizer state of random values for checkpoint tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "trainer/checkpoint/checkpoint.h"

namespace weft::checkpoint::test {

struct TrainState {
  ModelSpec model;
  std::vector<ParamInfo> table;
  DType weight_dtype = DType::F32;
  std::vector<std::vector<float>> weights, exp_avg, exp_avg_sq;  // by table entry
  std::vector<std::vector<uint16_t>> weights_bf16;               // when weight_dtype is BF16

  // Model tensors; in reverse table order to show that save does not need
  // the table's order.
  std::vector<TensorRef> model_tensors() const {
    std::vector<TensorRef> out;
    for (size_t i = table.size(); i-- > 0;) {
      const void* data = weight_dtype == DType::BF16
                             ? static_cast<const void*>(weights_bf16[i].data())
                             : static_cast<const void*>(weights[i].data());
      out.push_back({table[i].name, weight_dtype, table[i].shape, data});
    }
    return out;
  }
  // Adam moments, plus the fp32 master weights when the model is stored in bf16.
  std::vector<TensorRef> optimizer_tensors() const {
    std::vector<TensorRef> out;
    for (size_t i = 0; i < table.size(); ++i) {
      out.push_back({optim_state_name(OptimState::exp_avg, table[i].name), DType::F32,
                     table[i].shape, exp_avg[i].data()});
      out.push_back({optim_state_name(OptimState::exp_avg_sq, table[i].name), DType::F32,
                     table[i].shape, exp_avg_sq[i].data()});
      if (weight_dtype == DType::BF16)
        out.push_back({optim_state_name(OptimState::master, table[i].name), DType::F32,
                       table[i].shape, weights[i].data()});
    }
    return out;
  }
};

inline TrainState make_state(const std::string& preset, uint32_t seed,
                             DType weight_dtype = DType::F32) {
  TrainState s;
  s.model = model_preset(preset);
  s.table = hf_param_table(s.model);
  s.weight_dtype = weight_dtype;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const auto& p : s.table) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    auto fill = [&](float scale) {
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = normal(rng) * scale;
      return v;
    };
    s.weights.push_back(fill(1.0f));
    s.exp_avg.push_back(fill(0.1f));
    auto sq = fill(0.01f);
    for (auto& x : sq) x = x * x;
    s.exp_avg_sq.push_back(std::move(sq));
    std::vector<uint16_t> h(static_cast<size_t>(n));
    f32_to_bf16(s.weights.back().data(), h.data(), n);
    s.weights_bf16.push_back(std::move(h));
  }
  return s;
}

inline Manifest make_manifest(const ModelSpec& model, int64_t step) {
  Manifest m;
  m.step = step;
  m.data_position = step * 32;
  m.rng_state = {0x0123456789abcdefull, 0xffffffffffffffffull, 0, 42};
  m.optimizer.lr = 3e-4;
  m.optimizer.weight_decay = 0.1;
  m.optimizer.grad_clip = 1.0;
  m.optimizer.step = step;
  m.layout = Layout::parse("tp2-pp2-dp1-mb1-sp-ckpt:full");
  m.model = model;
  m.run = {{"seq", 64}, {"global_batch", 32}, {"seed", 1234}, {"schedule", "cosine"}};
  m.bos_token_id = 1;
  m.eos_token_id = 2;
  return m;
}

}  // namespace weft::checkpoint::test
