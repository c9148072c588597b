#include "trainer/lora_export.h"

#include <map>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "trainer/checkpoint/export_hf.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/llama4_form.h"
#include "trainer/checkpoint/peft.h"
#include "trainer/model/params.h"
#include "trainer/state_io.h"

namespace weft::trainer {

namespace {

using checkpoint::OptimState;

// The checkpoint's LoRA settings; InputError for a full model's checkpoint.
LoraSpec lora_of(const checkpoint::Checkpoint& ck) {
  const LoraSpec l = checkpoint::checkpoint_lora(ck.manifest);
  if (!l.enabled())
    throw InputError(fmt::format("checkpoint {} trains every weight: it holds no LoRA adapters (weft export "
                                 "without --lora writes the model)",
                                 ck.dir));
  return l;
}

// A stored parameter widened to fp32: the master copy where there is one.
std::vector<float> param_f32(const checkpoint::Checkpoint& ck, const std::string& name) {
  const checkpoint::TensorRef* t = ck.optimizer.find(checkpoint::optim_state_name(OptimState::master, name));
  if (t == nullptr || t->dtype != checkpoint::DType::F32) t = &ck.model.at(name);
  std::vector<float> out(size_t(t->elements()));
  checkpoint::to_f32(t->dtype, t->data, out.data(), t->elements());
  return out;
}

// The linear layer of a block parameter kind (a shared or routed expert's
// gate, up or down included), or -1.
int linear_of(checkpoint::ParamKind k) {
  using checkpoint::ParamKind;
  switch (k) {
    case ParamKind::q_proj: return int(Linear::q);
    case ParamKind::k_proj: return int(Linear::k);
    case ParamKind::v_proj: return int(Linear::v);
    case ParamKind::o_proj: return int(Linear::o);
    case ParamKind::gate_proj:
    case ParamKind::shared_gate:
    case ParamKind::expert_gate: return int(Linear::gate);
    case ParamKind::up_proj:
    case ParamKind::shared_up:
    case ParamKind::expert_up: return int(Linear::up);
    case ParamKind::down_proj:
    case ParamKind::shared_down:
    case ParamKind::expert_down: return int(Linear::down);
    default: return -1;
  }
}

// The adapter pair of a base parameter's LoRA, whole, and the first row of
// B that is its (a routed expert's up: the second half of gate_up's B).
struct AdapterOf {
  std::vector<float> a, b;
  int64_t b_row = 0;
  int64_t rank = 0;  // (the experts' gate_up's may be their own; alpha / rank is every adapter's)
};

AdapterOf adapter_of(const checkpoint::Checkpoint& ck, const ModelSpec& m, const checkpoint::ParamInfo& info, Linear g) {
  using checkpoint::ExpertLora;
  const LoraSpec lora = checkpoint::checkpoint_lora(ck.manifest);
  if (info.expert < 0)
    return {param_f32(ck, checkpoint::lora_param_name(m, g, info.layer, false)),
            param_f32(ck, checkpoint::lora_param_name(m, g, info.layer, true)), 0, lora.rank};
  const ExpertLora site = g == Linear::down ? ExpertLora::down : ExpertLora::gate_up;
  return {param_f32(ck, checkpoint::lora_expert_name(m, site, info.layer, info.expert, false)),
          param_f32(ck, checkpoint::lora_expert_name(m, site, info.layer, info.expert, true)),
          g == Linear::up ? m.moe.expert_intermediate : 0, checkpoint::lora_site_rank(lora, site)};
}

}  // namespace

void lora_export_adapter(const std::string& checkpoint_dir, const std::string& out_dir) {
  const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(checkpoint_dir);
  const LoraSpec lora = lora_of(ck);
  const auto table = checkpoint::checkpoint_param_table(ck.manifest);
  std::vector<std::vector<float>> values;
  values.reserve(table.size());
  std::vector<checkpoint::TensorRef> tensors;
  // PEFT's adapters act in the base's row order: a Llama 4 model's q and k
  // B rows go to Meta's rotary pairs, as its base's do (llama4_form.h).
  const ModelSpec& m = ck.manifest.model;
  const bool meta_rows = checkpoint::ffn_naming(m) == checkpoint::FfnNaming::llama4;
  std::vector<std::vector<std::byte>> reordered;
  for (const auto& p : table) {
    values.push_back(param_f32(ck, p.name));
    checkpoint::TensorRef t{p.name, checkpoint::DType::F32, p.shape, values.back().data()};
    const bool qk_b = p.name == checkpoint::lora_param_name(Linear::q, p.layer, true) ||
                      p.name == checkpoint::lora_param_name(Linear::k, p.layer, true);
    if (meta_rows && qk_b) t.data = reordered.emplace_back(checkpoint::llama4_rows_to_meta(t, m.head_dim)).data();
    tensors.push_back(t);
  }
  const nlohmann::json base = ck.manifest.run.at("lora").value("base", nlohmann::json());
  const std::string base_path = base.is_object() ? base.value("path", std::string()) : std::string();
  checkpoint::peft_write(out_dir, m, lora, base_path, tensors, {checkpoint_dir, base_path});
}

void lora_export_merged(const std::string& checkpoint_dir, const std::string& out_dir) {
  const checkpoint::Checkpoint ck = checkpoint::load_checkpoint(checkpoint_dir);
  const LoraSpec lora = lora_of(ck);
  const ModelSpec& m = ck.manifest.model;
  const nlohmann::json base = ck.manifest.run.at("lora").value("base", nlohmann::json());
  const std::optional<checkpoint::Pretrained> src = lora_base_open(base, checkpoint_dir);
  if (src) checkpoint::pretrained_check(src->model, m, src->dir);
  // The base's parameters whole, in checkpoint order: from the folder, or
  // drawn from the seed as a one-rank stage draws them.
  const Layout one = Layout::parse("mb1");
  const RunSpec run{.seq = 1, .global_batch = 1, .precision = Precision::fp32, .lora = lora};
  const StageParams sp = stage_params(m, one, memory::stage_plan(m, run, one, 0), 0);
  std::map<std::string, const ParamSpec*> spec_of;
  for (const auto& p : sp.frozen) spec_of.emplace(p.name, &p);
  const uint64_t seed = base.value("seed", uint64_t{0});
  std::vector<std::vector<float>> values;
  std::vector<checkpoint::TensorRef> tensors;
  const auto table = checkpoint::hf_param_table(m);
  values.reserve(table.size());
  for (const auto& info : table) {
    std::vector<float>& w = values.emplace_back();
    const ParamSpec& p = *spec_of.at(info.name);
    w.resize(size_t(p.rows * p.cols));
    if (src) {
      checkpoint::tensor_read_f32_block(src->param(info.name), 0, p.rows, 0, p.cols, w.data());
    } else {
      const ParamInitDraw draw(p, seed);
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t c = 0; c < p.cols; ++c) w[size_t(r * p.cols + c)] = float(draw(r, c));
    }
    // W (out, in) += s B (out, r) A (r, in), in fp64.
    if (const int g = linear_of(info.kind); g >= 0 && lora.targets_linear(Linear(g))) {
      const AdapterOf ad = adapter_of(ck, m, info, Linear(g));
      const int64_t r = ad.rank, out = p.rows, in = p.cols;
      for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) {
          double sum = 0;
          for (int64_t k = 0; k < r; ++k)
            sum += double(ad.b[size_t((ad.b_row + i) * r + k)]) * double(ad.a[size_t(k * in + j)]);
          w[size_t(i * in + j)] = float(double(w[size_t(i * in + j)]) + lora.scale() * sum);
        }
    }
    tensors.push_back({info.name, checkpoint::DType::F32, info.shape, w.data()});
  }
  // The base folder is read, so never written: the run and every later
  // merge of it check the base's hash.
  hf_folder_write(out_dir, {checkpoint_dir, src ? src->dir : std::string()}, m, ck.manifest.bos_token_id,
                  ck.manifest.eos_token_id, tensors);
}

}  // namespace weft::trainer
