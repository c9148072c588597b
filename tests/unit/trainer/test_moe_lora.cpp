// LoRA on Mixture-of-Experts models against the `peft` package:
// tools/moe_lora_fixtures.py put adapters on every linear layer and on the
// routed experts' 3-D tensors (target_parameters experts.gate_up_proj and
// experts.down_proj) of three tiny transformers models of
// tests/fixtures/hf_moe (Mixtral; Qwen3-MoE with a dense layer; Llama 4
// with a shared expert, dense layers and its experts stored (E, in, out)),
// A and B drawn at random, saved them with save_pretrained and recorded in
// fp64 the loss, the logits of window 0 and every adapter tensor's
// gradient as PEFT stores it. weft opens the same base and adapter folders
// (state_init, state_lora_init: the experts' packed pairs unpacked per
// expert), computes one forward and backward on one rank in fp32 and fp64
// and must agree, its experts' gradients packed back into PEFT's form. The
// adapters written back (peft_write) are PEFT's file again.
//
// Bounds, test_lora.cpp's for the same reason (transformers computes RoPE
// in fp32 whatever the model's dtype): the loss within 1e-5, every adapter
// gradient within 1e-4 (relative L2), the logits by test_golden.cpp's rule.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "golden/golden_file.h"
#include "trainer/checkpoint/llama4_form.h"
#include "trainer/checkpoint/peft.h"
#include "trainer/model/llama.h"
#include "trainer/optim/optimizer.h"
#include "trainer/state_io.h"
#include "../test_util.h"
#include "lora_test_util.h"

namespace weft::trainer {
namespace {

constexpr double kEps32 = 1.1920928955078125e-07;

std::string fixtures(const std::string& rest) { return std::string(WEFT_FIXTURES_DIR) + "/" + rest; }

const test::GoldenFile& reference() {
  static const test::GoldenFile f = test::golden_file_read(fixtures("hf_moe_lora/reference.bin"));
  return f;
}
const test::GoldenFile& tokens_file() {
  static const test::GoldenFile f = test::golden_file_read(fixtures("hf_moe/reference.bin"));
  return f;
}

// The base of hf_moe/<name> without its balancing loss (the reference's
// objective is the cross-entropy alone).
ModelSpec without_aux(ModelSpec m) {
  m.moe.aux_loss_coef = 0;
  return m;
}

// One rank holding hf_moe/<name> with hf_moe_lora/<name>/adapter, in Elem.
template <typename Elem>
struct MoeLoraRun {
  using A = kernels::Acc<Elem>;
  checkpoint::Pretrained base;
  ModelSpec m;
  checkpoint::PeftAdapter adapter;
  int64_t T, W;
  memory::Arena arena;
  parallel::ProcessGroups groups = parallel::single_process_groups();
  LlamaStage<Elem> stage;
  Optimizer<Elem> optim;


  explicit MoeLoraRun(const std::string& name)
      : base(checkpoint::pretrained_open(
            fixtures(reference().header["folders"][name]["base"].template get<std::string>()))),
        m(without_aux(base.model)),
        adapter(checkpoint::peft_open(fixtures("hf_moe_lora/" + name + "/adapter"), m)),
        T(reference().header["scalars"]["seq"].get<int64_t>()),
        W(reference().header["scalars"]["windows"].get<int64_t>()),
        stage(m, RunSpec{.seq = T, .global_batch = W, .precision = Precision::fp32, .lora = adapter.lora},
              Layout::parse(fmt::format("mb{}", W)), 0, device_preset("cpu"), arena, groups),
        optim(stage, OptimConfig{}) {
    if constexpr (std::is_same_v<Elem, float>) {  // the trainer's own path
      state_init(base, stage, optim);
      state_lora_init(adapter, stage, optim);
    } else {  // the same values, widened
      const StageParams& sp = stage.params();
      stage.set_frozen_weights(
          test_lora::gather<A>(sp.frozen, sp.frozen_elements, [&](const std::string& n) -> const auto& { return base.param(n); }));
      optim.weights_set(
          test_lora::gather<A>(sp.specs, sp.elements, [&](const std::string& n) -> const auto& { return adapter.tensor(n); }));
    }
  }
};

template <typename Elem>
void against_peft(const std::string& name, std::string& table) {
  SCOPED_TRACE(fmt::format("{} in {} bits", name, sizeof(Elem) * 8));
  MoeLoraRun<Elem> r(name);
  const ModelSpec& m = r.m;
  const int64_t T = r.T, W = r.W;
  const auto& tokens = tokens_file().at("tokens").i32();
  std::vector<int32_t> inputs, targets;
  for (int64_t w = 0; w < W; ++w) {
    inputs.insert(inputs.end(), tokens.begin() + w * T, tokens.begin() + w * T + T);
    targets.insert(targets.end(), tokens.begin() + w * T + 1, tokens.begin() + w * T + T + 1);
  }
  // Adapters on the routed experts, the shared expert and the dense layers
  // where the model has them, all trainable; the base frozen.
  ASSERT_TRUE(r.stage.params().expert_gate_up && r.stage.params().expert_down);
  std::vector<Elem> logits;
  r.stage.capture_logits(&logits);
  const double scale = 1.0 / double(W * T);
  r.stage.zero_grads();
  r.stage.forward(0, inputs.data(), targets.data(), scale);
  const double loss = r.stage.take_loss() * scale;
  r.stage.backward(0, 0, true);
  r.stage.finish_dp_reduction();
  r.stage.reduce_replicated_grads();
  r.stage.capture_logits(nullptr);
  const double want = reference().at(name + ".loss").f64()[0];
  EXPECT_LE(std::fabs(loss - want) / want, 1e-5) << loss << " vs " << want;
  const auto& want_logits = reference().at(name + ".logits0").f64();
  const double logit_err = test_lora::rel_l2(logits.data(), want_logits);
  EXPECT_LT(logit_err, 64 * kEps32 * 4 * double(m.layers));
  // Every adapter tensor PEFT stored: by name, the experts' packed from
  // weft's per-expert gradients.
  const auto prefix = std::string(checkpoint::kPeftPrefix);
  std::map<std::string, const ParamSpec*> spec_of;
  for (const auto& p : r.stage.params().specs) spec_of.emplace(p.name, &p);
  const auto grad_f32 = [&](const ParamSpec& p) {
    const auto* g = r.stage.grad(p);
    return std::vector<float>(g, g + p.local_elements());
  };
  double worst = 0;
  int64_t compared = 0;
  const auto compare = [&](const std::string& peft_name, const auto* got) {
    const auto& want_grad = reference().at(name + ".grad." + prefix + peft_name).f64();
    const double e = test_lora::rel_l2(got, want_grad);
    EXPECT_LE(e, 1e-4) << peft_name;
    worst = std::max(worst, e);
    ++compared;
  };
  const bool llama4 = checkpoint::ffn_naming(m) == checkpoint::FfnNaming::llama4;
  for (const auto& p : r.stage.params().specs) {
    if (p.expert >= 0) continue;
    // Llama 4's q and k B rows: PEFT's in Meta's rotary pairs, as its base's.
    const bool qk_b = (p.kind == checkpoint::ParamKind::q_proj || p.kind == checkpoint::ParamKind::k_proj) &&
                      p.name.find(".lora_B.") != std::string::npos;
    if (!(llama4 && qk_b)) {
      compare(p.name, r.stage.grad(p));
      continue;
    }
    std::vector<float> g = grad_f32(p);
    const auto meta = checkpoint::llama4_rows_to_meta({p.name, checkpoint::DType::F32, {p.rows, p.cols}, g.data()},
                                                      m.head_dim);
    compare(p.name, reinterpret_cast<const float*>(meta.data()));
  }
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    if (!m.moe_layer(layer)) continue;
    for (const auto site : {checkpoint::ExpertLora::gate_up, checkpoint::ExpertLora::down})
      for (const bool b : {false, true}) {
        // PEFT's lora_A packs weft's A, or B where the experts are stored (E, in, out).
        const bool weft_b = llama4 ? !b : b;
        std::vector<std::vector<float>> grads;
        std::vector<const float*> ptrs;
        for (int64_t e = 0; e < m.moe.experts; ++e)
          grads.push_back(grad_f32(*spec_of.at(checkpoint::lora_expert_name(m, site, layer, e, weft_b))));
        for (const auto& g : grads) ptrs.push_back(g.data());
        const auto packed =
            checkpoint::peft_expert_pack(m, site, checkpoint::lora_site_rank(r.adapter.lora, site), b, ptrs);
        compare(checkpoint::peft_expert_name(m, r.adapter.lora, site, layer, b), packed.data());
      }
  }
  const auto& listed = reference().header["folders"][name]["tensors"];
  EXPECT_EQ(compared, int64_t(listed.size())) << "every tensor PEFT saved is compared";
  table += fmt::format("{:<10} {:>4} {:>13.10f} {:>13.10f} {:>9.2e} {:>9.2e} {:>9.2e} {:>4}\n", name,
                       sizeof(Elem) * 8, loss, want, std::fabs(loss - want) / want, logit_err, worst, compared);
}

TEST(MoeLora, MatchesPeft) {
  std::string table = fmt::format("{:<10} {:>4} {:>13} {:>13} {:>9} {:>9} {:>9} {:>4}\n", "folder", "bits",
                                  "weft loss", "peft (fp64)", "rel dev", "logits", "grad rel", "n");
  for (const char* name : {"mixtral", "qwen3_moe", "llama4", "qwen3_moe_usual"}) {
    against_peft<double>(name, table);
    against_peft<float>(name, table);
  }
  std::printf("%s", table.c_str());
}

// Written back by peft_write, the adapters are PEFT's file again: the same
// tensor names, shapes and values (the experts' packed the way PEFT packs
// them), and they read back to the same per-expert tensors.
TEST(MoeLora, WritesBackPeftsFile) {
  for (const char* name : {"mixtral", "qwen3_moe", "llama4", "qwen3_moe_usual"}) {
    SCOPED_TRACE(name);
    MoeLoraRun<float> r(name);
    const auto& specs = r.stage.params().specs;
    std::vector<std::vector<float>> values;
    std::vector<checkpoint::TensorRef> tensors;
    values.reserve(specs.size());
    std::vector<std::vector<std::byte>> meta;
    for (const auto& p : specs) {
      values.emplace_back(size_t(p.rows * p.cols));
      checkpoint::tensor_read_f32_block(r.adapter.tensor(p.name), 0, p.rows, 0, p.cols, values.back().data());
      tensors.push_back({p.name, checkpoint::DType::F32, {p.rows, p.cols}, values.back().data()});
      // Llama 4's q and k B rows go back to Meta's rotary pairs, as weft export --lora writes them.
      if (checkpoint::ffn_naming(r.m) == checkpoint::FfnNaming::llama4 && p.name.find(".lora_B.") != std::string::npos &&
          (p.kind == checkpoint::ParamKind::q_proj || p.kind == checkpoint::ParamKind::k_proj))
        tensors.back().data = meta.emplace_back(checkpoint::llama4_rows_to_meta(tensors.back(), r.m.head_dim)).data();
    }
    test::TempDir dir;
    const std::string out = dir.path("peft");
    checkpoint::peft_write(out, r.m, r.adapter.lora, "", tensors, {});
    const checkpoint::SafetensorsFile mine(out + "/" + checkpoint::kPeftWeightsFile);
    const auto& theirs = r.adapter.file;
    ASSERT_EQ(mine.tensors().size(), theirs.tensors().size());
    for (const auto& t : theirs.tensors()) {
      const checkpoint::TensorRef* u = mine.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_EQ(u->shape, t.shape) << t.name;
      std::vector<float> a(size_t(t.elements())), b(a.size());
      checkpoint::to_f32(t.dtype, t.data, a.data(), t.elements());
      checkpoint::to_f32(u->dtype, u->data, b.data(), u->elements());
      EXPECT_EQ(a, b) << t.name;  // fp64 values rounded to fp32 on both sides
    }
    const auto back = checkpoint::peft_open(out, r.m);
    EXPECT_EQ(back.lora, r.adapter.lora);
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<float> v(values[i].size());
      checkpoint::tensor_read_f32_block(back.tensor(specs[i].name), 0, specs[i].rows, 0, specs[i].cols, v.data());
      EXPECT_EQ(v, values[i]) << specs[i].name;
    }
  }
}

// What PEFT makes of a Qwen3-MoE's usual config (gate_proj, up_proj and
// down_proj among target_modules, no target_parameters): the experts'
// gate_up_proj at twice the rank and alpha, read as --lora-gate-up-rank.
TEST(MoeLora, ReadsTheExpertsGateUpAtItsOwnRank) {
  const auto qwen3 = checkpoint::pretrained_open(fixtures("hf_moe_lora/qwen3_moe/base"));
  const auto usual = checkpoint::peft_open(fixtures("hf_moe_lora/qwen3_moe_usual/adapter"), qwen3.model);
  EXPECT_EQ(usual.lora.rank, 2);
  EXPECT_EQ(usual.lora.gate_up_rank, 4);
  EXPECT_EQ(usual.lora.experts_gate_up_alpha(), 6);
  EXPECT_EQ(usual.lora.targets_text(), "q,k,v,o,gate,up,down");
}

// PEFT's settings weft cannot honour are refused by name: patterns past
// the experts' gate_up_proj or at another scale, dense layers adapted
// otherwise than the experts, other parameters, a dense model.
TEST(MoeLora, RefusesWhatItCannotReadAsPeftMeansIt) {
  const auto qwen3 = checkpoint::pretrained_open(fixtures("hf_moe_lora/qwen3_moe/base"));
  const std::string usual = fixtures("hf_moe_lora/qwen3_moe_usual/adapter");
  test::TempDir patterns;
  const auto with = [&](const std::string& label, const nlohmann::json& rank, const nlohmann::json& alpha) {
    const std::string d = patterns.path(label);
    std::filesystem::create_directories(d);
    std::filesystem::copy_file(usual + "/" + checkpoint::kPeftWeightsFile, d + "/" + checkpoint::kPeftWeightsFile);
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(usual + "/" + checkpoint::kPeftConfigFile));
    cfg["rank_pattern"] = rank;
    cfg["alpha_pattern"] = alpha;
    std::ofstream(d + "/" + checkpoint::kPeftConfigFile) << cfg.dump(2);
    return d;
  };
  WEFT_EXPECT_THROW_MSG(checkpoint::peft_open(with("scale", {{R"(.*\.gate_up_proj)", 4}}, {{R"(.*\.gate_up_proj)", 3}}),
                                              qwen3.model),
                        InputError, "a scale of 0.75 beside the others' 1.5");
  WEFT_EXPECT_THROW_MSG(
      checkpoint::peft_open(with("layers", {{"q_proj", 4}}, nlohmann::json::object()), qwen3.model), InputError,
      "rank_pattern {\"q_proj\":4} sets ranks or alphas per layer");
  // hf_moe's qwen3_moe has a dense layer, which this adapter leaves alone
  // while adapting the experts.
  const auto dense_layer = checkpoint::pretrained_open(fixtures("hf_moe/qwen3_moe"));
  const std::string src = fixtures("hf_moe_lora/qwen3_moe/adapter");
  WEFT_EXPECT_THROW_MSG(checkpoint::peft_open(src, dense_layer.model), InputError, "not the gate_proj",
                        "exactly when the experts'");
  test::TempDir dir;
  // Nor can PEFT hold weft's adapters on such a model's dense FFN: export
  // --lora refuses it (and writes nothing).
  const LoraSpec all{.rank = 2, .alpha = 3, .dropout = 0, .targets = LoraSpec::kAllTargets};
  WEFT_EXPECT_THROW_MSG(checkpoint::peft_write(dir.path("x"), dense_layer.model, all, "", {}, {}), InputError,
                        "1 dense layers beside its MoE ones", "export --merge");
  EXPECT_FALSE(std::filesystem::exists(dir.path("x")));
  const std::string other = dir.path("other");
  std::filesystem::create_directories(other);
  std::filesystem::copy_file(src + "/" + checkpoint::kPeftWeightsFile, other + "/" + checkpoint::kPeftWeightsFile);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/" + checkpoint::kPeftConfigFile));
  cfg["target_parameters"] = nlohmann::json::array({"experts.gate_up_proj", "experts.down_proj", "mlp.gate.weight"});
  std::ofstream(other + "/" + checkpoint::kPeftConfigFile) << cfg.dump(2);
  WEFT_EXPECT_THROW_MSG(checkpoint::peft_open(other, qwen3.model), InputError,
                        "target_parameters names 'mlp.gate.weight'");
  const auto dense = checkpoint::pretrained_open(fixtures("hf_init/untied"));
  WEFT_EXPECT_THROW_MSG(checkpoint::peft_open(src, dense.model), InputError, "target_parameters names", "has none");
}

}  // namespace
}  // namespace weft::trainer
