#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/flops.h"
#include "core/model_spec.h"
#include "test_util.h"

namespace weft {
namespace {

TEST(ModelSpec, ExactParameterCounts) {
  // Counts as published for the Hugging Face checkpoints.
  EXPECT_EQ(model_preset("llama2-7b").param_count(), 6'738'415'616);
  EXPECT_EQ(model_preset("llama3-8b").param_count(), 8'030'261'248);
  EXPECT_EQ(model_preset("llama-7b").param_count(), 6'738'415'616);
  EXPECT_EQ(model_preset("llama-13b").param_count(), 13'015'864'320);
  EXPECT_EQ(model_preset("llama-30b").param_count(), 32'528'943'616);
  EXPECT_EQ(model_preset("llama-65b").param_count(), 65'285'660'672);
  EXPECT_EQ(model_preset("llama2-70b").param_count(), 68'976'648'192);
  EXPECT_EQ(model_preset("llama3-70b").param_count(), 70'553'706'496);
  EXPECT_EQ(model_preset("llama3.2-1b").param_count(), 1'235'814'400);
  EXPECT_EQ(model_preset("llama3.2-3b").param_count(), 3'212'749'824);
  EXPECT_EQ(model_preset("llama3.1-8b").param_count(), 8'030'261'248);
  EXPECT_EQ(model_preset("llama3.1-70b").param_count(), 70'553'706'496);
  EXPECT_EQ(model_preset("llama3.1-405b").param_count(), 405'853'388'800);
}

// tp pads a vocabulary it does not divide to a multiple of 128 x tp (as
// Megatron's make-vocab-size-divisible-by does), and leaves one it divides.
TEST(ModelSpec, PaddedVocabulary) {
  ModelSpec m = model_preset("llama3.1-8b");  // V = 128256 = 1002 x 128
  for (int64_t tp : {1, 2, 4, 8}) EXPECT_EQ(m.padded_vocab(tp), 128256) << tp;
  m.vocab = 50257;  // GPT-2's
  EXPECT_EQ(m.padded_vocab(1), 50257);
  EXPECT_EQ(m.padded_vocab(2), 50432);  // 197 x 256
  EXPECT_EQ(m.padded_vocab(4), 50688);  // 99 x 512
  EXPECT_EQ(m.padded_vocab(8), 51200);  // 50 x 1024
  m.vocab = 32001;  // a token added to Llama 2's
  EXPECT_EQ(m.padded_vocab(2), 32256);
  m.vocab = 259;
  EXPECT_EQ(m.padded_vocab(3), 384);
  for (int64_t tp : {2, 3, 4, 8, 16}) {
    EXPECT_EQ(m.padded_vocab(tp) % tp, 0) << tp;
    EXPECT_GE(m.padded_vocab(tp), m.vocab) << tp;
  }
}

// As published: Llama 3 has "rope_scaling": null, Llama 3.1 factor 8 and
// Llama 3.2 factor 32, both with low 1, high 4 and 8192 original positions.
TEST(ModelSpec, PresetRopeScaling) {
  for (const char* name : {"llama3-8b", "llama3-70b", "llama2-7b", "tiny"})
    EXPECT_FALSE(model_preset(name).rope_scaling.enabled()) << name;
  for (const char* name : {"llama3.1-8b", "llama3.1-70b", "llama3.1-405b"})
    EXPECT_EQ(model_preset(name).rope_scaling, rope_scaling_llama3(8.0, 1.0, 4.0, 8192)) << name;
  // Llama 3.1 405B's config.json: 126 layers, C 16384, F 53248, 128 heads
  // over 8 kv heads, theta 500000, untied.
  const auto big = model_preset("llama3.1-405b");
  EXPECT_EQ(big.layers, 126);
  EXPECT_EQ(big.kv_heads, 8);
  EXPECT_EQ(big.rope_theta, 5e5);
  EXPECT_FALSE(big.tied_embeddings);
  EXPECT_EQ(big.max_seq, 131072);
  for (const char* name : {"llama3.2-1b", "llama3.2-3b"})
    EXPECT_EQ(model_preset(name).rope_scaling, rope_scaling_llama3(32.0, 1.0, 4.0, 8192)) << name;
  EXPECT_EQ(model_preset("llama3.1-8b").max_seq, 131072);
  EXPECT_NE(model_preset("llama3.1-8b").summary().find("rope llama3 x8 (1-4, 8192)"), std::string::npos)
      << model_preset("llama3.1-8b").summary();
  // The same weights shape with and without scaling are different models.
  auto a = model_preset("llama3.1-8b");
  auto b = model_preset("llama3-8b");
  EXPECT_EQ(a.param_count(), b.param_count());
  EXPECT_NE(a.hash(), b.hash());
  b.rope_scaling = a.rope_scaling;
  b.max_seq = a.max_seq;
  EXPECT_EQ(a.hash(), b.hash());
  b.rope_scaling.high_freq_factor = 5;
  EXPECT_NE(a.hash(), b.hash());
}

TEST(ModelSpec, RopeScalingIsValidated) {
  auto m = model_preset("tiny");
  m.rope_scaling = rope_scaling_llama3(0.5, 1.0, 4.0, 8192);
  WEFT_EXPECT_THROW_MSG(m.validate(), InputError, "rope_scaling.factor=0.5", ">= 1");
  m.rope_scaling = rope_scaling_llama3(8.0, 4.0, 1.0, 0);
  WEFT_EXPECT_THROW_MSG(m.validate(), InputError, "low_freq_factor=4 must be less than high_freq_factor=1",
                        "original_max_position_embeddings=0");
}

// weft's own model JSON (recipes, manifests): an optional field of the wrong
// type is named, not a JSON library exception (found by fuzz_manifest).
TEST(ModelSpec, MistypedOptionalFieldsAreNamed) {
  nlohmann::json j = model_preset("tiny");
  j["tied_embeddings"] = 16;
  WEFT_EXPECT_THROW_MSG(j.get<ModelSpec>(), InputError, "tied_embeddings", "true or false", "16");
  j = model_preset("tiny");
  j["rope_theta"] = "big";
  WEFT_EXPECT_THROW_MSG(j.get<ModelSpec>(), InputError, "rope_theta", "a number");
  j = model_preset("tiny");
  j["max_seq"] = 1.5;
  WEFT_EXPECT_THROW_MSG(j.get<ModelSpec>(), InputError, "max_seq", "an integer");
  EXPECT_EQ(nlohmann::json(model_preset("tiny")).get<ModelSpec>().hash(), model_preset("tiny").hash());
}

TEST(ModelSpec, PresetShapes) {
  const auto m = model_preset("llama-30b");
  EXPECT_EQ(m.layers, 60);
  EXPECT_EQ(m.hidden, 6656);
  EXPECT_EQ(m.heads, 52);
  const auto g = model_preset("llama2-70b");
  EXPECT_EQ(g.kv_heads, 8);
  for (const auto& name : model_preset_names()) EXPECT_NO_THROW(model_preset(name).validate());
}

TEST(ModelSpec, UnknownPresetListsValidNames) {
  WEFT_EXPECT_THROW_MSG(model_preset("llama-9b"), InputError, "llama-9b", "llama2-7b", "llama3-8b");
}

TEST(ModelSpec, TiedEmbeddingsCountOnce) {
  auto m = model_preset("tiny-test");
  const int64_t untied = m.param_count();
  m.tied_embeddings = true;
  EXPECT_EQ(m.param_count(), untied - m.vocab * m.hidden);
  // The head matmul costs FLOPs whether or not its weight is shared.
  EXPECT_EQ(m.flop_params(), untied - m.vocab * m.hidden);
}

TEST(ModelSpec, FlopsPerTokenFormula) {
  const auto m = model_preset("llama2-7b");
  const double n = double(m.param_count() - m.vocab * m.hidden);  // untied: minus the lookup table
  EXPECT_DOUBLE_EQ(model_flops_per_token(m, 4096), 6 * n + 12.0 * 32 * 4096 * 4096);
  RunSpec run{4096, 8, Precision::bf16};
  EXPECT_DOUBLE_EQ(model_flops_per_step(m, run), model_flops_per_token(m, 4096) * 4096 * 8);
  EXPECT_DOUBLE_EQ(mfu(312e12 * 8 * 0.5, 8, 312e12), 0.5);
}

TEST(ModelSpec, HfConfigImport) {
  test::TempDir dir;
  const auto path = dir.file("llama3/config.json", R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
    "max_position_embeddings": 8192, "hidden_act": "silu"})");
  const auto m = model_resolve(path);
  EXPECT_EQ(m.name, "llama3");
  EXPECT_EQ(m.param_count(), 8'030'261'248);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.hash(), model_preset("llama3-8b").hash());
  EXPECT_FALSE(m.rope_scaling.enabled());
  // A folder resolves to its config.json.
  EXPECT_EQ(model_resolve(dir.path("llama3")).param_count(), m.param_count());
}

// transformers 5 keeps rope_theta inside rope_parameters.
TEST(ModelSpec, HfConfigRopeParameters) {
  test::TempDir dir;
  const auto m = model_from_hf_config(dir.file("c.json", R"({"vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})"));
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000.0);
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("d.json", R"({"vocab_size": 100,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "rope_parameters": {"rope_theta": "high"}})")),
                        InputError, "rope_parameters.rope_theta", "high");
}

// Llama 3.1 and 3.2 configs: rope_scaling with rope_type "llama3" (or the
// older key "type"), in transformers 4's rope_scaling or transformers 5's
// rope_parameters; the model is the preset's.
TEST(ModelSpec, HfConfigLlama3RopeScaling) {
  test::TempDir dir;
  const std::string base = R"("vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 131072, "hidden_act": "silu",
    "attention_bias": false, "mlp_bias": false, "pretraining_tp": 1, "attention_dropout": 0.0)";
  const auto v4 = model_from_hf_config(dir.file("v4.json", "{" + base + R"(, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})"));
  EXPECT_EQ(v4.rope_scaling, rope_scaling_llama3(8.0, 1.0, 4.0, 8192));
  EXPECT_EQ(v4.hash(), model_preset("llama3.1-8b").hash());
  const auto old_key = model_from_hf_config(dir.file("old.json", "{" + base + R"(, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8, "high_freq_factor": 4, "low_freq_factor": 1,
                     "original_max_position_embeddings": 8192, "type": "llama3"}})"));
  EXPECT_EQ(old_key.hash(), v4.hash());
  const auto v5 = model_from_hf_config(dir.file("v5.json", "{" + base + R"(,
    "rope_parameters": {"rope_theta": 500000.0, "factor": 8.0, "high_freq_factor": 4.0,
                        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
                        "rope_type": "llama3"}})"));
  EXPECT_EQ(v5.hash(), v4.hash());
  // "default", null and no type are plain RoPE.
  for (const char* rope : {R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "default"})",
                           R"("rope_parameters": {"rope_theta": 500000.0})"})
    EXPECT_FALSE(model_from_hf_config(dir.file("plain.json", "{" + base + ", " + rope + "}"))
                     .rope_scaling.enabled())
        << rope;
}

TEST(ModelSpec, HfConfigBadRopeScalingNamesTheField) {
  test::TempDir dir;
  const std::string base = R"({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, )";
  const auto config = [&](const std::string& rope) {
    return model_from_hf_config(dir.file("c.json", base + rope + "}"));
  };
  WEFT_EXPECT_THROW_MSG(config(R"("rope_scaling": {"rope_type": "linear", "factor": 2.0})"), InputError,
                        "rope_scaling has rope_type 'linear'", "'default' and 'llama3'");
  WEFT_EXPECT_THROW_MSG(config(R"("rope_scaling": {"type": "dynamic", "factor": 2.0})"), InputError,
                        "rope_scaling has rope_type 'dynamic'");
  WEFT_EXPECT_THROW_MSG(config(R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0})"), InputError,
                        "rope_parameters has rope_type 'yarn'");
  WEFT_EXPECT_THROW_MSG(config(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"), InputError,
                        "rope_scaling.low_freq_factor is missing", "rope_scaling.high_freq_factor is missing",
                        "original_max_position_embeddings is missing");
  WEFT_EXPECT_THROW_MSG(config(R"("rope_scaling": {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1,
    "high_freq_factor": 4, "original_max_position_embeddings": 8192})"),
                        InputError, "rope_scaling.factor is \"8\"");
  WEFT_EXPECT_THROW_MSG(config(R"("rope_scaling": {"rope_type": "llama3", "factor": 0.5, "low_freq_factor": 4,
    "high_freq_factor": 1, "original_max_position_embeddings": 8192.5})"),
                        InputError, "original_max_position_embeddings=8192.5 must be a whole number");
  WEFT_EXPECT_THROW_MSG(config(R"("rope_scaling": {"rope_type": "llama3", "factor": 0.5, "low_freq_factor": 4,
    "high_freq_factor": 1, "original_max_position_embeddings": 8192})"),
                        InputError, "rope_scaling.factor=0.5 must be a finite number >= 1",
                        "rope_scaling.low_freq_factor=4 must be less than high_freq_factor=1");
  WEFT_EXPECT_THROW_MSG(config(R"("rope_scaling": 8)"), InputError, "rope_scaling is 8, not an object");
  WEFT_EXPECT_THROW_MSG(
      config(R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
        "high_freq_factor": 4, "original_max_position_embeddings": 8192},
        "rope_parameters": {"rope_type": "llama3", "factor": 32, "low_freq_factor": 1,
        "high_freq_factor": 4, "original_max_position_embeddings": 8192})"),
      InputError, "rope_scaling and rope_parameters name different scalings");
}

// Fields that change the computation weft's Llama lacks are refused, all in
// one message, each with its value.
TEST(ModelSpec, HfConfigUnsupportedFeaturesAreRefusedByField) {
  test::TempDir dir;
  const auto path = dir.file("c.json", R"({"vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "attention_bias": true, "mlp_bias": true, "hidden_act": "gelu", "attention_dropout": 0.1,
    "partial_rotary_factor": 0.5, "quantization_config": {"quant_method": "gptq"},
    "rope_scaling": {"rope_type": "longrope"}, "pretraining_tp": 2})");
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(path), InputError, "c.json", "attention_bias is true",
                        "mlp_bias is true", "hidden_act is \"gelu\"", "attention_dropout is 0.1",
                        "partial_rotary_factor is 0.5", "quantization_config",
                        "rope_scaling has rope_type 'longrope'");
  // pretraining_tp only splits transformers' matmuls into slices: same math.
  const auto ok = model_from_hf_config(dir.file("ok.json", R"({"vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "pretraining_tp": 2,
    "attention_bias": false, "mlp_bias": null, "attention_dropout": 0.0, "partial_rotary_factor": 1.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}})"));
  EXPECT_EQ(ok.head_dim, 16);
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("p.json", R"({"vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}})")),
                        InputError, "rope_parameters.partial_rotary_factor is 0.25");
}

// weft's own model JSON (recipes, checkpoint manifests) keeps the scaling.
TEST(ModelSpec, JsonRoundTripOfRopeScaling) {
  auto m = model_preset("tiny");
  m.rope_scaling = rope_scaling_llama3(4.0, 2.0, 16.0, 100);
  const nlohmann::json j = m;
  EXPECT_EQ(j["rope_scaling"], nlohmann::json::parse(R"({"rope_type": "llama3", "factor": 4.0,
    "low_freq_factor": 2.0, "high_freq_factor": 16.0, "original_max_position_embeddings": 100})"));
  const auto back = nlohmann::json::parse(j.dump()).get<ModelSpec>();
  EXPECT_EQ(back.rope_scaling, m.rope_scaling);
  EXPECT_EQ(back.hash(), m.hash());
  auto bad = j;
  bad["rope_scaling"]["rope_type"] = "yarn";
  WEFT_EXPECT_THROW_MSG(bad.get<ModelSpec>(), InputError, "model spec", "rope_type 'yarn'");
  bad["rope_scaling"] = nullptr;
  EXPECT_FALSE(bad.get<ModelSpec>().rope_scaling.enabled());
}

TEST(ModelSpec, HfConfigDefaultsAndTies) {
  test::TempDir dir;
  const auto path = dir.file("c.json", R"({"vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "tie_word_embeddings": true})");
  const auto m = model_from_hf_config(path);
  EXPECT_EQ(m.kv_heads, 4);  // no num_key_value_heads: multi-head attention
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_TRUE(m.tied_embeddings);
}

TEST(ModelSpec, HfConfigErrorsNameTheField) {
  test::TempDir dir;
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("a.json", R"({"vocab_size": 10})")),
                        InputError, "hidden_size");
  WEFT_EXPECT_THROW_MSG(
      model_from_hf_config(dir.file("b.json", R"({"vocab_size": 10, "hidden_size": "big"})")),
      InputError, "hidden_size", "integer");
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("c.json", R"({"vocab_size": 10,)")),
                        FileFormatError, "not valid JSON");
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("d.json", "")), FileFormatError, "empty");
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.path("missing.json")), InputError, "missing.json");
  WEFT_EXPECT_THROW_MSG(
      model_from_hf_config(dir.file("e.json", R"({"vocab_size": 10, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 3})")),
      InputError, "heads=4", "kv_heads=3");
  WEFT_EXPECT_THROW_MSG(
      model_from_hf_config(dir.file("f.json", R"({"vocab_size": 0, "hidden_size": 64})")),
      InputError, "vocab_size", "positive");
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("g.json", R"({"model_type": "gpt2"})")),
                        InputError, "gpt2");
  // Found by tests/fuzz: a number past double's range, and sizes whose
  // parameter count overflows int64.
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("h.json", R"({"vocab_size": 10,
    "rope_theta": 1e999})")),
                        FileFormatError, "h.json", "rope_theta", "finite");
  WEFT_EXPECT_THROW_MSG(
      model_from_hf_config(dir.file("i.json", R"({"vocab_size": 2147483648,
        "hidden_size": 1048576, "intermediate_size": 4194304, "num_hidden_layers": 16384,
        "num_attention_heads": 1024})")),
      InputError, "i.json", "parameters", "vocab=2147483648");
}

// Values no Llama has, each refused naming the file, the field, the value
// and what is valid.
TEST(ModelSpec, HfConfigOutOfRangeOrAnotherModelIsRefused) {
  test::TempDir dir;
  const nlohmann::json base = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "bos_token_id": 1, "eos_token_id": 2,
    "max_position_embeddings": 512})");
  EXPECT_EQ(model_from_hf_config(dir.file("ok/config.json", base.dump())).vocab, 256);
  struct Case {
    const char* key;
    nlohmann::json value;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {"num_hidden_layers", int64_t{1} << 31, {"num_hidden_layers", "2147483648", "from 1 to 16384"}},
      {"num_attention_heads", int64_t{1} << 31, {"num_attention_heads", "2147483648", "from 1 to 16384"}},
      {"intermediate_size", int64_t{1} << 31, {"intermediate_size", "2147483648", "from 1 to 4194304"}},
      {"hidden_size", int64_t{1} << 31, {"hidden_size", "2147483648", "from 1 to 1048576"}},
      {"rope_theta", 1e-308, {"rope_theta", "1e-308", "from 1 to 1e+12"}},
      {"rms_norm_eps", 9e18, {"rms_norm_eps", "9e+18", "from 1e-30 to 1"}},
      {"bos_token_id", 256, {"bos_token_id", "256", "0 to vocab_size - 1 = 255"}},
      {"eos_token_id", nlohmann::json::array({2, 100000}), {"eos_token_id", "100000", "255"}},
      {"eos_token_id", -1, {"eos_token_id", "-1"}},
      {"architectures", nlohmann::json::array({"MistralForCausalLM"}), {"architectures", "MistralForCausalLM",
                                                                         "LlamaForCausalLM"}},
      {"architectures", nlohmann::json::array({"GPT2LMHeadModel"}), {"GPT2LMHeadModel"}},
      {"model_type", 5, {"model_type 5"}},
      {"sliding_window", 128, {"sliding_window is 128", "whole sequence"}},
  };
  for (const auto& c : cases) {
    auto j = base;
    j[c.key] = c.value;
    const auto path = dir.file(std::string(c.key) + "/config.json", j.dump());
    WEFT_EXPECT_THROW_MSG(model_from_hf_config(path), InputError, path.c_str());
    for (const char* s : c.says) WEFT_EXPECT_THROW_MSG(model_from_hf_config(path), InputError, s);
  }
  // A sliding window switched off, or wider than every position, is full attention.
  auto j = base;
  j["sliding_window"] = 128;
  j["use_sliding_window"] = false;
  EXPECT_NO_THROW(model_from_hf_config(dir.file("off/config.json", j.dump())));
  j["use_sliding_window"] = true;
  WEFT_EXPECT_THROW_MSG(model_from_hf_config(dir.file("on/config.json", j.dump())), InputError,
                        "use_sliding_window true");
  j.erase("use_sliding_window");
  j["sliding_window"] = 4096;
  EXPECT_NO_THROW(model_from_hf_config(dir.file("wide/config.json", j.dump())));
  // weft's own model JSON is bounded alike.
  auto m = model_preset("tiny");
  m.layers = int64_t{1} << 31;
  WEFT_EXPECT_THROW_MSG(m.validate(), InputError, "layers=2147483648", "from 1 to 16384");
  m = model_preset("tiny");
  m.norm_eps = 0;
  WEFT_EXPECT_THROW_MSG(m.validate(), InputError, "norm_eps=0");
}

TEST(ModelSpec, JsonRoundTrip) {
  for (const auto& name : model_preset_names()) {
    const auto m = model_preset(name);
    const nlohmann::json j = m;
    const auto back = nlohmann::json::parse(j.dump()).get<ModelSpec>();
    EXPECT_EQ(back.hash(), m.hash()) << name;
    EXPECT_EQ(back.rope_scaling, m.rope_scaling) << name;
    // Plain RoPE writes no key, so older files and today's read alike.
    EXPECT_EQ(j.contains("rope_scaling"), m.rope_scaling.enabled()) << name;
    EXPECT_EQ(back.name, m.name);
    EXPECT_EQ(back.param_count(), m.param_count());
    EXPECT_EQ(back.max_seq, m.max_seq);
  }
}

TEST(ModelSpec, HashDependsOnArchitectureOnly) {
  auto a = model_preset("llama2-7b");
  auto b = a;
  b.name = "renamed";
  EXPECT_EQ(a.hash(), b.hash());
  b.vocab += 64;
  EXPECT_NE(a.hash(), b.hash());
}

}  // namespace
}  // namespace weft
