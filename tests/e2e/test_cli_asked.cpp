// What the user asked for is run, or refused with the reason: knobs beside
// --layout that disagree with it, LoRA settings without LoRA or out of
// range, FP8 that would quantise nothing, another corpus on resume, the
// layouts the trainer cannot run yet, and the N of MFU. Bad files are
// refused by name instead of crashing or training NaN: an adapter folder
// whose config is a folder, non-finite pretrained weights, PEFT settings of
// the wrong type or range, and a newest checkpoint whose checksum fails.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

const std::string kLayout = " --layout tp1-pp1-dp1-mb2";

// Exit 2, and the message holds `says`.
void expect_refused(const std::string& args, const std::string& says) {
  const auto r = run_weft(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
  EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
}

nlohmann::json header_of(const std::string& metrics) {
  std::ifstream in(metrics);
  std::string line;
  std::getline(in, line);
  return nlohmann::json::parse(line);
}

TEST(CliAsked, KnobsBesideTheLayoutMustAgreeWithIt) {
  TempDir dir;
  const std::string train = "train --data " + corpus(dir) + kSmall + " --steps 1 --out " + dir.path("a");
  expect_refused(train + " --mb 4" + kLayout, "--mb 4 and --layout tp1-pp1-dp1-mb2 disagree (the layout says mb2)");
  expect_refused(train + " --ckpt full" + kLayout, "--ckpt full and --layout");
  expect_refused(train + " --fp8 tensorwise" + kLayout, "the layout says no FP8");
  expect_refused(train + " --cp 2" + kLayout, "the layout says cp1");
  expect_refused(train + " --attn materialized" + kLayout, "the layout says attn:flash");
  // Saying the same thing twice is no disagreement.
  const auto r = run_weft(train + " --mb 2 --attn flash" + kLayout);
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(CliAsked, LoraSettingsWithoutLoraOrOutOfRangeAreRefused) {
  TempDir dir;
  const std::string train = "train --data " + corpus(dir) + kSmall + " --steps 1 --out " + dir.path("a") + kLayout;
  expect_refused(train + " --lora-alpha 16", "--lora-alpha 16 sets LoRA's adapters, but LoRA is off");
  expect_refused(train + " --lora-targets q,v", "--lora-targets q,v sets LoRA's adapters, but LoRA is off");
  expect_refused(train + " --lora-dropout 0.1", "--lora-dropout 0.1 sets LoRA's adapters, but LoRA is off");
  expect_refused(train + " --lora-gate-up-rank 8", "--lora-gate-up-rank 8 sets LoRA's adapters, but LoRA is off");
  expect_refused(train + " --lora 4 --lora-gate-up-rank 8",
                 "--lora-gate-up-rank 8 sets an MoE model's routed experts' gate_up adapters' rank, but tiny has none");
  expect_refused(train + " --lora 4 --lora-alpha 0", "--lora-alpha 0 must be a positive number");
  expect_refused(train + " --lora 4 --lora-alpha -2", "--lora-alpha -2 must be a positive number");
  // tiny's k and v are 128 x 64: a rank above 64 is past them.
  expect_refused(train + " --lora 100000", "--lora 100000 is past the width of tiny's q layer (128 x 128)");
  expect_refused(train + " --lora 65", "--lora 65 is past the width of tiny's k layer (64 x 128)");
  EXPECT_EQ(run_weft(train + " --lora 64").code, 0);
}

TEST(CliAsked, Fp8ThatQuantisesNothingIsRefusedAndPartialFp8IsSaid) {
  TempDir dir;
  const std::string data = corpus(dir);
  // tiny-test (C 32): no GEMM has dims that are multiples of 128.
  expect_refused("train --data " + data + " --model tiny-test --seq 32 --global-batch 4 --threads 1 --steps 1 --vocab 256 "
                 "--layout tp1-pp1-dp1-mb2-fp8:blockwise --out " + dir.path("a"),
                 "no GEMM runs in FP8 under fp8:blockwise");
  expect_refused("tune --dry-run --model tiny-test --gpu h100 --gpus 1 --fp8 blockwise", "no GEMM runs in FP8");
  // tiny's q and o qualify for block scaling, the rest stay in the compute precision: said and recorded.
  const auto r = run_weft("train --data " + data + " --model tiny --seq 128 --global-batch 4 --threads 1 --steps 1 "
                          "--layout tp1-pp1-dp1-mb2-fp8:blockwise --out " + dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("k, v, gate, up and down stay in fp32 on every rank"), std::string::npos) << r.out;
  const auto h = header_of(dir.path("b/metrics.jsonl"));
  EXPECT_NE(h["fp8_bf16_gemms"].get<std::string>().find("block scaling needs K, N"), std::string::npos) << h.dump();
}

TEST(CliAsked, AnotherCorpusOnResumeNeedsConsentAndIsRecorded) {
  TempDir dir;
  const std::string a = corpus(dir);
  const std::string b = dir.file("b.txt", std::string(20000, 'x'));
  auto r = run_weft("data prepare --input " + b + " --out " + dir.path("b-tok"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string train = "train" + kSmall + kLayout + " --out " + dir.path("run");
  ASSERT_EQ(run_weft(train + " --data " + a + " --steps 2").code, 0);
  expect_refused(train + " --data " + dir.path("b-tok") + " --steps 3 --resume",
                 "--data \"" + dir.path("b-tok") + "\" (the run was trained with \"" + a + "\")");
  r = run_weft(train + " --data " + dir.path("b-tok") + " --steps 3 --resume --change data");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<nlohmann::json> headers;
  std::ifstream in(dir.path("run/metrics.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j["kind"] == "run") headers.push_back(j);
  ASSERT_EQ(headers.size(), 2u);
  EXPECT_EQ(headers[1]["changed"][0]["field"], "data") << headers[1].dump();
  EXPECT_EQ(headers[1]["data"], dir.path("b-tok"));
}

TEST(CliAsked, LayoutsTheTrainerCannotRunAreMarkedInEveryFormatAndNeverSaved) {
  TempDir dir;
  // cp 2 over the all-gather on GPUs with the materialized attention, which
  // takes no blocks of the sequence there, and the model ranks it first.
  const std::string dry =
      "tune --dry-run --model llama3.1-8b --gpu h100 --gpus 8 --seq 8192 --global-batch 8 --cp 1 2 "
      "--cp-comm allgather --attn materialized --top 3";
  auto r = run_weft(dry + " --format json --out " + dir.path("s.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(slurp(dir.path("s.json")));
  ASSERT_TRUE(j["layouts"][0].contains("cannot_run_yet")) << j["layouts"][0].dump();
  EXPECT_NE(j["layouts"][0]["cannot_run_yet"].get<std::string>().find("needs attn:flash or attn:cudnn"),
            std::string::npos);
  r = run_weft(dry + " --format csv");
  EXPECT_NE(r.out.find(",cannot_run_yet\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("needs attn:flash or attn:cudnn"), std::string::npos) << r.out;
  r = run_weft(dry + " --format html --out " + dir.path("s.html"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(slurp(dir.path("s.html")).find("\"cannot_run_yet\":\"context parallelism"), std::string::npos);
  r = run_weft(dry + " --save-recipe " + dir.path("r.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("the recipe takes the best that can"), std::string::npos) << r.out;
  const auto recipe = nlohmann::json::parse(slurp(dir.path("r.json")));
  EXPECT_EQ(recipe["layout"].get<std::string>().find("-cp"), std::string::npos) << recipe.dump();
  // cuDNN takes every transport's calls: the 128k space's first layout is
  // not marked, and is saved as it is.
  for (const char* comm : {"ring", "allgather", "a2a"}) {
    SCOPED_TRACE(comm);
    r = run_weft(std::string("tune --dry-run --model llama3.1-8b --gpu h100 --gpus 8 --seq 131072 --global-batch 8 "
                             "--cp 8 --cp-comm ") +
                 comm + " --attn cudnn --top 1 --format csv --save-recipe " + dir.path("cudnn.json"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("-attn:cudnn-"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string("-cp:") + comm), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(",\"\"\n"), std::string::npos) << r.out;  // an empty cannot_run_yet
    EXPECT_EQ(r.out.find("the recipe takes the best that can"), std::string::npos) << r.out;
    EXPECT_NE(slurp(dir.path("cudnn.json")).find("attn:cudnn"), std::string::npos);
  }
}

TEST(CliAsked, TheHeadersStateTheNOfMfu) {
  TempDir dir;
  const auto r = run_weft("tune --dry-run --model llama3.1-8b --gpu h100 --gpus 8 --top 1");
  EXPECT_NE(r.out.find("N = 7.50B (the parameters but the input embedding's 525.3M"), std::string::npos) << r.out;
  const auto t = run_weft("train --data " + corpus(dir) + kSmall + kLayout + " --steps 1 --out " + dir.path("a"));
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("6N + 12 L C T model FLOPs a token, N = "), std::string::npos) << t.out;
  const auto h = header_of(dir.path("a/metrics.jsonl"));
  EXPECT_LT(h["mfu_params"].get<int64_t>(), h["params"]["total"].get<int64_t>());
}

// Writes float `value` over the first element of tensor `name` of a
// safetensors file.
void poke_float(const std::string& file, const std::string& name, float value) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const auto j = nlohmann::json::parse(header);
  ASSERT_TRUE(j.contains(name)) << header;
  ASSERT_EQ(j[name]["dtype"], "F32");
  f.seekp(std::streamoff(8 + n + j[name]["data_offsets"][0].get<uint64_t>()));
  f.write(reinterpret_cast<const char*>(&value), 4);
}

TEST(CliAsked, BadFilesAreRefusedByName) {
  TempDir dir;
  const std::string data = corpus(dir);
  const std::string train = "train --data " + data + kSmall + kLayout;
  ASSERT_EQ(run_weft(train + " --steps 4 --ckpt-every 2 --out " + dir.path("base")).code, 0);
  ASSERT_EQ(run_weft("export --checkpoint " + dir.path("base/checkpoints/step_000004") + " --out " + dir.path("hf")).code, 0);

  // Non-finite pretrained weights: refused at load, the tensor named.
  fs::copy(dir.path("hf"), dir.path("nan-hf"));
  poke_float(dir.path("nan-hf/model.safetensors"), "model.layers.1.self_attn.q_proj.weight", NAN);
  expect_refused(train + " --steps 1 --init " + dir.path("nan-hf") + " --out " + dir.path("x"),
                 "tensor model.layers.1.self_attn.q_proj.weight holds nan at [0, 0]");
  fs::copy(dir.path("hf"), dir.path("inf-hf"));
  poke_float(dir.path("inf-hf/model.safetensors"), "model.norm.weight", INFINITY);
  expect_refused(train + " --steps 1 --init " + dir.path("inf-hf") + " --out " + dir.path("y"),
                 "tensor model.norm.weight holds inf");

  // PEFT folders: a config that is a folder, switches that are not booleans,
  // a dropout out of range, non-finite adapters.
  ASSERT_EQ(run_weft(train + " --steps 1 --init " + dir.path("hf") + " --lora 4 --out " + dir.path("lora")).code, 0);
  ASSERT_EQ(run_weft("export --lora --checkpoint " + dir.path("lora/checkpoints/step_000001") + " --out " +
                     dir.path("peft")).code, 0);
  const std::string lora = train + " --steps 1 --init " + dir.path("hf") + " --lora 4 --out " + dir.path("z") + " --lora-init ";
  fs::create_directories(dir.path("peft-dir/adapter_config.json"));
  fs::copy_file(dir.path("peft/adapter_model.safetensors"), dir.path("peft-dir/adapter_model.safetensors"));
  expect_refused(lora + dir.path("peft-dir"), "is not a PEFT adapter folder");
  const auto config = nlohmann::json::parse(slurp(dir.path("peft/adapter_config.json")));
  for (const auto& [key, value, says] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"use_dora", "yes", "'use_dora' must be true or false"},
           {"fan_in_fan_out", 1, "'fan_in_fan_out' must be true or false"},
           {"lora_bias", true, "lora_bias is true"},
           {"lora_dropout", 2, "'lora_dropout' must lie in [0, 1)"},
           {"lora_alpha", "8", "'lora_alpha' must be a number"}}) {
    const std::string folder = dir.path("peft-" + key);
    fs::copy(dir.path("peft"), folder);
    auto c = config;
    c[key] = value;
    std::ofstream(folder + "/adapter_config.json") << c.dump(2);
    expect_refused(lora + folder, says);
  }
  fs::copy(dir.path("peft"), dir.path("peft-nan"));
  const auto st = slurp(dir.path("peft/adapter_model.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  std::string first;
  const auto adapter_header = nlohmann::json::parse(st.substr(8, n));
  for (const auto& [key, value] : adapter_header.items())
    if (key != "__metadata__" && first.empty()) first = key;
  poke_float(dir.path("peft-nan/adapter_model.safetensors"), first, NAN);
  expect_refused(lora + dir.path("peft-nan"), "holds nan");

  // The newest checkpoint's checksum fails: refused, naming the intact one.
  {
    std::fstream f(dir.path("base/checkpoints/step_000004/model.safetensors"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-16, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-16, std::ios::end);
    c = char(~c);
    f.write(&c, 1);
  }
  expect_refused(train + " --steps 6 --resume --out " + dir.path("base"),
                 "give --resume-from " + dir.path("base/checkpoints/step_000002"));
}

}  // namespace
}  // namespace weft::test
