// Pretrained weights for `weft train --init`: the Hugging Face folders that
// transformers' save_pretrained wrote (tools/hf_init_fixtures.py) open with
// their config's model, whether in one file or sharded, in fp32, bf16 or
// fp16; a weft checkpoint opens the same way; and every malformed folder is
// refused with a message that names the file, the tensor and the values.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "checkpoint_test_util.h"
#include "core/error.h"
#include "trainer/checkpoint/export_hf.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/pretrained.h"

namespace weft::checkpoint {
namespace {

namespace fs = std::filesystem;
using weft::test::TempDir;

std::string fixture(const std::string& folder) {
  return std::string(WEFT_FIXTURES_DIR) + "/hf_init/" + folder;
}

std::vector<float> values(const TensorRef& t) {
  std::vector<float> out(size_t(t.elements()));
  to_f32(t.dtype, t.data, out.data(), t.elements());
  return out;
}

// A copy of a fixture folder to damage.
std::string copy_of(const TempDir& dir, const std::string& folder) {
  const std::string out = dir.path(folder);
  fs::copy(fixture(folder), out, fs::copy_options::recursive);
  return out;
}

// Rewrites `dir`/model.safetensors from the untied fixture's tensors after
// `edit` changes the list.
template <typename Edit>
void rewrite_weights(const std::string& dir, Edit edit) {
  const SafetensorsFile src(fixture("untied") + "/model.safetensors");
  std::vector<TensorRef> tensors = src.tensors();
  edit(tensors);
  safetensors_write(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

void edit_config(const std::string& dir, const nlohmann::json& patch) {
  const std::string path = dir + "/config.json";
  nlohmann::json j;
  std::ifstream(path) >> j;
  j.merge_patch(patch);
  std::ofstream(path) << j.dump(2);
}

TEST(Pretrained, HuggingFaceFoldersOpenWithTheirConfigsModel) {
  struct Case {
    const char* folder;
    DType dtype;
    int64_t layers, kv_heads, files;
    bool tied;
  };
  for (const Case& c : {Case{"untied", DType::F32, 4, 2, 1, false}, Case{"untied_bf16", DType::BF16, 4, 2, 1, false},
                        Case{"untied_fp16", DType::F16, 4, 2, 1, false},
                        Case{"tied_sharded", DType::F32, 2, 4, 4, true}}) {
    SCOPED_TRACE(c.folder);
    EXPECT_EQ(pretrained_model(fixture(c.folder)).hash(), pretrained_open(fixture(c.folder)).model.hash());
    const Pretrained p = pretrained_open(fixture(c.folder));
    EXPECT_EQ(p.kind, PretrainedKind::hugging_face);
    const ModelSpec& m = p.model;
    EXPECT_EQ(m.vocab, 64);
    EXPECT_EQ(m.hidden, 16);
    EXPECT_EQ(m.intermediate, 40);
    EXPECT_EQ(m.layers, c.layers);
    EXPECT_EQ(m.heads, 4);
    EXPECT_EQ(m.kv_heads, c.kv_heads);
    EXPECT_EQ(m.head_dim, 8);
    // transformers 5 stores rope_theta inside rope_parameters.
    EXPECT_EQ(m.rope_theta, 500000.0);
    EXPECT_EQ(m.norm_eps, 1e-3);
    EXPECT_EQ(m.tied_embeddings, c.tied);
    EXPECT_EQ(p.bos_token_id, 1);
    EXPECT_EQ(p.eos_token_id, 2);
    ASSERT_TRUE(p.hf);
    EXPECT_EQ(int64_t(p.hf->files.size()), c.files);
    const auto table = hf_param_table(m);
    ASSERT_EQ(p.params.size(), table.size());
    for (const auto& info : table) {
      EXPECT_EQ(p.param(info.name).shape, info.shape) << info.name;
      EXPECT_EQ(p.param(info.name).dtype, c.dtype) << info.name;
    }
    EXPECT_NE(p.describe().find(fmt::format("{} weight file", c.files)), std::string::npos) << p.describe();
    EXPECT_NE(p.describe().find(to_string(c.dtype)), std::string::npos) << p.describe();
  }
}

// bf16 keeps 8 significant bits and rounds to nearest even, as weft's
// f32_to_bf16 does, so the stored bits must be exactly those; fp16 rounds to
// 11 significant bits: within half an ulp, 2^-11 relative, or 2^-25
// absolute in its subnormal range (below 2^-14).
TEST(Pretrained, Bf16AndFp16FoldersHoldTheFp32WeightsRounded) {
  const Pretrained f32 = pretrained_open(fixture("untied"));
  const Pretrained bf16 = pretrained_open(fixture("untied_bf16"));
  const Pretrained f16 = pretrained_open(fixture("untied_fp16"));
  for (const auto& [name, t] : f32.params) {
    const auto want = values(t);
    const auto& b = bf16.param(name);
    std::vector<uint16_t> rounded(want.size());
    f32_to_bf16(want.data(), rounded.data(), int64_t(want.size()));
    EXPECT_EQ(std::memcmp(b.data, rounded.data(), rounded.size() * 2), 0) << name;
    const auto h = values(f16.param(name));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_LE(std::fabs(h[i] - want[i]), std::max(std::ldexp(std::fabs(want[i]), -11), std::ldexp(1.0f, -25)))
          << name << " [" << i << "]";
  }
}

TEST(Pretrained, ShardsAreOneFolderOfTensors) {
  const Pretrained p = pretrained_open(fixture("tied_sharded"));
  // Four shards, each tensor in the one the index names; none holds lm_head.
  std::set<std::string> files;
  for (const auto& [name, file] : p.hf->file_of) files.insert(file);
  EXPECT_EQ(files.size(), 4u);
  EXPECT_FALSE(p.hf->tensors.contains("lm_head.weight"));
  nlohmann::json index;
  std::ifstream(fixture("tied_sharded") + "/" + kHfIndexFile) >> index;
  for (const auto& [tensor, file] : index["weight_map"].items()) EXPECT_EQ(p.hf->file_of.at(tensor), file);
}

TEST(Pretrained, AWeftCheckpointOpensWithItsMasterWeights) {
  TempDir dir;
  const auto state = test::make_state("tiny-tied", 7, DType::BF16);
  Manifest man = test::make_manifest(state.model, 12);
  save_checkpoint(dir.path("ck"), state.model_tensors(), state.optimizer_tensors(), man);
  for (const Verify v : {Verify::structure, Verify::checksums}) {
    const Pretrained p = pretrained_open(dir.path("ck"), v);
    EXPECT_EQ(p.kind, PretrainedKind::weft_checkpoint);
    EXPECT_EQ(p.model.hash(), state.model.hash());
    EXPECT_EQ(p.bos_token_id, 1);
    EXPECT_EQ(p.eos_token_id, 2);
    ASSERT_EQ(p.params.size(), state.table.size());
    for (size_t i = 0; i < state.table.size(); ++i) {
      const TensorRef& t = p.param(state.table[i].name);
      EXPECT_EQ(t.dtype, DType::F32);  // the master copy, not the bf16 weights
      EXPECT_EQ(values(t), state.weights[i]) << state.table[i].name;
    }
    EXPECT_NE(p.describe().find("step 12"), std::string::npos) << p.describe();
  }
  EXPECT_EQ(pretrained_model(dir.path("ck")).hash(), state.model.hash());
}

TEST(Pretrained, IgnoresTensorsThatHoldNoParameter) {
  TempDir dir;
  // Older transformers saved RoPE's inv_freq buffers; a tied model's
  // lm_head.weight is overwritten by the embedding in transformers too.
  const auto untied = copy_of(dir, "untied");
  static const std::vector<float> inv_freq(4, 1.0f);
  rewrite_weights(untied, [](std::vector<TensorRef>& t) {
    t.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {4}, inv_freq.data()});
  });
  EXPECT_NO_THROW(pretrained_open(untied));
  edit_config(untied, {{"tie_word_embeddings", true}});
  const Pretrained p = pretrained_open(untied);
  EXPECT_TRUE(p.model.tied_embeddings);
  EXPECT_FALSE(p.params.contains("lm_head.weight"));
}

TEST(Pretrained, DamagedFoldersAreRefusedByTensor) {
  TempDir dir;
  const std::string up = "model.layers.1.mlp.up_proj.weight";
  const auto missing = copy_of(dir, "untied");
  rewrite_weights(missing, [&](std::vector<TensorRef>& t) {
    std::erase_if(t, [&](const TensorRef& r) { return r.name == up; });
  });
  WEFT_EXPECT_THROW_MSG(pretrained_open(missing), FileFormatError, missing.c_str(), up.c_str(), "missing");

  fs::rename(missing, dir.path("shape"));
  rewrite_weights(dir.path("shape"), [&](std::vector<TensorRef>& t) {
    for (auto& r : t)
      if (r.name == up) r.shape = {16, 40};  // the same bytes, transposed shape
  });
  WEFT_EXPECT_THROW_MSG(pretrained_open(dir.path("shape")), FileFormatError, up.c_str(), "[16, 40]",
                        "[40, 16]", "model.safetensors");

  const auto bias = copy_of(dir, "untied_bf16");
  static const std::vector<float> b(32, 0.0f);
  rewrite_weights(bias, [](std::vector<TensorRef>& t) {
    t.push_back({"model.layers.0.self_attn.q_proj.bias", DType::F32, {32}, b.data()});
  });
  WEFT_EXPECT_THROW_MSG(pretrained_open(bias), FileFormatError, "model.layers.0.self_attn.q_proj.bias",
                        "not a parameter");

  fs::remove_all(bias);
  fs::copy(fixture("untied"), bias, fs::copy_options::recursive);
  static const std::vector<int32_t> ids(16, 0);
  rewrite_weights(bias, [](std::vector<TensorRef>& t) {
    for (auto& r : t)
      if (r.name == "model.norm.weight") {
        r.dtype = DType::I32;
        r.data = ids.data();
      }
  });
  WEFT_EXPECT_THROW_MSG(pretrained_open(bias), FileFormatError, "model.norm.weight", "I32");
}

TEST(Pretrained, ShardIndexFaultsNameTheShard) {
  TempDir dir;
  const auto folder = copy_of(dir, "tied_sharded");
  const std::string index = folder + "/" + kHfIndexFile;
  nlohmann::json good;
  std::ifstream(index) >> good;
  const auto with_map = [&](const std::string& tensor, const nlohmann::json& file) {
    nlohmann::json j = good;
    j["weight_map"][tensor] = file;
    std::ofstream(index) << j.dump();
  };
  with_map("model.norm.weight", "model-00009-of-00009.safetensors");
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), FileFormatError, "model.norm.weight",
                        "model-00009-of-00009.safetensors", "missing");
  with_map("model.norm.weight", "model-00001-of-00004.safetensors");
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), FileFormatError, "model.norm.weight",
                        "model-00001-of-00004.safetensors", "does not hold it");
  with_map("model.norm.weight", "../untied/model.safetensors");
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), FileFormatError, "../untied/model.safetensors",
                        "not a file name");
  std::ofstream(index) << R"({"metadata": {}})";
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), FileFormatError, kHfIndexFile, "weight_map");
  fs::remove(index);
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), InputError, "config.json", "model.safetensors",
                        kHfIndexFile);
  std::ofstream(folder + "/pytorch_model.bin") << "pickle";
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), InputError, "pytorch_model.bin", "save_pretrained");
}

TEST(Pretrained, ConfigsWeftCannotComputeAreRefusedByField) {
  TempDir dir;
  const auto folder = copy_of(dir, "untied");
  edit_config(folder, {{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}, {"attention_bias", true}});
  WEFT_EXPECT_THROW_MSG(pretrained_model(folder), InputError, "rope_scaling", "llama3", "attention_bias");
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), InputError, "rope_scaling", "attention_bias");
  edit_config(folder, {{"rope_scaling", nullptr},
                       {"attention_bias", false},
                       {"rope_parameters", {{"rope_type", "yarn"}}},
                       {"mlp_bias", true}});
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), InputError, "rope_parameters", "yarn", "mlp_bias");
  // A complete llama3 scaling is read (tests/e2e checks the loss).
  edit_config(folder, {{"mlp_bias", false},
                       {"rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32},
                                            {"rope_theta", 500000.0}}}});
  EXPECT_EQ(pretrained_open(folder).model.rope_scaling, rope_scaling_llama3(8.0, 1.0, 4.0, 32));
  edit_config(folder, {{"rope_parameters", {{"rope_type", "default"}}}, {"model_type", "mistral"}});
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), InputError, "mistral");
  // A Mixture of Experts is read, and its weights looked for under its
  // family's names: this folder holds a dense Llama's.
  edit_config(folder, {{"model_type", "mixtral"}, {"architectures", {"MixtralForCausalLM"}},
                       {"num_local_experts", 4}, {"num_experts_per_tok", 2}});
  EXPECT_EQ(pretrained_model(folder).moe.experts, 4);
  WEFT_EXPECT_THROW_MSG(pretrained_open(folder), FileFormatError, "block_sparse_moe.", "is missing");
}

TEST(Pretrained, WhatIsNotACheckpointIsSaidSo) {
  TempDir dir;
  WEFT_EXPECT_THROW_MSG(pretrained_open(dir.path("nope")), InputError, "nope", "does not exist");
  WEFT_EXPECT_THROW_MSG(pretrained_open(dir.file("w.safetensors", "x")), InputError, "is a file",
                        "config.json");
  fs::create_directories(dir.path("empty"));
  WEFT_EXPECT_THROW_MSG(pretrained_open(dir.path("empty")), InputError, "not a checkpoint", "config.json",
                        "manifest.json");
  WEFT_EXPECT_THROW_MSG(pretrained_model(dir.path("empty")), InputError, "not a checkpoint");
  // A run's checkpoint root: the message points at the checkpoint inside.
  const auto state = test::make_state("tiny-test", 3);
  save_checkpoint(dir.path("run/checkpoints/step_000004"), state.model_tensors(), state.optimizer_tensors(),
                  test::make_manifest(state.model, 4));
  WEFT_EXPECT_THROW_MSG(pretrained_open(dir.path("run/checkpoints")), InputError, "not a checkpoint",
                        "step_000004");
}

TEST(Pretrained, TheRunsModelMustMatchButMayPadTheVocabulary) {
  const ModelSpec m = pretrained_model(fixture("untied"));
  EXPECT_NO_THROW(pretrained_check(m, m, "f"));
  ModelSpec padded = m;
  padded.vocab = 72;
  EXPECT_NO_THROW(pretrained_check(m, padded, "f"));
  ModelSpec cut = m;
  cut.vocab = 48;
  WEFT_EXPECT_THROW_MSG(pretrained_check(m, cut, "f"), InputError, "vocab: checkpoint 64, this run 48",
                        "pad");
  ModelSpec other = padded;
  other.hidden = 32;
  other.layers = 2;
  other.tied_embeddings = true;
  other.rope_theta = 10000;
  WEFT_EXPECT_THROW_MSG(pretrained_check(m, other, "folder/x"), InputError, "folder/x",
                        "hidden: checkpoint 16, this run 32", "layers: checkpoint 4, this run 2",
                        "rope_theta: checkpoint 500000, this run 10000",
                        "tied_embeddings: checkpoint false, this run true");
  try {
    pretrained_check(m, other, "f");
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find("vocab"), std::string::npos) << e.what();
  }
}

// An MoE model read from the folder transformers wrote goes back out as
// transformers stores it: every tensor of the original folder, the same
// names, shapes, dtype's values and nothing else, Llama 4's experts fused
// again and its q and k rows in Meta's order again; and the exported config
// reads back as the same model. (transformers loads what it wrote, so it
// loads these.)
TEST(Pretrained, MoeFoldersExportBackAsTransformersStoresThem) {
  TempDir dir;
  for (const char* folder : {"mixtral", "mixtral_wide", "qwen3_moe", "llama4", "llama4_chunk"}) {
    SCOPED_TRACE(folder);
    const std::string in = std::string(WEFT_FIXTURES_DIR) + "/hf_moe/" + folder;
    const Pretrained src = pretrained_open(in);
    std::vector<TensorRef> tensors;
    for (const auto& p : hf_param_table(src.model)) tensors.push_back(src.param(p.name));
    const std::string out = dir.path(folder);
    hf_folder_write(out, {in}, src.model, src.bos_token_id, src.eos_token_id, tensors);

    const HfFolder want = hf_folder_open(in), got = hf_folder_open(out);
    EXPECT_EQ(got.model.hash(), want.model.hash());
    EXPECT_EQ(got.model.moe, want.model.moe);
    EXPECT_EQ(got.model.attention, want.model.attention);
    std::set<std::string> want_names, got_names;
    for (const auto& [name, t] : want.tensors) want_names.insert(name);
    for (const auto& [name, t] : got.tensors) got_names.insert(name);
    EXPECT_EQ(got_names, want_names);
    int64_t compared = 0;
    for (const auto& [name, w] : want.tensors) {
      const auto it = got.tensors.find(name);
      if (it == got.tensors.end()) continue;
      const TensorRef& g = it->second;
      ASSERT_EQ(g.shape, w.shape) << name;
      ASSERT_EQ(g.dtype, w.dtype) << name;
      EXPECT_EQ(std::memcmp(g.data, w.data, size_t(w.bytes())), 0) << name;
      ++compared;
    }
    EXPECT_GT(compared, 10);
  }
}

}  // namespace
}  // namespace weft::checkpoint
