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
      model_from_hf_config(dir.file("i.json", R"({"vocab_size": 1099511627776,
        "hidden_size": 1099511627776, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 1048576})")),
      InputError, "parameters", "vocab=1099511627776");
}

TEST(ModelSpec, JsonRoundTrip) {
  for (const auto& name : model_preset_names()) {
    const auto m = model_preset(name);
    const nlohmann::json j = m;
    const auto back = nlohmann::json::parse(j.dump()).get<ModelSpec>();
    EXPECT_EQ(back.hash(), m.hash()) << name;
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
