// The single-rank stage of a Mixture-of-Experts model: finite-difference
// gradients in float64 through the very same code (router and balancing
// loss included, for each router and gate of the three families), every
// checkpointing mode's gradients bit for bit, the capacity, the parameter
// tables, and the refusals of what it does not compute yet. The arena
// against the memory model and FP8 in the blocks: test_moe_stage_memory.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "memory/estimate.h"
#include "memory/shapes.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/export_hf.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/loop.h"
#include "trainer/model/llama.h"
#include "core/flops.h"
#include "tuner/cost.h"
#include "tuner/space.h"
#include "../test_util.h"
#include "moe_stage_util.h"
#include "stage_test_util.h"

namespace weft::trainer {
namespace {

using test_stage::Batch;
using test_stage::cpu;
using test_stage::random_batch;
using test_moe::Harness;
using test_moe::moe_model;

// Each parameter's gradient (two random elements of each) against the
// central difference of the objective, in float64 with weights larger than
// the 0.02 init; a draw that changes any token's choice of expert is skipped.
// Under LoRA (`lora`) the parameters are the adapters, and the frozen base
// gets the same spread.
void finite_differences(const ModelSpec& m, const char* layout, uint64_t seed, int64_t& checked, int64_t& skipped,
                        const LoraSpec& lora = {}) {
  RunSpec run{5, 2, Precision::fp32};
  run.lora = lora;
  Harness<double> h(m, run, Layout::parse(layout), seed);
  std::mt19937_64 rng = h.spread_weights(seed);
  if (lora.enabled()) {
    std::normal_distribution<double> nd(0.0, 0.3);
    for (int64_t i = 0; i < h.stage.frozen_elements(); ++i) h.stage.frozen_weights()[i] += nd(rng);
  }
  const Batch b = random_batch(2 * 5, m.vocab, seed + 1);
  h.step(b, 2);
  std::vector<double> grads(h.stage.grads(), h.stage.grads() + h.stage.param_elements());
  std::vector<int32_t> routes0;
  h.objective(b, 2, &routes0);
  for (const auto& p : h.stage.params().specs)
    for (int trial = 0; trial < 2; ++trial) {
      const int64_t i = p.offset + int64_t(rng() % uint64_t(p.local_elements()));
      double& w = h.stage.weights()[i];
      const double w0 = w, eps = 1e-5;
      std::vector<int32_t> r_up, r_down;
      w = w0 + eps;
      const double up = h.objective(b, 2, &r_up);
      w = w0 - eps;
      const double down = h.objective(b, 2, &r_down);
      w = w0;
      // A step that flips a token's choice of expert is not differentiable
      // there (nor, under a capacity, which choices drop): such a draw
      // proves nothing.
      if (r_up != routes0 || r_down != routes0) {
        ++skipped;
        continue;
      }
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grads[size_t(i)], fd, 1e-7 + 1e-5 * std::fabs(fd))
          << m.name << " " << layout << " " << p.name << " element " << i - p.offset;
      ++checked;
    }
}

TEST(MoeStage, FiniteDifferenceGradients) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  int64_t checked = 0, skipped = 0;
  for (const char* family : {"mixtral", "qwen3", "llama4"})
    for (const char* layout : {"mb1-attn:flash-norm:fused", "mb1-attn:materialized-norm:unfused-ckpt:full"})
      // step 2 makes layer 1 the only MoE layer ((i + 1) % 2), step 1 all three.
      finite_differences(moe_model(family, std::string(layout).find("full") != std::string::npos ? 2 : 1), layout,
                         seed, checked, skipped);
  EXPECT_LT(skipped, checked / 10) << checked << " checked";
}

// LoRA on every linear layer of an MoE model, the routed experts' fused
// gate_up and down adapters, the shared expert's and a dense layer's among
// them (step 2: layers 0 and 2 dense), with and without recomputation: each
// adapter's gradient against the central difference (B drawn nonzero, so
// A's gradient is not zero).
TEST(MoeStage, LoraOnTheExpertsFiniteDifferences) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  LoraSpec lora{.rank = 3, .alpha = 5, .dropout = 0, .targets = LoraSpec::kAllTargets};
  int64_t checked = 0, skipped = 0;
  for (const char* family : {"mixtral", "qwen3", "llama4"})
    for (const char* layout : {"mb1-attn:flash-norm:fused", "mb1-attn:materialized-ckpt:full", "mb1-ckpt:ffn"}) {
      ModelSpec m = moe_model(family, 2);
      m.layers = 3;
      finite_differences(m, layout, seed, checked, skipped, lora);
    }
  // The experts' gate_up at a rank of its own (PEFT's fused form).
  lora.gate_up_rank = 6;
  finite_differences(moe_model("qwen3", 1), "mb1-ckpt:ffn", seed, checked, skipped, lora);
  lora.gate_up_rank = 0;
  // The experts' down alone (no gate_up pair before it in each expert's).
  lora.targets = LoraSpec::parse_targets("o,down");
  finite_differences(moe_model("mixtral", 1), "mb1", seed, checked, skipped, lora);
  EXPECT_GT(checked, 300);
  EXPECT_LT(skipped, checked / 10) << checked << " checked";
}

// The balancing loss's gradient is there: with it the router's gradient
// differs from the one without it by the loss's own.
TEST(MoeStage, BalancingLossEntersTheObjective) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  ModelSpec m = moe_model("mixtral");
  const RunSpec run{6, 2, Precision::fp32};
  const Batch b = random_batch(2 * 6, m.vocab, seed);
  Harness<double> with(m, run, Layout::parse("mb1"), seed);
  const double j_with = with.step(b, 2);
  m.moe.aux_loss_coef = 0;
  Harness<double> without(m, run, Layout::parse("mb1"), seed);
  const double j_without = without.step(b, 2);
  // Balanced routing makes the global loss coef * k (each layer's c_e/T
  // sums to k, its mean scores to 1): near 0.3 * 2 at initialisation.
  EXPECT_GT(j_with - j_without, 0.3 * 2 * 0.9);
  EXPECT_LT(j_with - j_without, 0.3 * 2 * 1.5);
  const auto& router = with.stage.params().model(checkpoint::ParamKind::router, 0);
  double diff = 0;
  for (int64_t i = 0; i < router.local_elements(); ++i)
    diff += std::fabs(with.stage.grads()[router.offset + i] - without.stage.grads()[router.offset + i]);
  EXPECT_GT(diff, 0);
}

TEST(MoeStage, CheckpointingGivesBitIdenticalGradients) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  for (const char* family : {"mixtral", "qwen3", "llama4"}) {
    ModelSpec m = moe_model(family, 2);
    m.layers = 4;  // MoE layers 1 and 3, dense 0 and 2
    const RunSpec run{7, 4, Precision::fp32};
    const Batch b = random_batch(4 * 7, m.vocab, seed);
    Harness<float> ref(m, run, Layout::parse("mb2"), seed);
    const double loss = ref.step(b, 2);
    for (const char* ck : {"selective", "ffn", "full", "full@1", "ffn@3"}) {
      Harness<float> h(m, run, Layout::parse(fmt::format("mb2-ckpt:{}", ck)), seed);
      EXPECT_EQ(h.step(b, 2), loss) << family << " ckpt:" << ck;
      EXPECT_EQ(0, std::memcmp(h.stage.grads(), ref.stage.grads(), size_t(ref.stage.param_elements()) * sizeof(float)))
          << family << " ckpt:" << ck;
    }
  }
}

// A capacity: each expert keeps the first ceil(f x rows x k / E) choices of a
// micro-batch in token order, the rest drop (position -1) and are counted;
// the gradients are the capped objective's (finite differences, with the
// capacity binding), and a factor that cannot bind (E / k: no token takes an
// expert twice) changes nothing, bit for bit.
TEST(MoeStage, CapacityKeepsEachExpertsFirstChoices) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  int64_t checked = 0, skipped = 0;
  for (const char* family : {"mixtral", "qwen3", "llama4"}) {
    const ModelSpec m = moe_model(family);
    const RunSpec run{6, 4, Precision::fp32};
    const Batch b = random_batch(4 * 6, m.vocab, seed);
    Harness<float> dropless(m, run, Layout::parse("mb2"), seed);
    const double j0 = dropless.step(b, 2);
    ModelSpec loose = m;
    loose.moe.capacity_factor = double(m.moe.experts) / double(m.moe.top_k);
    Harness<float> unbound(loose, run, Layout::parse("mb2"), seed);
    EXPECT_EQ(unbound.step(b, 2), j0) << family;
    EXPECT_EQ(0, std::memcmp(unbound.stage.grads(), dropless.stage.grads(),
                             size_t(dropless.stage.param_elements()) * sizeof(float)))
        << family;
    std::vector<int64_t> none;
    unbound.stage.take_dropped(none);
    for (int64_t d : none) EXPECT_EQ(d, 0) << family;

    // Binding: one micro-batch of 24 rows, so the first layer's choices are
    // all the step's there.
    ModelSpec tight = m;
    tight.moe.capacity_factor = 0.5;
    Harness<float> h(tight, run, Layout::parse("mb4"), seed);
    const double j_tight = h.step(b, 1);
    const int64_t rows = 4 * 6, k = m.moe.top_k, E = m.moe.experts;
    const int64_t cap = int64_t(std::ceil(0.5 * double(rows * k) / double(E)));
    ASSERT_EQ(tight.moe.capacity(rows), cap);
    const auto& t = h.stage.tensors();
    const int32_t* expert = t.get<int32_t>("layer.moe.experts", 0);
    const int64_t* position = t.get<int64_t>("layer.moe.routing", 0);
    const int64_t* offsets = position + rows * k;
    std::vector<int64_t> kept(size_t(E), 0);
    int64_t dropped = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = expert[r * k + j];
        const int64_t pos = position[r * k + j];
        if (kept[size_t(e)] < cap) {
          // The expert's next row, in token order.
          EXPECT_EQ(pos, offsets[e] + kept[size_t(e)]) << family << " token " << r << " choice " << j;
          ++kept[size_t(e)];
        } else {
          EXPECT_EQ(pos, -1) << family << " token " << r << " choice " << j;
          ++dropped;
        }
      }
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(offsets[e + 1] - offsets[e], kept[size_t(e)]) << family;
    EXPECT_GT(dropped, 0) << family;  // 24 x k choices, at most E x cap kept
    std::vector<int64_t> counted;
    h.stage.take_dropped(counted);
    ASSERT_EQ(int64_t(counted.size()), m.layers);
    EXPECT_EQ(counted[0], dropped) << family;
    // The objective moved: dropped choices add nothing.
    Harness<float> free(m, run, Layout::parse("mb4"), seed);
    EXPECT_NE(j_tight, free.step(b, 1)) << family;

    // Gradients under a binding capacity (f 0.5 over 5 rows of top-k).
    tight.name += "-capacity";
    finite_differences(tight, "mb1", seed, checked, skipped);
  }
  EXPECT_LT(skipped, checked / 10) << checked << " checked";
}

// Every stage's parameters together are the model's, over pipeline splits
// of dense and MoE layers; and the checkpoint table names them as the
// family does.
TEST(MoeStage, ParameterTables) {
  for (const char* preset : {"tiny-moe", "mixtral-8x7b", "qwen3-30b-a3b", "llama4-maverick"}) {
    const ModelSpec m = model_preset(preset);
    const RunSpec run{128, 8, Precision::fp32};
    for (const char* layout : {"pp1", "pp2", "pp4-vpp2"}) {
      const Layout l = Layout::parse(layout);
      if (m.layers % (l.pp * l.vpp) != 0) continue;
      int64_t sum = 0;
      for (int64_t s = 0; s < l.pp; ++s)
        sum += memory::stage_param_elements(m, l, memory::stage_plan(m, run, l, s));
      // A tied or untied table: the embedding, and the head on the last stage.
      EXPECT_EQ(sum, m.param_count() + (l.pp > 1 && m.tied_embeddings ? m.embedding_params() : 0))
          << preset << " " << layout;
    }
    int64_t table = 0;
    for (const auto& p : checkpoint::hf_param_table(m)) {
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      table += n;
    }
    EXPECT_EQ(table, m.param_count()) << preset;
  }
  const ModelSpec tiny = model_preset("tiny-moe");
  const StageParams sp = stage_params(tiny, Layout::parse("pp1"), memory::stage_plan(tiny, {64, 2, Precision::fp32}, Layout::parse("pp1"), 0), 0);
  EXPECT_EQ(sp.model(checkpoint::ParamKind::router, 2).name, "model.layers.2.block_sparse_moe.gate.weight");
  EXPECT_EQ(sp.model(checkpoint::ParamKind::expert_up, 1, 7).name,
            "model.layers.1.block_sparse_moe.experts.7.w3.weight");
  EXPECT_EQ(sp.index(checkpoint::ParamKind::gate_proj, 0), -1);
  const ModelSpec qwen = model_preset("qwen3-30b-a3b");
  EXPECT_EQ(checkpoint::hf_param_name(qwen, checkpoint::ParamKind::expert_down, 3, 127),
            "model.layers.3.mlp.experts.127.down_proj.weight");
  EXPECT_EQ(checkpoint::hf_param_name(qwen, checkpoint::ParamKind::router, 3), "model.layers.3.mlp.gate.weight");
  const ModelSpec maverick = model_preset("llama4-maverick");
  EXPECT_EQ(checkpoint::hf_param_name(maverick, checkpoint::ParamKind::shared_down, 1),
            "model.layers.1.feed_forward.shared_expert.down_proj.weight");
  EXPECT_EQ(checkpoint::hf_param_name(maverick, checkpoint::ParamKind::gate_proj, 0),
            "model.layers.0.feed_forward.gate_proj.weight");
}

// Each MoE family's exported config.json reads back as the same model (the
// balancing loss's scope aside: a run's setting); what a family's class
// does not compute is refused by name.
TEST(MoeStage, ExportedConfigReadsBack) {
  ModelSpec mixtral = model_preset("tiny-moe");
  mixtral.intermediate = mixtral.moe.expert_intermediate;  // Mixtral's intermediate_size is the experts' width
  ModelSpec qwen3 = moe_model("qwen3", 2);  // layer 1 an MoE, 0 and 2 dense
  qwen3.moe.dense_layers = {};
  ModelSpec qwen3_listed = moe_model("qwen3");
  qwen3_listed.moe.dense_layers = {1};  // mlp_only_layers
  ModelSpec llama4 = moe_model("llama4", 2);
  llama4.moe.shared_intermediate = llama4.moe.expert_intermediate;  // Llama 4's are one width
  llama4.layers = 5;  // MoE layers 1 and 3, NoPE 1 and 3
  ModelSpec llama4_plain = llama4;  // every layer RoPE'd, no chunks, no norm
  llama4_plain.attention = AttentionVariant{};
  llama4_plain.moe.dense_layers = {3};  // moe_layers [1]
  for (const auto& [m, cls] : {std::pair{mixtral, "MixtralForCausalLM"}, {qwen3, "Qwen3MoeForCausalLM"},
                                {qwen3_listed, "Qwen3MoeForCausalLM"}, {llama4, "Llama4ForCausalLM"},
                                {llama4_plain, "Llama4ForCausalLM"}}) {
    SCOPED_TRACE(m.name);
    m.validate();
    const nlohmann::json j = checkpoint::hf_config_json(m, 1, 2);
    EXPECT_EQ(j["architectures"][0], cls);
    ModelSpec back = model_from_hf_config_json(j, "exported");
    ModelSpec want = m;
    want.moe.aux_scope = AuxLossScope::global;
    EXPECT_EQ(back.hash(), want.hash());
    EXPECT_EQ(back.moe, want.moe);
    EXPECT_EQ(back.attention, want.attention);
  }
  WEFT_EXPECT_THROW_MSG(checkpoint::hf_config_json(moe_model("mixtral", 2), 1, 2), InputError,
                        "tiny-mixtral as a MixtralForCausalLM", "2 of its 3 layers are dense");
  ModelSpec sigmoid = moe_model("mixtral");
  sigmoid.moe.score = RouterScore::sigmoid;
  WEFT_EXPECT_THROW_MSG(checkpoint::hf_config_json(sigmoid, 1, 2), InputError, "its router is sigmoid",
                        "the family's: softmax with renormalized weights");
  ModelSpec chunked = moe_model("qwen3");
  chunked.attention.attention_chunk = 8;
  WEFT_EXPECT_THROW_MSG(checkpoint::hf_config_json(chunked, 1, 2), InputError, "Qwen3MoeForCausalLM",
                        "it attends in chunks of 8");
  WEFT_EXPECT_THROW_MSG(checkpoint::hf_config_json(moe_model("llama4"), 1, 2), InputError,
                        "shared expert's width is 16, not the routed experts' 24");
  ModelSpec dense_nope = model_preset("tiny-test");
  dense_nope.attention.nope_interval = 2;
  WEFT_EXPECT_THROW_MSG(checkpoint::hf_config_json(dense_nope, 1, 2), InputError, "LlamaForCausalLM",
                        "its layers i with (i + 1) % 2 == 0 are NoPE");
  // A checkpoint of an MoE model is not another model's, though their
  // dense dimensions agree (tiny-moe is tiny's with experts); the balancing
  // loss's settings are the run's.
  const auto diffs = checkpoint::model_differences(model_preset("tiny-moe"), model_preset("tiny"));
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_NE(diffs[0].find("moe: checkpoint 8 experts of width 96, top-2"), std::string::npos) << diffs[0];
  ModelSpec other_loss = model_preset("tiny-moe");
  other_loss.moe.aux_loss_coef = 0.5;
  other_loss.moe.aux_scope = AuxLossScope::per_layer;
  EXPECT_TRUE(checkpoint::model_differences(model_preset("tiny-moe"), other_loss).empty());
}

TEST(MoeStage, RefusesWhatItDoesNotComputeYet) {
  const ModelSpec m = moe_model("mixtral");
  const RunSpec run{8, 4, Precision::fp32};
  const DeviceSpec d = cpu();
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("dp2-zero3-ckpt:full"), d));
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("tp2-sp-cp2"), d));
  // FP8 in the MoE blocks: every recipe on the CPU trainer, block scaling
  // under sp and cp too (MoeParity.Fp8BlockTilesDownTheTokensAcrossRanks);
  // a GPU refused by name.
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("tp2-sp-dp2-ep2-fp8:tensorwise"), d));
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("tp2-sp-dp2-ep2-etp2-fp8:delayed"), d));
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("tp2-dp2-ep2-etp2-fp8:blockwise"), d));
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("tp2-sp-fp8:blockwise"), d));
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("cp2-fp8:blockwise"), d));
  WEFT_EXPECT_THROW_MSG(require_moe_layout(m, run, Layout::parse("fp8:tensorwise"), device_preset("h100")),
                        InputError, "on a GPU");
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("pp2-vpp2"), d));  // the global loss's statistics travel
  RunSpec lora = run;
  lora.lora.rank = 4;
  lora.lora.alpha = 8;
  lora.lora.targets = 0b1111;  // q, k, v, o: the attention's
  EXPECT_NO_THROW(require_moe_layout(m, lora, Layout::parse("tp2-sp-dp2-ep2"), d));
  // FP8 with LoRA on the attention, and on the FFNs (their adapters read
  // the compute-type rows: MoeStage.Fp8UnderLoraTheAdaptersReadTheComputeType).
  EXPECT_NO_THROW(require_moe_layout(m, lora, Layout::parse("tp2-sp-dp2-ep2-fp8:tensorwise"), d));
  lora.lora.targets = LoraSpec::parse_targets("q,v,down");
  EXPECT_NO_THROW(require_moe_layout(m, lora, Layout::parse("fp8:delayed"), d));
  lora.lora.targets = 0b1111;
  // LoRA on the experts: gate and up together (one fused tensor), no
  // dropout (PEFT's rule for 3-D expert tensors), etp1.
  lora.lora.targets = LoraSpec::kAllTargets;
  EXPECT_NO_THROW(require_moe_layout(m, lora, Layout::parse("tp2-sp-dp2-ep2-zero3"), d));
  lora.lora.targets = LoraSpec::parse_targets("q,gate,down");
  WEFT_EXPECT_THROW_MSG(require_moe_layout(m, lora, Layout::parse("mb1"), d), InputError,
                        "--lora-targets q,gate,down on the MoE model tiny-mixtral", "target gate and up together");
  lora.lora.targets = LoraSpec::parse_targets("gate,up");
  lora.lora.dropout = 0.1;
  WEFT_EXPECT_THROW_MSG(require_moe_layout(m, lora, Layout::parse("mb1"), d), InputError, "--lora-dropout 0.1",
                        "PEFT refuses it too");
  lora.lora.dropout = 0;
  // The experts' adapters under an expert tp degree: each tp rank computes
  // its part of the width (MoeParity.LoraOnTheExperts).
  EXPECT_TRUE(Layout::parse("tp2-etp2-sp").violations(m, lora, 2).empty());
  EXPECT_NO_THROW(require_moe_layout(m, run, Layout::parse("tp2-sp-dp2-ep2"), device_preset("h100")));
  ModelSpec per_layer = m;
  per_layer.moe.aux_scope = AuxLossScope::per_layer;
  EXPECT_NO_THROW(require_moe_layout(per_layer, run, Layout::parse("pp3"), d));
  // The planner prices MoE blocks, and prunes what they do not compute.
  const ClusterSpec cluster = cluster_resolve("h100-80gb", 8, 8);
  const auto k = tuner::cost_defaults(cluster.device);
  const auto fits = tuner::evaluate_one(m, run, cluster, Layout::parse("tp2-dp4-sp"), k, {});
  EXPECT_EQ(fits.verdict, tuner::Verdict::fits) << fits.reason;
  EXPECT_GT(fits.cost.step, 0);
  // Its FP8 layouts where a GEMM qualifies: tiny-mixtral's do not (C 32,
  // experts 24 wide), and the reason names the experts' rule too. A GPU
  // does not run them yet (check_trainable), whatever the dry-run prices.
  const auto f8 = tuner::evaluate_one(m, run, cluster, Layout::parse("tp2-dp4-sp-fp8:tensorwise"), k, {});
  EXPECT_EQ(f8.verdict, tuner::Verdict::invalid);
  EXPECT_NE(f8.reason.find("the routed experts stay in fp32: FP8 needs C and each expert's local width multiples "
                           "of 16 (C 32, width 24)"),
            std::string::npos)
      << f8.reason;
  try {
    trainer::check_trainable(m, Layout::parse("tp2-dp4-sp-fp8:tensorwise"), DeviceKind::gpu,
                             trainer::Trainable::anywhere);
    ADD_FAILURE() << "FP8 MoE blocks on a GPU are not trained yet";
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("computed by the CPU trainer only yet, not on a GPU (use fp8:off)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(trainer::check_trainable(m, Layout::parse("tp2-dp4-sp-fp8:tensorwise"), DeviceKind::cpu,
                                           trainer::Trainable::here));
  EXPECT_NO_THROW(trainer::check_trainable(m, Layout::parse("tp2-dp4-sp-fp8:delayed"), DeviceKind::cpu,
                                           trainer::Trainable::here));
  EXPECT_NO_THROW(trainer::check_trainable(m, Layout::parse("tp2-dp4-sp-fp8:blockwise"), DeviceKind::cpu,
                                           trainer::Trainable::here));
  EXPECT_NO_THROW(trainer::check_trainable(m, Layout::parse("cp2-dp2-fp8:blockwise"), DeviceKind::cpu,
                                           trainer::Trainable::here));
  EXPECT_NO_THROW(trainer::check_trainable(m, Layout::parse("tp2-dp2-ep2-etp2-pp2-fp8:blockwise"), DeviceKind::cpu,
                                           trainer::Trainable::here));
  lora.lora.targets = LoraSpec::kAllTargets;
  EXPECT_NO_THROW(lora_check_model(m, lora.lora));
  lora.lora.rank = 28;  // within the experts' gate_up (48 x 32), past their down (32 x 24)
  lora.lora.targets = LoraSpec::parse_targets("gate,up,down");
  WEFT_EXPECT_THROW_MSG(lora_check_model(m, lora.lora), InputError, "--lora 28 is past the width of tiny-mixtral's "
                        "experts' down layer");
  lora.lora.rank = 4;
  lora.lora.targets = 0b1001;  // q and o
  EXPECT_NO_THROW(lora_check_model(m, lora.lora));
}

}  // namespace
}  // namespace weft::trainer
