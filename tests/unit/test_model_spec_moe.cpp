// ModelSpec's Mixtures of Experts and attention variants: the presets'
// parameter counts, the layer pattern, validation, JSON and hash, and the
// Hugging Face configs of Mixtral, Qwen3-MoE and Llama 4.
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/flops.h"
#include "core/layout.h"
#include "core/model_spec.h"
#include "test_util.h"

namespace weft {
namespace {

// Totals and active parameters worked out by hand from each config's shapes
// (attention + norms + router + experts + shared expert per layer, the
// embedding, the final norm and the head), which the published round
// figures confirm: Mixtral 8x7B 46.7B with 12.9B active, 8x22B 141B / 39B,
// Qwen3 30.5B / 3.3B and 235B / 22B, Llama 4 Scout 109B with its vision
// encoder / 17B, Maverick 400B / 17B. Active counts the input embedding too,
// as the model cards do; MFU's N (flop_params) leaves it out.
TEST(ModelSpecMoe, PresetParameterCounts) {
  struct Case {
    const char* name;
    int64_t total, active;
  };
  const Case cases[] = {
      {"mixtral-8x7b", 46'702'792'704, 12'879'925'248},
      {"mixtral-8x22b", 140'620'634'112, 39'152'031'744},
      {"qwen3-30b-a3b", 30'532'122'624, 3'353'032'704},
      {"qwen3-235b-a22b", 235'093'634'560, 22'190'763'520},
      {"llama4-scout", 107'769'861'120, 17'172'894'720},
      {"llama4-maverick", 400'711'848'960, 17'184'691'200},
  };
  for (const auto& c : cases) {
    const ModelSpec m = model_preset(c.name);
    EXPECT_NO_THROW(m.validate()) << c.name;
    EXPECT_EQ(m.param_count(), c.total) << c.name;
    EXPECT_EQ(m.flop_params() + m.embedding_params(), c.active) << c.name;
  }
}

TEST(ModelSpecMoe, LayerPattern) {
  const ModelSpec maverick = model_preset("llama4-maverick");
  EXPECT_EQ(maverick.moe_layers(), 24);
  for (int64_t i = 0; i < maverick.layers; ++i) EXPECT_EQ(maverick.moe_layer(i), i % 2 == 1) << i;
  // A dense layer's block is the dense FFN of width F = 16384; an MoE
  // layer's the router, 128 experts and the shared expert.
  EXPECT_EQ(maverick.layer_params(0), maverick.attention_params() + 2 * 5120 + 3 * 5120 * 16384);
  EXPECT_EQ(maverick.layer_params(1), maverick.attention_params() + 2 * 5120 + 128 * 5120 +
                                          128 * 3 * 5120 * int64_t{8192} + 3 * 5120 * 8192);
  EXPECT_EQ(maverick.layer_active_params(0), maverick.layer_params(0));
  EXPECT_EQ(maverick.layer_params(1) - maverick.layer_active_params(1), 127 * 3 * 5120 * int64_t{8192});

  // DeepSeek-style: the first layers dense.
  ModelSpec m = model_preset("tiny-moe");
  EXPECT_EQ(m.moe_layers(), m.layers);
  m.moe.dense_layers = {0, 2};
  m.validate();
  EXPECT_EQ(m.moe_layers(), 2);
  EXPECT_FALSE(m.moe_layer(0));
  EXPECT_TRUE(m.moe_layer(1));
  EXPECT_FALSE(m.moe_layer(2));
  const ModelSpec dense = model_preset("tiny");
  EXPECT_EQ(m.layer_params(0), dense.layer_params(0));
  EXPECT_EQ(dense.moe_layers(), 0);
  // Qwen3's per-head norms: 2 D weights more in every block.
  EXPECT_EQ(model_preset("qwen3-30b-a3b").attention_params(),
            2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128);
}

TEST(ModelSpecMoe, InvalidFieldsAreNamed) {
  struct Case {
    void (*edit)(ModelSpec&);
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {[](ModelSpec& m) { m.moe.top_k = 9; }, {"moe.top_k=9", "from 1 to experts=8"}},
      {[](ModelSpec& m) { m.moe.top_k = 0; }, {"moe.top_k=0"}},
      {[](ModelSpec& m) { m.moe.expert_intermediate = 0; }, {"moe.expert_intermediate=0"}},
      {[](ModelSpec& m) { m.moe.shared_intermediate = -1; }, {"moe.shared_intermediate=-1"}},
      {[](ModelSpec& m) { m.moe.experts = kMaxExperts + 1; }, {"moe.experts=16385", "from 1 to 16384"}},
      {[](ModelSpec& m) { m.moe.route_scale = 0; }, {"moe.route_scale=0"}},
      {[](ModelSpec& m) { m.moe.aux_loss_coef = -0.5; }, {"moe.aux_loss_coef=-0.5"}},
      {[](ModelSpec& m) { m.moe.step = 5; }, {"moe.step=5", "from 1 to layers=4"}},
      {[](ModelSpec& m) { m.moe.dense_layers = {2, 1}; }, {"ascend", "1 after 2"}},
      {[](ModelSpec& m) { m.moe.dense_layers = {4}; }, {"holds 4", "not a layer (0 to 3)"}},
      {[](ModelSpec& m) {
         m.moe.step = 2;
         m.moe.dense_layers = {0};
       },
       {"holds 0", "already leaves dense"}},
      {[](ModelSpec& m) { m.moe.dense_layers = {0, 1, 2, 3}; }, {"leave no MoE layer"}},
      {[](ModelSpec& m) {
         m.moe = MoeSpec{};
         m.moe.top_k = 2;
       },
       {"moe.experts=0", "top_k=2"}},
      {[](ModelSpec& m) { m.attention.nope_interval = 5; }, {"attention.nope_interval=5"}},
      {[](ModelSpec& m) { m.attention.attention_chunk = -1; }, {"attention.attention_chunk=-1"}},
      {[](ModelSpec& m) {
         m.attention.temperature_scale = 0.1;
         m.attention.temperature_floor = 8;
       },
       {"temperature_scale=0.1", "nope_interval=0"}},
      {[](ModelSpec& m) {
         m.attention.nope_interval = 2;
         m.attention.temperature_scale = 0.1;
       },
       {"attention.temperature_floor=0"}},
      {[](ModelSpec& m) { m.attention.temperature_floor = 8; }, {"temperature_floor=8", "temperature_scale=0"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    ModelSpec m = model_preset("tiny-moe");
    cases[i].edit(m);
    for (const char* s : cases[i].says) WEFT_EXPECT_THROW_MSG(m.validate(), InputError, s);
  }
}

TEST(ModelSpecMoe, JsonRoundTripAndHash) {
  // A dense model's JSON and hash are what they were before experts
  // existed (the hash recipes and checkpoints of tiny record).
  const ModelSpec tiny = model_preset("tiny");
  EXPECT_EQ(tiny.hash(), "006e7286c56edb9d");
  const nlohmann::json dense = tiny;
  EXPECT_FALSE(dense.contains("moe"));
  EXPECT_FALSE(dense.contains("attention"));

  for (const char* name : {"mixtral-8x7b", "qwen3-30b-a3b", "llama4-scout", "llama4-maverick", "tiny-moe"}) {
    ModelSpec m = model_preset(name);
    if (m.name == "tiny-moe") {
      m.moe.dense_layers = {1};
      m.moe.route_scale = 2.5;
      m.moe.aux_scope = AuxLossScope::per_layer;
    }
    const nlohmann::json j = m;
    const ModelSpec back = j.get<ModelSpec>();
    EXPECT_EQ(back.moe, m.moe) << name << " " << j.dump();
    EXPECT_EQ(back.attention, m.attention) << name;
    EXPECT_EQ(back.hash(), m.hash()) << name;
    EXPECT_EQ(j["moe"]["active_params"], m.flop_params() + m.embedding_params()) << name;
  }
  // Every architectural field moves the hash; the balancing loss does not.
  const ModelSpec base = model_preset("tiny-moe");
  const std::vector<void (*)(ModelSpec&)> edits = {
      [](ModelSpec& m) { m.moe.experts = 16; },
      [](ModelSpec& m) { m.moe.top_k = 1; },
      [](ModelSpec& m) { m.moe.expert_intermediate = 64; },
      [](ModelSpec& m) { m.moe.shared_intermediate = 64; },
      [](ModelSpec& m) { m.moe.score = RouterScore::sigmoid; },
      [](ModelSpec& m) { m.moe.weights = RouterWeights::scores; },
      [](ModelSpec& m) { m.moe.route_scale = 2; },
      [](ModelSpec& m) { m.moe.gate_on = GateOn::input; },
      [](ModelSpec& m) { m.moe.step = 2; },
      [](ModelSpec& m) { m.moe.dense_layers = {0}; },
      [](ModelSpec& m) { m.attention.qk_norm = QkNorm::rms; },
      [](ModelSpec& m) { m.attention.nope_interval = 2; },
      [](ModelSpec& m) { m.attention.attention_chunk = 64; },
      [](ModelSpec& m) {
        m.attention.nope_interval = 2;
        m.attention.temperature_scale = 0.1;
        m.attention.temperature_floor = 8;
      },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    ModelSpec m = base;
    edits[i](m);
    EXPECT_NE(m.hash(), base.hash()) << i;
  }
  ModelSpec coef = base;
  coef.moe.aux_loss_coef = 0.5;
  coef.moe.aux_scope = AuxLossScope::per_layer;
  EXPECT_EQ(coef.hash(), base.hash());

  // Bad values in the JSON are named.
  nlohmann::json j = base;
  j["moe"]["score"] = "relu";
  WEFT_EXPECT_THROW_MSG(j.get<ModelSpec>(), InputError, "moe.score", "relu", "softmax, sigmoid");
  j = base;
  j["moe"].erase("top_k");
  WEFT_EXPECT_THROW_MSG(j.get<ModelSpec>(), InputError, "missing field 'moe.top_k'");
  j = base;
  j["moe"]["dense_layers"] = "0";
  WEFT_EXPECT_THROW_MSG(j.get<ModelSpec>(), InputError, "moe.dense_layers");
  j = base;
  j["attention"] = {{"qk_norm", "layer"}};
  WEFT_EXPECT_THROW_MSG(j.get<ModelSpec>(), InputError, "attention.qk_norm", "none, rms, l2");
}

TEST(ModelSpecMoe, SummaryAndRefusal) {
  const ModelSpec m = model_preset("llama4-maverick");
  const std::string s = m.summary();
  for (const char* part : {"experts 128x8192 top-1 sigmoid on input + shared 8192 in 24 of 48 layers",
                           "17.18B active", "NoPE every 4", "chunk 8192", "temperature 0.1/8192"})
    EXPECT_NE(s.find(part), std::string::npos) << part << " in " << s;
  // Every model weft reads is computed (MoE layers under
  // trainer::require_moe_layout's layouts); Llama 4's attention within
  // chunks past the chunk by the flash and materialized kernels, not by
  // cuDNN's, which the layout refuses by name.
  for (const char* name : {"llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "tiny-moe", "llama4-scout", "llama4-maverick"})
    EXPECT_TRUE(model_preset(name).not_yet_computed().empty()) << name;
  const ModelSpec scout = model_preset("llama4-scout");
  for (const char* attn : {"flash", "materialized"}) {
    const Layout l = Layout::parse(std::string("tp8-pp1-dp8-attn:") + attn);
    EXPECT_TRUE(l.violations(scout, RunSpec{8192, 64, Precision::bf16}, 64).empty()) << attn;
    EXPECT_TRUE(l.violations(scout, RunSpec{16384, 64, Precision::bf16}, 64).empty()) << attn;
  }
  const Layout cudnn = Layout::parse("tp8-pp1-dp8-attn:cudnn");
  EXPECT_TRUE(cudnn.violations(scout, RunSpec{8192, 64, Precision::bf16}, 64).empty());
  const auto v = cudnn.violations(scout, RunSpec{16384, 64, Precision::bf16}, 64);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_NE(v[0].find("seq 16384 is past llama4-scout's attention chunk of 8192 positions, and attn:cudnn does not "
                      "attend within chunks"),
            std::string::npos)
      << v[0];
}

// Llama 4 Scout's 36 RoPE layers of 48 attend within chunks of 8192: past
// the chunk, its model FLOPs count 8192 keys a query there and T in the 12
// NoPE layers, and its causal pairs are the chunks' (two whole chunks at
// 16384); within one chunk both are the whole causal attention's.
TEST(ModelSpecMoe, ChunkedLayersCountTheirChunksKeys) {
  const ModelSpec scout = model_preset("llama4-scout");
  const double N = double(scout.flop_params()), C = double(scout.hidden);
  EXPECT_DOUBLE_EQ(attention_widths(scout, 8192), 48.0 * 8192);
  EXPECT_DOUBLE_EQ(attention_pair_fraction(scout, 8192), 1.0);
  EXPECT_DOUBLE_EQ(model_flops_per_token(scout, 8192), 6 * N + 12 * C * 48 * 8192);
  EXPECT_DOUBLE_EQ(attention_widths(scout, 16384), 12.0 * 16384 + 36.0 * 8192);
  EXPECT_DOUBLE_EQ(model_flops_per_token(scout, 16384), 6 * N + 12 * C * (12.0 * 16384 + 36.0 * 8192));
  EXPECT_DOUBLE_EQ(attention_pair_fraction(scout, 16384), 0.25 + 0.75 * (8193.0 / 16385.0));
  // A partial last chunk: 20000 = 2 x 8192 + 3616.
  const double pairs = 2 * 8192.0 * 8193 / 2 + 3616.0 * 3617 / 2;
  EXPECT_DOUBLE_EQ(attention_pair_fraction(scout, 20000), 0.25 + 0.75 * pairs / (20000.0 * 20001 / 2));
  EXPECT_NE(mfu_flops_text(scout).find("T at most the chunk of 8192 in the 36 chunked layers"), std::string::npos)
      << mfu_flops_text(scout);
  const ModelSpec llama = model_preset("llama3-8b");
  EXPECT_DOUBLE_EQ(attention_widths(llama, 16384), 32.0 * 16384);
  EXPECT_DOUBLE_EQ(attention_pair_fraction(llama, 16384), 1.0);
}

// Each published config.json, read, is its preset.
TEST(ModelSpecMoe, PublishedConfigsAreThePresets) {
  test::TempDir dir;
  const auto mixtral = dir.file("mixtral/config.json", R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000})");
  const auto qwen3 = dir.file("qwen3/config.json", R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
  // Scout as published: the multimodal config, its text model in text_config.
  nlohmann::json rope_of_layers = nlohmann::json::array();
  for (int i = 0; i < 48; ++i) rope_of_layers.push_back((i + 1) % 4 != 0 ? 1 : 0);
  nlohmann::json moe_layers = nlohmann::json::array();
  for (int i = 0; i < 48; ++i) moe_layers.push_back(i);
  nlohmann::json scout = nlohmann::json::parse(R"({
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "boi_token_index": 200080,
    "tie_word_embeddings": false, "text_config": {
      "attention_bias": false, "attention_chunk_size": 8192, "attention_dropout": 0.0, "attn_scale": 0.1,
      "attn_temperature_tuning": 4, "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
      "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
      "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
      "max_position_embeddings": 10485760, "model_type": "llama4_text", "num_attention_heads": 40,
      "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
      "output_router_logits": false, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
      "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
      "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
      "use_qk_norm": true, "vocab_size": 202048}})");
  scout["text_config"]["no_rope_layers"] = rope_of_layers;
  scout["text_config"]["moe_layers"] = moe_layers;
  const auto scout_path = dir.file("scout/config.json", scout.dump());
  // Maverick's text model alone (Llama4ForCausalLM): the layer lists
  // derived from their intervals.
  const auto maverick = dir.file("maverick/config.json", R"({
    "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "attention_bias": false,
    "attention_chunk_size": 8192, "attn_scale": 0.1, "attn_temperature_tuning": true, "floor_scale": 8192,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 2,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "max_position_embeddings": 1048576,
    "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
    "num_local_experts": 128, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 500000.0,
    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "use_qk_norm": false, "vocab_size": 202048})");
  for (auto [path, preset] : {std::pair{mixtral, "mixtral-8x7b"}, {qwen3, "qwen3-30b-a3b"},
                              {scout_path, "llama4-scout"}, {maverick, "llama4-maverick"}}) {
    const ModelSpec read = model_from_hf_config(path);
    const ModelSpec want = model_preset(preset);
    EXPECT_EQ(read.moe, want.moe) << preset;
    EXPECT_EQ(read.attention, want.attention) << preset;
    EXPECT_EQ(read.hash(), want.hash()) << preset << ": " << read.summary() << " vs " << want.summary();
    EXPECT_EQ(read.param_count(), want.param_count()) << preset;
    EXPECT_EQ(read.max_seq, want.max_seq) << preset;
  }
}

TEST(ModelSpecMoe, HfConfigVariantsAndRefusals) {
  test::TempDir dir;
  const nlohmann::json qwen3 = nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2})");
  // Qwen3's defaults: weights as scored (norm_topk_prob false), every layer.
  const ModelSpec plain = model_from_hf_config(dir.file("q0/config.json", qwen3.dump()));
  EXPECT_EQ(plain.moe.weights, RouterWeights::scores);
  EXPECT_EQ(plain.moe_layers(), 6);
  EXPECT_EQ(plain.attention.qk_norm, QkNorm::rms);
  EXPECT_EQ(plain.moe.aux_loss_coef, 0.001);
  // decoder_sparse_step 2 with mlp_only_layers [3, 4]: layer 4 is dense by
  // the step already; MoE layers 1 and 5.
  auto j = qwen3;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {4, 3};
  const ModelSpec sparse = model_from_hf_config(dir.file("q1/config.json", j.dump()));
  EXPECT_EQ(sparse.moe.step, 2);
  EXPECT_EQ(sparse.moe.dense_layers, (std::vector<int64_t>{3}));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(sparse.moe_layer(i), i == 1 || i == 5) << i;
  // Llama 4's explicit moe_layers [2, 5] read as step 3.
  const nlohmann::json llama4 = nlohmann::json::parse(R"({
    "model_type": "llama4_text", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32,
    "intermediate_size_mlp": 96, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "num_local_experts": 4, "moe_layers": [5, 2], "no_rope_layer_interval": 3,
    "attention_chunk_size": null, "floor_scale": 16})");
  const ModelSpec l4 = model_from_hf_config(dir.file("l4/config.json", llama4.dump()));
  EXPECT_EQ(l4.moe.step, 3);
  EXPECT_TRUE(l4.moe.dense_layers.empty());
  EXPECT_EQ(l4.moe.top_k, 1);
  EXPECT_EQ(l4.intermediate, 96);
  EXPECT_EQ(l4.moe.shared_intermediate, 32);
  EXPECT_EQ(l4.attention.nope_interval, 3);
  EXPECT_EQ(l4.attention.attention_chunk, 0);
  EXPECT_EQ(l4.attention.temperature_floor, 16);
  EXPECT_EQ(l4.attention.qk_norm, QkNorm::l2);

  struct Case {
    nlohmann::json base;
    nlohmann::json patch;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {qwen3, {{"num_experts_per_tok", 9}}, {"num_experts_per_tok", "from 1 to 8"}},
      {qwen3, {{"mlp_only_layers", {0, 1, 2, 3, 4, 5}}}, {"no layer is an MoE layer"}},
      {qwen3, {{"mlp_only_layers", {6}}}, {"mlp_only_layers", "holds 6"}},
      {qwen3, {{"router_jitter_noise", 0.01}}, {"router_jitter_noise is 0.01"}},
      {qwen3, {{"use_sliding_window", true}, {"sliding_window", 64}}, {"sliding_window is 64"}},
      {qwen3, {{"architectures", {"MixtralForCausalLM"}}}, {"model_type \"qwen3_moe\"", "name different models"}},
      {qwen3, {{"model_type", "qwen2_moe"}}, {"qwen2_moe", "\"qwen3_moe\""}},
      {qwen3, {{"num_experts", nullptr}}, {"num_experts", "Qwen3MoeForCausalLM"}},
      {llama4, {{"no_rope_layers", {1, 0, 1, 1, 1, 1}}}, {"no_rope_layers is [1,0,1,1,1,1]", "every n-th"}},
      {llama4, {{"no_rope_layers", {1, 2}}}, {"no_rope_layers", "holds 2"}},
      {llama4, {{"layer_types", {"full_attention"}}}, {"layer_types"}},
      {llama4, {{"moe_layers", nlohmann::json::array()}}, {"no layer is an MoE layer"}},
      {llama4, {{"use_qk_norm", "yes"}}, {"use_qk_norm", "true or false"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto c = cases[i].base;
    c.merge_patch(cases[i].patch);
    if (cases[i].patch.contains("num_experts") && cases[i].patch["num_experts"].is_null()) c.erase("num_experts");
    const auto path = dir.file("case" + std::to_string(i) + "/config.json", c.dump());
    WEFT_EXPECT_THROW_MSG(model_from_hf_config(path), InputError, path.c_str());
    for (const char* s : cases[i].says) WEFT_EXPECT_THROW_MSG(model_from_hf_config(path), InputError, s);
  }
  // Llama 4's multimodal config without a text model.
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("mm/config.json", R"({"model_type": "llama4"})")), InputError,
                        "text_config", "missing");
}

// The receive buffers of ep: the worst case, a stated factor, or the
// tuning's measured dispatches at the most rows a rank up to the layout's.
TEST(ModelSpecMoe, ReceiveBuffersFromTheMeasuredDispatches) {
  MoeSpec e = model_preset("tiny-moe").moe;  // 8 experts, top-2
  ASSERT_EQ(e.experts, 8);
  ASSERT_EQ(e.top_k, 2);
  // The worst case at ep 4: each of 4 ranks sends min(2, 8 / 4) choices of
  // each of its rows, 4 x a rank's balanced rows x k.
  EXPECT_EQ(e.received_rows_worst(100, 4), 800);
  EXPECT_EQ(e.received_rows(100, 4), 800);
  e.measured = {{64, 4, 2.5}, {64, 4, 2.86}, {128, 4, 1.75}, {64, 2, 1.5}, {512, 4, 1.2}};
  // Below every measured rows: the worst case.
  EXPECT_EQ(e.imbalance_for(32, 4), 0.0);
  EXPECT_EQ(e.received_rows(32, 4), 256);
  // The most rows measured up to the layout's, the largest factor there.
  EXPECT_EQ(e.imbalance_for(64, 4), 2.86);
  EXPECT_EQ(e.imbalance_for(100, 4), 2.86);
  EXPECT_EQ(e.received_rows(100, 4), int64_t(std::ceil(2.86 * 200)));
  EXPECT_EQ(e.imbalance_for(300, 4), 1.75);
  EXPECT_EQ(e.received_rows(300, 4), 1050);
  EXPECT_EQ(e.imbalance_for(4096, 4), 1.2);
  // Another ep degree has its own; none without ep.
  EXPECT_EQ(e.imbalance_for(300, 2), 1.5);
  EXPECT_EQ(e.imbalance_for(300, 8), 0.0);
  EXPECT_EQ(e.imbalance_for(300, 1), 0.0);
  EXPECT_EQ(e.received_rows(300, 1), 600);
  // A factor past the worst case holds the worst case.
  e.measured = {{64, 4, 5.0}};
  EXPECT_EQ(e.received_rows(100, 4), 800);
  // A stated factor wins over the measurements.
  e.measured = {{64, 4, 2.86}};
  e.imbalance = 1.5;
  EXPECT_EQ(e.imbalance_for(100, 4), 1.5);
  EXPECT_EQ(e.received_rows(100, 4), 300);
}

}  // namespace
}  // namespace weft
