// Checkpoint folders: round trip, damage detection, crash safety, model
// compatibility and the naming table.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/json_io.h"
#include "tests/unit/checkpoint/checkpoint_test_util.h"
#include "tests/unit/test_util.h"

namespace weft::checkpoint {
namespace {

namespace fs = std::filesystem;
using test::make_manifest;
using test::make_state;
using test::TrainState;
using weft::test::TempDir;

// Expects `f` to throw E with a message holding every one of `parts`.
template <typename E, typename F>
void expect_error(F f, std::initializer_list<std::string> parts) {
  try {
    f();
    FAIL() << "no error; expected one mentioning '" << *parts.begin() << "'";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c;
  f.get(c);
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x10));
}

std::string save_state(const std::string& dir, const TrainState& s, int64_t step,
                       const SaveOptions& options = {}) {
  save_checkpoint(dir, s.model_tensors(), s.optimizer_tensors(), make_manifest(s.model, step),
                  options);
  return dir;
}

void expect_same_tensors(const SafetensorsFile& f, const std::vector<TensorRef>& want) {
  ASSERT_EQ(f.tensors().size(), want.size());
  for (const auto& w : want) {
    const TensorRef& g = f.at(w.name);
    EXPECT_EQ(g.dtype, w.dtype) << w.name;
    ASSERT_EQ(g.shape, w.shape) << w.name;
    EXPECT_EQ(std::memcmp(g.data, w.data, static_cast<size_t>(w.bytes())), 0) << w.name;
  }
}

TEST(HfNames, TableMatchesHuggingFace) {
  const ModelSpec m = model_preset("tiny-test");  // V96 C32 F80 L8 H4 H_kv2 D8
  const auto table = hf_param_table(m);
  ASSERT_EQ(table.size(), 9u * 8 + 3);
  EXPECT_EQ(table.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(table.front().shape, (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(table[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(table[2].shape, (std::vector<int64_t>{16, 32}));  // k_proj: H_kv*D x C
  EXPECT_EQ(table[4].shape, (std::vector<int64_t>{32, 32}));  // o_proj: C x H*D
  EXPECT_EQ(table[7].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(table[7].shape, (std::vector<int64_t>{32, 80}));
  EXPECT_EQ(table[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(table[table.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(table.back().name, "lm_head.weight");
  EXPECT_EQ(hf_param_name(ParamKind::input_layernorm, 7), "model.layers.7.input_layernorm.weight");
  EXPECT_EQ(hf_param_table(model_preset("tiny-tied")).back().name, "model.norm.weight");

  int64_t total = 0;
  for (const auto& p : table) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    total += n;
  }
  EXPECT_EQ(total, m.param_count());

  OptimState s;
  std::string param;
  ASSERT_TRUE(
      optim_state_parse(optim_state_name(OptimState::exp_avg_sq, "model.norm.weight"), s, param));
  EXPECT_EQ(s, OptimState::exp_avg_sq);
  EXPECT_EQ(param, "model.norm.weight");
  ASSERT_TRUE(optim_state_parse("exp_avg.lm_head.weight", s, param));
  EXPECT_EQ(s, OptimState::exp_avg);
  EXPECT_FALSE(optim_state_parse("momentum.lm_head.weight", s, param));
}

TEST(Checkpoint, RoundTripIsBitExact) {
  TempDir tmp;
  for (DType dtype : {DType::F32, DType::BF16}) {
    const TrainState s = make_state("tiny-test", 1, dtype);
    const std::string dir = tmp.path(fmt::format("ckpt_{}/step_000007", to_string(dtype)));
    const Manifest saved =
        save_checkpoint(dir, s.model_tensors(), s.optimizer_tensors(), make_manifest(s.model, 7));
    EXPECT_EQ(saved.weft_version, WEFT_VERSION);
    ASSERT_EQ(saved.files.size(), 2u);

    const Checkpoint c = load_checkpoint(dir);
    const Manifest& m = c.manifest;
    const Manifest want = make_manifest(s.model, 7);
    EXPECT_EQ(m.format_version, kCheckpointFormatVersion);
    EXPECT_EQ(m.weft_version, WEFT_VERSION);
    EXPECT_EQ(m.step, 7);
    EXPECT_EQ(m.data_position, want.data_position);
    EXPECT_EQ(m.rng_state, want.rng_state);
    EXPECT_EQ(m.optimizer.kind, "adamw");
    EXPECT_EQ(m.optimizer.lr, want.optimizer.lr);
    EXPECT_EQ(m.optimizer.beta2, want.optimizer.beta2);
    EXPECT_EQ(m.optimizer.weight_decay, want.optimizer.weight_decay);
    EXPECT_EQ(m.optimizer.step, 7);
    EXPECT_EQ(m.layout, want.layout);
    EXPECT_EQ(m.model.hash(), s.model.hash());
    EXPECT_EQ(m.model.name, "tiny-test");
    EXPECT_EQ(m.run, want.run);
    EXPECT_EQ(m.bos_token_id, 1);
    EXPECT_EQ(m.eos_token_id, 2);
    ASSERT_EQ(m.files.size(), 2u);
    EXPECT_EQ(m.file(kModelFile)->bytes,
              static_cast<int64_t>(fs::file_size(fs::path(dir) / kModelFile)));
    EXPECT_EQ(m.file(kModelFile)->checksum, saved.file(kModelFile)->checksum);
    EXPECT_EQ(c.model.metadata().at("format"), "pt");

    expect_same_tensors(c.model, s.model_tensors());
    expect_same_tensors(c.optimizer, s.optimizer_tensors());
    // The model file is in table order whatever order save was given.
    EXPECT_EQ(c.model.tensors().front().name, "model.embed_tokens.weight");
    EXPECT_EQ(c.model.tensors().back().name, "lm_head.weight");
  }
}

TEST(Checkpoint, CorruptedByteIsRefused) {
  TempDir tmp;
  const TrainState s = make_state("tiny-test", 2);
  for (const char* file : {kModelFile, kOptimizerFile}) {
    const std::string dir = save_state(tmp.path(fmt::format("c_{}", file)), s, 3);
    const std::string path = (fs::path(dir) / file).string();
    flip_byte(path, static_cast<int64_t>(fs::file_size(path)) / 2);  // inside a tensor
    expect_error<FileFormatError>([&] { load_checkpoint(dir); },
                                  {dir, file, "checksum", "corrupted"});
  }
  // A damaged header is caught by the checksum before it is parsed.
  const std::string dir = save_state(tmp.path("c_header"), s, 3);
  flip_byte((fs::path(dir) / kModelFile).string(), 20);
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"checksum"});
}

TEST(Checkpoint, TruncatedOrMissingFileIsRefused) {
  TempDir tmp;
  const TrainState s = make_state("tiny-test", 3);
  const std::string dir = save_state(tmp.path("t"), s, 3);
  const fs::path opt = fs::path(dir) / kOptimizerFile;
  fs::resize_file(opt, fs::file_size(opt) - 4);
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {kOptimizerFile, "truncated"});
  fs::remove(opt);
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {kOptimizerFile, "missing"});
  fs::remove(fs::path(dir) / kManifestFile);
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {kManifestFile, "missing"});
  expect_error<InputError>([&] { load_checkpoint(tmp.path("nothing_here")); }, {"does not exist"});
}

TEST(Checkpoint, BadManifestIsRefused) {
  TempDir tmp;
  const TrainState s = make_state("tiny-test", 4);
  const std::string dir = save_state(tmp.path("m"), s, 3);
  const std::string path = (fs::path(dir) / kManifestFile).string();
  const nlohmann::json good = json_read_file(path, "manifest");
  const auto with = [&](auto edit) {
    nlohmann::json j = good;
    edit(j);
    std::ofstream(path) << j.dump(2);
  };
  with([](nlohmann::json& j) { j.erase("step"); });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"'step'", "missing"});
  with([](nlohmann::json& j) { j["format_version"] = 99; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"format version 99"});
  with([](nlohmann::json& j) { j["model"]["layers"] = 4; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"model.hash"});
  with([](nlohmann::json& j) { j["optimizer"]["lr"] = "fast"; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"optimizer.lr"});
  // Values no run could have saved: a resume must not train on with them.
  with([](nlohmann::json& j) { j["optimizer"]["beta1"] = 1.0; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"optimizer.beta1", "is 1", "[0, 1)"});
  with([](nlohmann::json& j) { j["optimizer"]["eps"] = 0.0; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"optimizer.eps"});
  with([](nlohmann::json& j) { j["optimizer"]["weight_decay"] = -0.1; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"optimizer.weight_decay", "-0.1"});
  with([](nlohmann::json& j) { j["optimizer"]["grad_clip"] = -1.0; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"optimizer.grad_clip"});
  with([](nlohmann::json& j) { j["layout"] = "tp2-warp9"; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"layout"});
  with([](nlohmann::json& j) { j["files"][0]["name"] = "../x"; });
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"files[0].name"});
  std::ofstream(path) << "{ not json";
  expect_error<FileFormatError>([&] { load_checkpoint(dir); }, {"not valid JSON"});
}

TEST(Checkpoint, SaveRefusesWrongTensors) {
  TempDir tmp;
  const TrainState s = make_state("tiny-test", 5);
  const Manifest man = make_manifest(s.model, 1);
  const std::string dir = tmp.path("w/step_000001");
  auto model = s.model_tensors();
  auto optim = s.optimizer_tensors();

  auto missing = model;
  missing.pop_back();  // the embedding
  expect_error<InputError>([&] { save_checkpoint(dir, missing, optim, man); },
                           {"model.embed_tokens.weight", "missing"});
  auto misshapen = model;
  misshapen[0].shape = {96, 31};
  expect_error<InputError>([&] { save_checkpoint(dir, misshapen, optim, man); },
                           {"lm_head.weight", "[96, 31]", "[96, 32]"});
  const TrainState tied = make_state("tiny-tied", 5);
  auto extra = tied.model_tensors();
  extra.push_back({"lm_head.weight", DType::F32, {96, 32}, s.weights[0].data()});
  expect_error<InputError>([&] { save_checkpoint(dir, extra, {}, make_manifest(tied.model, 1)); },
                           {"tied"});
  auto bad_optim = optim;
  bad_optim[0].name = "momentum.model.norm.weight";
  expect_error<InputError>([&] { save_checkpoint(dir, model, bad_optim, man); }, {"momentum"});
  bad_optim[0].name = "exp_avg.model.layers.99.mlp.up_proj.weight";
  expect_error<InputError>([&] { save_checkpoint(dir, model, bad_optim, man); },
                           {"not a parameter"});
  EXPECT_FALSE(fs::exists(dir));

  // A folder that is not a checkpoint is never replaced.
  TempDir other;
  other.file("precious.txt", "keep me");
  expect_error<InputError>([&] { save_checkpoint(other.path(), model, optim, man); },
                           {"not a checkpoint folder"});
  EXPECT_TRUE(fs::exists(other.path("precious.txt")));
}

TEST(Checkpoint, TiedModelHasNoHead) {
  TempDir tmp;
  const TrainState s = make_state("tiny-tied", 6);
  const std::string dir = save_state(tmp.path("tied"), s, 2);
  const Checkpoint c = load_checkpoint(dir);
  EXPECT_EQ(c.model.find("lm_head.weight"), nullptr);
  EXPECT_TRUE(c.manifest.model.tied_embeddings);
}

TEST(Checkpoint, ModelMismatchNamesEachField) {
  const Manifest man = make_manifest(model_preset("tiny-test"), 1);
  EXPECT_NO_THROW(check_compatible(man, model_preset("tiny-test")));
  ModelSpec renamed = model_preset("tiny-test");
  renamed.name = "my-copy";
  renamed.max_seq = 4096;
  EXPECT_NO_THROW(check_compatible(man, renamed));
  ModelSpec other = model_preset("tiny-test");
  other.vocab = 128;
  other.layers = 4;
  other.kv_heads = 4;
  other.tied_embeddings = true;
  expect_error<InputError>(
      [&] { check_compatible(man, other, "checkpoint 'ck/step_000001'"); },
      {"checkpoint 'ck/step_000001'", "different model", "vocab: checkpoint 96, this run 128",
       "layers: checkpoint 8, this run 4", "kv_heads: checkpoint 2, this run 4",
       "tied_embeddings"});
  EXPECT_EQ(model_differences(man.model, other).size(), 4u);
}

TEST(Checkpoint, LatestFindsNewestCompleteAndIgnoresLeftovers) {
  TempDir tmp;
  const TrainState s = make_state("tiny-test", 7);
  const std::string root = tmp.path("run");
  EXPECT_FALSE(latest_checkpoint(root).has_value());
  EXPECT_EQ(checkpoint_dir_name(100), "step_000100");
  EXPECT_EQ(checkpoint_dir_name(1234567), "step_1234567");
  save_state(root + "/" + checkpoint_dir_name(100), s, 100);
  save_state(root + "/" + checkpoint_dir_name(20) + "/", s, 20);  // trailing slash
  EXPECT_EQ(latest_checkpoint(root), root + "/step_000100");

  // Leftovers of saves that died, and folders that are not checkpoints.
  fs::create_directories(root + "/step_000300.tmp-12345");
  std::ofstream(root + "/step_000300.tmp-12345/model.safetensors") << "partial";
  fs::create_directories(root + "/step_000400");  // no manifest: never committed by weft
  fs::copy(root + "/step_000100", root + "/step_000500", fs::copy_options::recursive);
  fs::resize_file(root + "/step_000500/model.safetensors", 100);  // damaged
  fs::create_directories(root + "/step_000600x");
  fs::create_directories(root + "/notes");
  std::ofstream(root + "/step_000700") << "a file";
  EXPECT_EQ(latest_checkpoint(root), root + "/step_000100");

  // A save that died after moving step_000200 aside, before the new one was
  // in place: the moved-aside folder is still the newest good checkpoint.
  fs::copy(root + "/step_000100", root + "/step_000200.old-999", fs::copy_options::recursive);
  EXPECT_EQ(latest_checkpoint(root), root + "/step_000200.old-999");
  fs::copy(root + "/step_000100", root + "/step_000200", fs::copy_options::recursive);
  EXPECT_EQ(latest_checkpoint(root), root + "/step_000200");
}

// --resume continues from the newest checkpoint or refuses: a damaged newest
// one is named with its fault and the intact one to give --resume-from, and
// the run never falls back to it by itself.
TEST(Checkpoint, ResumeRefusesADamagedNewestCheckpoint) {
  TempDir tmp;
  const TrainState s = make_state("tiny-test", 12);
  const std::string root = tmp.path("run");
  EXPECT_FALSE(resume_checkpoint(root).has_value());
  save_state(root + "/step_000002", s, 2);
  mark_latest(root, "step_000002");
  save_state(root + "/step_000004", s, 4);
  mark_latest(root, "step_000004");
  EXPECT_EQ(resume_checkpoint(root), root + "/step_000004");

  fs::resize_file(root + "/step_000004/model.safetensors", 1000);
  EXPECT_EQ(latest_checkpoint(root), root + "/step_000002");  // what a reader of any checkpoint takes
  expect_error<InputError>([&] { resume_checkpoint(root); },
                     {"cannot resume", root + "/step_000004 is damaged",
                      "model.safetensors is 1000 bytes, its manifest says",
                      "--resume-from " + root + "/step_000002"});

  // Gone altogether: refused the same way.
  fs::remove_all(root + "/step_000004");
  expect_error<InputError>([&] { resume_checkpoint(root); },
                     {root + "/step_000004 is damaged (it is missing)", "--resume-from " + root + "/step_000002"});

  // A save that died with step_000004 moved aside: the old folder stands in.
  fs::copy(root + "/step_000002", root + "/step_000004.old-77", fs::copy_options::recursive);
  EXPECT_EQ(resume_checkpoint(root), root + "/step_000004.old-77");
  fs::remove_all(root + "/step_000004.old-77");

  // Nothing intact left: the message says how to start again.
  fs::resize_file(root + "/step_000002/optimizer.safetensors", 10);
  fs::copy(root + "/step_000002", root + "/step_000004", fs::copy_options::recursive);
  expect_error<InputError>([&] { resume_checkpoint(root); }, {"No intact checkpoint is left", "--overwrite"});

  // Without "latest": the highest step that has a manifest; a bare folder
  // was never a checkpoint.
  TempDir tmp2;
  const std::string r2 = tmp2.path("run");
  save_state(r2 + "/step_000010", s, 10);
  fs::create_directories(r2 + "/step_000020");
  EXPECT_EQ(resume_checkpoint(r2), r2 + "/step_000010");
  fs::resize_file(r2 + "/step_000010/model.safetensors", 5);
  expect_error<InputError>([&] { resume_checkpoint(r2); }, {r2 + "/step_000010 is damaged"});
}

// The save fails partway (an exception at each stage): the folder it was
// writing is removed and the earlier checkpoint is untouched.
TEST(CheckpointCrash, FailedSaveKeepsPreviousCheckpoint) {
  const TrainState a = make_state("tiny-test", 8);
  const TrainState b = make_state("tiny-test", 9);
  for (const char* stage : {"model", "optimizer", "manifest", "synced"}) {
    TempDir tmp;
    const std::string root = tmp.path("run");
    save_state(root + "/step_000100", a, 100);
    SaveOptions fail_at;
    fail_at.on_stage = [&](std::string_view s) {
      if (s == stage) throw std::runtime_error("disk on fire");
    };
    // A new step, and a replacement of the same step.
    EXPECT_THROW(save_state(root + "/step_000200", b, 200, fail_at), std::runtime_error);
    EXPECT_THROW(save_state(root + "/step_000100", b, 101, fail_at), std::runtime_error);
    EXPECT_FALSE(fs::exists(root + "/step_000200")) << stage;
    EXPECT_EQ(std::distance(fs::directory_iterator(root), fs::directory_iterator()), 1) << stage;
    ASSERT_EQ(latest_checkpoint(root), root + "/step_000100");
    const Checkpoint c = load_checkpoint(root + "/step_000100");
    EXPECT_EQ(c.manifest.step, 100);
    expect_same_tensors(c.model, a.model_tensors());
  }
}

// The process dies (no unwinding, no clean-up) at each stage of a save, in a
// forked child. Whatever the moment, a complete checkpoint stays on disk,
// latest_checkpoint finds it, and it loads.
TEST(CheckpointCrash, KilledSaveLeavesAGoodCheckpoint) {
  const TrainState a = make_state("tiny-test", 10);
  const TrainState b = make_state("tiny-test", 11);
  for (const char* stage : {"model", "optimizer", "manifest", "synced", "swapped"}) {
    TempDir tmp;
    const std::string root = tmp.path("run");
    save_state(root + "/step_000100", a, 100);
    SaveOptions die_at;
    die_at.on_stage = [&](std::string_view s) {
      if (s == stage) std::_Exit(3);
    };
    const bool committed = std::string_view(stage) == "swapped";

    // Dies while saving a new step.
    EXPECT_EXIT(save_state(root + "/step_000200", b, 200, die_at), testing::ExitedWithCode(3), "");
    const auto latest = latest_checkpoint(root);
    ASSERT_TRUE(latest.has_value()) << stage;
    EXPECT_EQ(*latest, root + (committed ? "/step_000200" : "/step_000100")) << stage;
    EXPECT_EQ(load_checkpoint(*latest).manifest.step, committed ? 200 : 100) << stage;

    // Dies while replacing the checkpoint of the same step.
    EXPECT_EXIT(save_state(root + "/step_000100", b, 101, die_at), testing::ExitedWithCode(3), "");
    const Checkpoint c = load_checkpoint(root + "/step_000100");
    EXPECT_EQ(c.manifest.step, committed ? 101 : 100) << stage;
    expect_same_tensors(c.model, (committed ? b : a).model_tensors());

    // A later save succeeds beside the leftovers.
    save_state(root + "/step_000300", b, 300);
    EXPECT_EQ(latest_checkpoint(root), root + "/step_000300");
  }
}

}  // namespace
}  // namespace weft::checkpoint
