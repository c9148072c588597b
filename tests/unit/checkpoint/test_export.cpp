// Export of a checkpoint as a Hugging Face model folder.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/json_io.h"
#include "core/model_spec.h"
#include "tests/unit/checkpoint/checkpoint_test_util.h"
#include "tests/unit/test_util.h"
#include "trainer/checkpoint/export_hf.h"

namespace weft::checkpoint {
namespace {

namespace fs = std::filesystem;
using test::make_manifest;
using test::make_state;
using test::TrainState;
using weft::test::TempDir;

std::string save(const TempDir& tmp, const TrainState& s, const std::string& name) {
  const std::string dir = tmp.path(name);
  save_checkpoint(dir, s.model_tensors(), s.optimizer_tensors(), make_manifest(s.model, 5));
  return dir;
}

// The exported tensors are the fp32 weights of the state, in table order.
void expect_fp32_weights(const std::string& out, const TrainState& s) {
  const SafetensorsFile f((fs::path(out) / "model.safetensors").string());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), s.table.size());
  for (size_t i = 0; i < s.table.size(); ++i) {
    const TensorRef& t = f.tensors()[i];
    EXPECT_EQ(t.name, s.table[i].name);
    EXPECT_EQ(t.dtype, DType::F32);
    ASSERT_EQ(t.shape, s.table[i].shape);
    EXPECT_EQ(std::memcmp(t.data, s.weights[i].data(), s.weights[i].size() * 4), 0) << t.name;
  }
}

TEST(ExportHf, ConfigImportsBackToTheSameModel) {
  TempDir tmp;
  for (const char* preset : {"tiny-test", "tiny-tied"}) {
    const TrainState s = make_state(preset, 21);
    const std::string out = tmp.path(std::string("hf-") + preset);
    export_hf(save(tmp, s, std::string("ck-") + preset), out);

    const nlohmann::json config = json_read_file(out + "/config.json", "config");
    EXPECT_EQ(config["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(config["model_type"], "llama");
    EXPECT_EQ(config["hidden_act"], "silu");
    EXPECT_EQ(config["torch_dtype"], "float32");
    EXPECT_EQ(config["num_key_value_heads"], s.model.kv_heads);
    EXPECT_EQ(config["head_dim"], s.model.head_dim);
    EXPECT_EQ(config["tie_word_embeddings"], s.model.tied_embeddings);
    EXPECT_EQ(config["bos_token_id"], 1);
    EXPECT_EQ(config["eos_token_id"], 2);
    const ModelSpec back = model_from_hf_config(out + "/config.json");
    EXPECT_EQ(back.hash(), s.model.hash()) << preset;
    EXPECT_EQ(back.max_seq, s.model.max_seq);
    expect_fp32_weights(out, s);
    EXPECT_EQ(fs::exists(out + "/model.safetensors") &&
                  SafetensorsFile(out + "/model.safetensors").find("lm_head.weight") != nullptr,
              !s.model.tied_embeddings);
  }
}

// A model with Llama 3 scaling exports its rope_scaling as transformers
// writes it, and reads back to the same model; plain RoPE writes null.
TEST(ExportHf, RopeScalingIsWrittenAndReadBack) {
  TempDir tmp;
  TrainState s = make_state("tiny-test", 23);
  s.model.rope_scaling = rope_scaling_llama3(8.0, 1.0, 4.0, 64);
  const std::string out = tmp.path("hf");
  export_hf(save(tmp, s, "ck"), out);
  const nlohmann::json config = json_read_file(out + "/config.json", "config");
  EXPECT_EQ(config["rope_scaling"], nlohmann::json::parse(R"({"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64})"));
  const ModelSpec back = model_from_hf_config(out + "/config.json");
  EXPECT_EQ(back.rope_scaling, s.model.rope_scaling);
  EXPECT_EQ(back.hash(), s.model.hash());
  EXPECT_TRUE(hf_config_json(model_preset("tiny-test"))["rope_scaling"].is_null());
}

TEST(ExportHf, Bf16CheckpointExportsFp32) {
  TempDir tmp;
  // With master weights the export is exactly the fp32 master copy.
  const TrainState s = make_state("tiny-test", 22, DType::BF16);
  const std::string out = tmp.path("hf");
  export_hf(save(tmp, s, "ck"), out);
  expect_fp32_weights(out, s);

  // Without them the bf16 weights are widened exactly.
  const std::string dir = tmp.path("ck-no-master");
  save_checkpoint(dir, s.model_tensors(), {}, make_manifest(s.model, 5));
  export_hf(dir, tmp.path("hf2"));
  const SafetensorsFile f(tmp.path("hf2/model.safetensors"));
  const TensorRef& t = f.at(s.table[3].name);
  std::vector<float> got(static_cast<size_t>(t.elements()));
  std::memcpy(got.data(), t.data, got.size() * 4);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], bf16_to_f32(s.weights_bf16[3][i]));
}

TEST(ExportHf, RefusesUnsafeTargetsAndBadCheckpoints) {
  TempDir tmp;
  const TrainState s = make_state("tiny-test", 23);
  const std::string ck = save(tmp, s, "ck");
  const std::string out = tmp.path("hf");
  export_hf(ck, out);
  export_hf(ck, out + "/");  // an earlier export is replaced
  expect_fp32_weights(out, s);

  const std::string busy = tmp.path("busy");
  fs::create_directories(busy);
  std::ofstream(busy + "/notes.txt") << "mine";
  EXPECT_THROW(export_hf(ck, busy), InputError);
  EXPECT_TRUE(fs::exists(busy + "/notes.txt"));
  EXPECT_THROW(export_hf(ck, ck), InputError);

  fs::resize_file(ck + "/model.safetensors", 64);
  EXPECT_THROW(export_hf(ck, tmp.path("hf3")), FileFormatError);
  EXPECT_FALSE(fs::exists(tmp.path("hf3")));
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace weft::checkpoint
