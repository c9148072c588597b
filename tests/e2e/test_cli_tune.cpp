// `weft tune --dry-run` end to end: the README's report, machine formats, and
// one clear line with exit code 2 for every kind of bad input.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "cli_runner.h"

namespace weft::test {
namespace {

// `weft presets` lists every name --model and --gpu take, cluster presets too.
TEST(CliPresets, ListsModelsDevicesAndClusters) {
  const auto r = run_weft("presets");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* name : {"llama3.2-1b", "tiny", "a100-80gb", "h100", "cpu", "dgx-a100", "dgx-a100-40gb", "dgx-h100",
                           "dgx-h200"})
    EXPECT_NE(r.out.find(std::string("  ") + name + " "), std::string::npos) << name << "\n" << r.out;
  // Each cluster name is accepted where the list says.
  EXPECT_EQ(run_weft("tune --dry-run --model tiny --gpu dgx-h100 --gpus 16 --top 1").code, 0);
}

TEST(CliTune, ReadmeDryRunReport) {
  const auto r = run_weft(
      "tune --dry-run --model llama-13b --gpu a100-80gb --gpus 64 --seq 2048 --global-batch 2048");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"llama-13b", "64 x a100-80gb", "rank", "MFU", "312.0 TFLOP/s",
                        "pruned by reason", "oom: activations", "best layout:", "stage 0",
                        "cp comm", "pp bubble", "dp comm"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
}

TEST(CliTune, MachineFormatsListEveryLayout) {
  TempDir dir;
  // 110,064 layouts: fewer than the formats built in memory list with --all.
  const std::string common = "tune --dry-run --model llama-7b --gpu h100 --gpus 16 --mb 1,2 --tp 1,2,4 --attn flash --all";
  auto r = run_weft(common + " --format json --out " + dir.path("r.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(dir.path("r.json"));
  const auto j = nlohmann::json::parse(in);
  EXPECT_GT(j["evaluated"].get<int64_t>(), 100);
  EXPECT_EQ(int64_t(j["layouts"].size()), j["evaluated"].get<int64_t>());
  r = run_weft(common + " --format csv");
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find(",tp_comm_s,cp_comm_s,pp_bubble_s,"), std::string::npos) << r.out.substr(0, 300);
  EXPECT_EQ(int64_t(std::count(r.out.begin(), r.out.end(), '\n')), j["evaluated"].get<int64_t>() + 1);
  r = run_weft(common + " --format md");
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("| rank | layout |"), std::string::npos);
}

TEST(CliTune, TopIsHonouredEverywhereAndTheTableExplainsItself) {
  const std::string common = "tune --dry-run --model llama-13b --gpu h100 --gpus 64 --top 3";
  auto r = run_weft(common + " --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["layouts"].size(), 3u);
  r = run_weft(common + " --format csv");
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 4);
  // On an A100, where nothing measured cuDNN's attention, flash and cuDNN
  // are predicted alike: each has its own row, the later one noting the
  // earlier's rank; the order's rule is stated.
  r = run_weft("tune --dry-run --model llama-13b --gpu a100-80gb --gpus 64 --top 40");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("-attn:cudnn-"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" but attn"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("order: predicted step time"), std::string::npos) << r.out;
  // On Hopper cuDNN's kernel has its own, measured efficiency: no twins,
  // and its rows lead.
  r = run_weft("tune --dry-run --model llama-13b --gpu h100 --gpus 64 --top 40 --fp8 off");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find(" but attn"), std::string::npos) << r.out;
  const auto first = r.out.find("   1  tp");
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_NE(r.out.substr(first, r.out.find('\n', first) - first).find("-attn:cudnn-"), std::string::npos) << r.out;
  // bf16 gradients priced for CPU ranks: the CPU trainer computes in fp32.
  r = run_weft("tune --dry-run --model tiny --gpu cpu --gpus 2 --precision bf16 --grad bf16 --cp 1 --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("-grad:bf16 *"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the trainer cannot run this layout yet: grad:bf16 needs the GPU trainer"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("none of the 3 fitting layouts ranked here can be trained yet; `--save-recipe` searches"),
            std::string::npos)
      << r.out;
  // Where the best cannot run yet, the table names the best that can.
  r = run_weft("tune --dry-run --model tiny --gpu cpu --gpus 2 --precision bf16 --grad bf16,fp32 --cp 1 --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto runnable = r.out.find("best the trainer can run: #");
  ASSERT_NE(runnable, std::string::npos) << r.out;
  const std::string line = r.out.substr(runnable, r.out.find('\n', runnable) - runnable);
  EXPECT_NE(line.find("-grad:fp32,"), std::string::npos) << line;
  EXPECT_NE(line.find("step time "), std::string::npos) << line;
  // And says nothing where the best can.
  r = run_weft("tune --dry-run --model tiny --gpu cpu --gpus 2 --cp 1 --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("best the trainer can run"), std::string::npos) << r.out;
}

// The layouts each format lists, in order.
std::vector<std::string> listed_layouts(const std::string& format, const std::string& out) {
  std::vector<std::string> layouts;
  std::istringstream in(out);
  std::string line;
  if (format == "json") {
    const auto j = nlohmann::json::parse(out);
    for (const auto& row : j["layouts"]) layouts.push_back(row["layout"]);
  } else if (format == "csv") {
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      const auto a = line.find(','), b = line.find(',', a + 1);
      layouts.push_back(line.substr(a + 1, b - a - 1));
    }
  } else if (format == "table") {
    bool rows = false;
    while (std::getline(in, line)) {
      if (line.rfind("rank  layout", 0) == 0) {
        rows = true;
      } else if (rows) {
        std::istringstream words(line);
        std::string rank, layout;
        words >> rank >> layout;
        if (rank != "-" && (rank.empty() || !std::isdigit(static_cast<unsigned char>(rank[0])))) break;
        layouts.push_back(layout);
      }
    }
  } else if (format == "md") {
    bool rows = false;
    while (std::getline(in, line)) {
      if (line.rfind("|---:|", 0) == 0) {
        rows = true;
      } else if (rows) {
        if (line.rfind("| ", 0) != 0) break;
        const auto a = line.find('`'), b = line.find('`', a + 1);
        layouts.push_back(line.substr(a + 1, b - a - 1));
      }
    }
  }
  return layouts;
}

// --top N lists one ranking: the same N layouts in the same order in every
// format, with layouts predicted alike (flash and cuDNN attention) and,
// when fewer than N fit, the pruned ones after those that fit.
TEST(CliTune, TopListsTheSameLayoutsInEveryFormat) {
  for (const std::string common : {"tune --dry-run --model llama-13b --gpu h100 --gpus 64 --top 12",
                                   "tune --dry-run --model llama-13b --gpu a100-40gb --gpus 8 --tp 8 --mb 4 --ckpt none "
                                   "--zero 0 --sp on --grad fp32 --top 6",
                                   "tune --dry-run --model llama-65b --gpu a100-40gb --gpus 8 --global-batch 8 "
                                   "--top 4"}) {
    std::vector<std::string> json_layouts;
    for (const std::string format : {"json", "csv", "table", "md"}) {
      const auto r = run_weft(common + " --format " + format);
      ASSERT_EQ(r.code, 0) << common << " " << format << "\n" << r.out;
      const auto layouts = listed_layouts(format, r.out);
      if (format == "json") {
        json_layouts = layouts;
        EXPECT_EQ(layouts.size(), std::stoul(common.substr(common.rfind(' ') + 1))) << common;
        continue;
      }
      EXPECT_EQ(layouts, json_layouts) << common << " " << format << "\n" << r.out;
    }
  }
}

// The dry-run searches the space with bounds and says how much of it it
// predicted; --exhaustive predicts every layout and lists the same rows.
TEST(CliTune, SearchSaysWhatItVisitedAndListsTheExhaustiveRows) {
  // A space of about 3 x 10^5 layouts (SpaceSearch.ListsTheExhaustiveRows checks
  // the search against exhaustive listings of millions).
  const std::string common = "tune --dry-run --model llama3.1-8b --gpu h100 --gpus 4 --seq 16384 --global-batch 64 --top 8";
  const auto searched = run_weft(common);
  ASSERT_EQ(searched.code, 0) << searched.out;
  for (const char* s : {"(the full product of the knobs)", "visited ", "bound: step lower bound"})
    EXPECT_NE(searched.out.find(s), std::string::npos) << s << "\n" << searched.out;
  const auto every = run_weft(common + " --exhaustive");
  ASSERT_EQ(every.code, 0) << every.out;
  EXPECT_NE(every.out.find("evaluated "), std::string::npos) << every.out;
  EXPECT_EQ(listed_layouts("table", searched.out), listed_layouts("table", every.out));
  const auto j = nlohmann::json::parse(run_weft(common + " --format json").out);
  EXPECT_FALSE(j["exhaustive"].get<bool>());
  EXPECT_LT(j["visited"].get<int64_t>(), j["evaluated"].get<int64_t>());
  // A recipe saved from the search says how much of the space it predicted.
  TempDir dir;
  ASSERT_EQ(run_weft(common + " --save-recipe " + dir.path("r.json")).code, 0);
  std::ifstream in(dir.path("r.json"));
  const auto recipe = nlohmann::json::parse(in);
  EXPECT_EQ(recipe["tuning"]["evaluated"], j["evaluated"]);
  // The recipe takes the best layout the trainer can run, searching on past
  // the listed ones where those cannot run yet (cp with cuDNN attention).
  const auto runnable = std::find_if(j["layouts"].begin(), j["layouts"].end(),
                                     [](const auto& row) { return !row.contains("cannot_run_yet"); });
  if (runnable == j["layouts"].begin()) {
    EXPECT_EQ(recipe["tuning"]["visited"], j["visited"]);
  } else {
    EXPECT_GT(recipe["tuning"]["visited"].get<int64_t>(), j["visited"].get<int64_t>());
  }
  if (runnable != j["layouts"].end()) {
    EXPECT_EQ(recipe["layout"], (*runnable)["layout"]);
  }
}

TEST(CliTune, NothingFitsPointsAtTheNearestLayout) {
  const auto r = run_weft("tune --dry-run --model llama-65b --gpu a100-40gb --gpus 8 --global-batch 8");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto at = r.out.find("nearest to fitting: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  // The one that needs the least memory: micro-batch 1, every layer recomputed.
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(line.find("mb1-"), std::string::npos) << line;
  EXPECT_NE(line.find("ckpt:full-"), std::string::npos) << line;
}

// --cp and --cp-comm pin the context-parallel degrees and the transports
// tried at cp > 1; the layout text carries both.
TEST(CliTune, ContextParallelPins) {
  const auto r = run_weft("tune --dry-run --model llama-7b --gpu h100 --gpus 16 --seq 8192 --global-batch 64 --tp 1 "
                          "--mb 1 --cp 1,4 --cp-comm a2a,allgather --fp8 off --all --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  std::set<std::string> seen;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& row : j["layouts"]) {
    const std::string l = row["layout"];
    const bool cp4 = l.find("-cp4-") != std::string::npos;
    EXPECT_TRUE(cp4 || l.find("-cp") == std::string::npos) << l;
    if (cp4) {
      EXPECT_TRUE(l.ends_with("-cp:a2a") || l.ends_with("-cp:allgather")) << l;
    }
    seen.insert(cp4 ? l.substr(l.rfind('-') + 1) : "cp1");
  }
  EXPECT_EQ(seen, (std::set<std::string>{"cp1", "cp:a2a", "cp:allgather"}));
}

// FP8 GEMMs: searched on the H100 (off and tensorwise), pinned with --fp8,
// shown per layout, MFU against the bf16 peak with the denominator said;
// refused on a GPU without FP8 tensor cores, allowed (emulated) on the CPU.
TEST(CliTune, Fp8SearchedPinnedAndRefused) {
  const std::string h100 = "tune --dry-run --model llama3.1-8b --gpu h100 --gpus 8 --seq 8192 --global-batch 64 --tp 1 "
                           "--mb 1 --ckpt none --zero 1 --attn flash --norm fused";
  // The GEMM precisions a JSON report's rows list.
  const auto precisions = [](const std::string& out) {
    const auto j = nlohmann::json::parse(out);
    std::set<std::string> seen;
    for (const auto& row : j.at("layouts")) seen.insert(row.at("gemm_precision").get<std::string>());
    return seen;
  };
  auto r = run_weft(h100 + " --all --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(precisions(r.out), (std::set<std::string>{"bf16", "fp8:tensorwise"}));
  r = run_weft(h100 + " --fp8 off,tensorwise,delayed@1 --all --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(precisions(r.out), (std::set<std::string>{"bf16", "fp8:tensorwise", "fp8:delayed@1"}));
  r = run_weft(h100 + " --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"GEMMs", "fp8:tensorwise", "not the 1979 TFLOP/s FP8 peak", "vs the dense bf16 peak 989.4",
                        "of the 1979 TFLOP/s FP8 peak"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  r = run_weft(h100 + " --top 2 --format csv");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(",optimizer_s,gemm_precision,cannot_run_yet\n"), std::string::npos) << r.out;
  // FP8 runs on an H100 whatever this machine has: no row is marked for it.
  EXPECT_EQ(r.out.find("FP8 tensor cores"), std::string::npos) << r.out;
  // A100 (sm_80): one clear line naming the device and what would do.
  r = run_weft("tune --dry-run --model llama3.1-8b --gpu a100-80gb --gpus 8 --fp8 tensorwise");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out.rfind("weft: error: --fp8 tensorwise: a100-80gb (sm_80) has no FP8 tensor cores; FP8 needs sm_89 "
                        "or sm_90 (h100, h200",
                        0),
            0u)
      << r.out;
  EXPECT_EQ(run_weft("tune --dry-run --model llama3.1-8b --gpu a100-80gb --gpus 8 --fp8 off --top 1").code, 0);
  // The CPU: not searched unless pinned, and pinned it is emulated.
  r = run_weft("tune --dry-run --model tiny --gpu cpu --gpus 2 --top 40 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(precisions(r.out), (std::set<std::string>{"fp32"}));  // the CPU's compute precision
  r = run_weft("tune --dry-run --model tiny --gpu cpu --gpus 2 --fp8 tensorwise --top 3 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(precisions(r.out), (std::set<std::string>{"fp8:tensorwise"}));
  // A recipe keeps the precision in its layout, and its one line says what
  // its MFU is against.
  TempDir dir;
  r = run_weft("tune --dry-run --model llama3.1-8b --gpu h100 --gpus 8 --fp8 delayed@1 --save-recipe " +
               dir.path("r.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft("recipe show " + dir.path("r.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("-fp8:delayed@1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vs the dense bf16 peak"), std::string::npos) << r.out;
}

// MoE capacity factors: searched among those listed (each layout at each),
// priced where they cap the busiest ep rank, and named in the layout text.
TEST(CliTune, ListedCapacityFactorsAreSearched) {
  const std::string mixtral = "tune --dry-run --model mixtral-8x7b --gpu h100 --gpus 64 --seq 4096 --global-batch 256 "
                              "--moe-imbalance 1.5 --ep 8 --top 3 --format json";
  auto r = run_weft(mixtral + " --moe-capacity-factor 0,1.25");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const std::string first = j.at("layouts")[0].at("layout").get<std::string>();
  EXPECT_NE(first.find("-cap:1.25"), std::string::npos) << first;
  // Dropless alone: the same layout without the factor is slower.
  r = run_weft(mixtral);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GT(nlohmann::json::parse(r.out).at("layouts")[0].at("prediction").at("step_s").get<double>(),
            j.at("layouts")[0].at("prediction").at("step_s").get<double>());
  r = run_weft("tune --dry-run --model mixtral-8x7b --gpu h100 --gpus 64 --moe-capacity-factor 0,1.25 --layout "
               "tp1-pp4-dp16-ep8-mb1-vpp8");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--layout evaluates one layout at one capacity factor"), std::string::npos) << r.out;
  r = run_weft("tune --dry-run --model mixtral-8x7b --gpu h100 --gpus 64 --seq 4096 --global-batch 256 --layout "
               "tp1-pp4-dp16-ep8-mb1-vpp8-cap:1.25");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("-cap:1.25"), std::string::npos) << r.out;
  r = run_weft("tune --dry-run --model mixtral-8x7b --gpus 64 --moe-capacity-factor 1,1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--moe-capacity-factor lists 1 twice"), std::string::npos) << r.out;
}

TEST(CliTune, OneExplicitLayout) {
  const auto r = run_weft("tune --dry-run --model llama-13b --gpus 64 --layout tp2-pp2-dp16-mb1-zero1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("evaluated 1 layouts"), std::string::npos) << r.out;
}

// GPT-2's vocabulary (50257, odd) under tp: padded per tp degree, said in
// the header and the JSON, and every tp the heads allow is searched.
TEST(CliTune, AVocabularyTpDoesNotDivideIsPadded) {
  TempDir dir;  // Llama 2 7B's shape
  const auto cfg = dir.file("gpt2vocab/config.json", R"({"vocab_size": 50257, "hidden_size": 4096,
      "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
      "rms_norm_eps": 1e-5})");
  auto r = run_weft("tune --dry-run --model " + cfg + " --gpu h100 --gpus 8 --seq 4096 --global-batch 64 --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("vocab   V=50257 is padded where tp does not divide it, to a multiple of 128 x tp: 50432 at "
                       "tp 2, 50688 at tp 4, 51200 at tp 8"),
            std::string::npos)
      << r.out;
  r = run_weft("tune --dry-run --model " + cfg + " --gpu h100 --gpus 8 --seq 4096 --global-batch 64 --tp 2,4,8 --pp 1,2 --mb 1 "
               "--all --format csv");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* tp : {"tp2-", "tp4-", "tp8-"}) EXPECT_NE(r.out.find(tp), std::string::npos) << tp;
  r = run_weft("tune --dry-run --model " + cfg + " --gpu h100 --gpus 8 --seq 4096 --global-batch 64 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["padded_vocab"]["8"], 51200);
  EXPECT_EQ(j["model"]["vocab"], 50257);
}

struct BadInput {
  const char* args;
  std::vector<const char*> says;
};

TEST(CliTune, BadInputIsOneClearLineAndExitTwo) {
  TempDir dir;
  const auto bad_json = dir.file("bad/config.json", "{\"vocab_size\": 32000,");
  const auto partial = dir.file("partial/config.json", R"({"vocab_size": 32000, "hidden_size": 4096})");
  const std::vector<BadInput> cases = {
      {"tune --dry-run --model llama-9b", {"llama-9b", "llama2-7b"}},
      {"tune --dry-run --gpu v100", {"v100", "a100-80gb"}},
      {"tune --dry-run --model {bad}", {"not valid JSON"}},
      {"tune --dry-run --model {partial}", {"intermediate_size"}},
      {"tune --dry-run --gpus 64 --model llama-13b --layout tp3-pp1-dp21", {"H=40", "tp=3", "world size 64"}},
      {"tune --dry-run --gpus 64 --model llama-13b --layout tp2-pp2-dp16-mb3", {"global batch 2048", "mb*dp"}},
      {"tune --dry-run --gpus 64 --model llama-13b --tp 16", {"H=40", "tp=16"}},
      {"tune --dry-run --gpus 12 --gpus-per-node 8", {"12", "--gpus-per-node 8"}},
      {"tune --dry-run --gpus 64 --global-batch 100 --tp 1 --pp 1 --cp 1", {"global batch 100"}},
      {"tune --dry-run --seq 0", {"--seq 0"}},
      {"tune --dry-run --global-batch -8", {"-8"}},
      {"tune --dry-run --gpus 0", {"--gpus 0"}},
      {"tune --dry-run --vocab -5", {"--vocab -5"}},
      {"tune --dry-run --ckpt most", {"most", "selective"}},
      {"tune --dry-run --layout tp2-bogus", {"bogus"}},
      {"tune --dry-run --format xml", {"xml", "json"}},
      {"tune --dry-run --gpus many", {"many"}},
      {"tune", {"--dry-run"}},
      {"frobnicate", {"frobnicate"}},
      {"tune --dry-run --vocab 0", {"--vocab 0", "from 1 to 2147483648"}},
      {"tune --dry-run --layout ''", {"--layout", "empty"}},
      {"tune --dry-run --gpus 64 --model llama-13b --layout tp1-pp1-dp64-mb-1", {"mb is -1"}},
      {"tune --dry-run --max-mbb 4", {"--max-mbb: did you mean --max-mb?"}},
      {"tune --dry-run --gpu-per-node 8", {"did you mean --gpus-per-node?"}},
      {"tune --dry-run --gpu {device5}", {"device5.json", "field 'device'", "5"}},
      {"tune --dry-run --gpu {name3}", {"name3.json", "device.name", "3"}},
      {"tune --dry-run --gpu {nic}", {"nic.json", "nic_bandwidth", "1e-300", "bytes/s"}},
      {"tune --dry-run --model {mistral}", {"mistral", "MistralForCausalLM"}},
      {"tune --dry-run --cp-comm ring,tree", {"tree", "ring, allgather, a2a"}},
      {"tune --dry-run --cp 0", {"--cp 0"}},
      {"tune --dry-run --zero-group 1", {"--zero-group 1", "at least 2 ranks"}},
      {"tune --dry-run --zero-group -4", {"--zero-group -4"}},
      {"tune --dry-run --zero 0 --zero-group 8", {"--zero-group 8", "--zero 0 shards nothing"}},
      {"tune --dry-run --gpus 64 --model llama-13b --zero 3 --zero-group 3", {"zero3@3", "must divide dp x cp"}},
      {"tune --dry-run --gpu h100 --fp8 fast", {"--fp8", "'fast'", "tensorwise, delayed, off"}},
      {"tune --dry-run --gpu h100 --fp8 off@2", {"--fp8 'off@2'", "@N applies to tensorwise, delayed and blockwise"}},
      {"tune --dry-run --gpu h100 --fp8 delayed@x", {"--fp8 'delayed@x'", "whole number"}},
      {"tune --dry-run --gpu h100 --fp8 delayed@-1", {"--fp8 'delayed@-1'", "whole number"}},
      {"tune --dry-run --gpu a100-40gb --fp8 off,delayed@1", {"--fp8 delayed@1", "a100-40gb (sm_80)", "--fp8 off"}},
      {"tune --dry-run --gpus 64 --model llama-13b --tp 1 --cp 3", {"tp, cp and pp must divide"}},
      {"tune --dry-run --gpus 64 --model mixtral-8x7b --ep-fold on --tp 1", {"--ep-fold on", "tp above 1", "--tp pins 1"}},
      {"tune --dry-run --gpus 64 --model llama-13b --ep-fold on", {"--ep-fold on", "llama-13b is dense"}},
      {"tune --dry-run --gpus 64 --model llama-13b --seq 2052 --tp 1 --cp 16",
       {"T=2052", "2*cp = 32 equal chunks"}},
  };
  const auto device5 = dir.file("device5.json", R"({"device": 5})");
  const auto name3 = dir.file("name3.json", R"({"device": {"preset": "h100", "name": 3}})");
  const auto nic = dir.file("nic.json", R"({"device": {"preset": "h100"}, "nic_bandwidth": 1e-300})");
  const auto mistral = dir.file("mistral/config.json", R"({"architectures": ["MistralForCausalLM"],
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096})");
  for (const auto& c : cases) {
    std::string args = c.args;
    for (auto [key, val] : {std::pair{"{bad}", bad_json}, {"{partial}", partial}, {"{device5}", device5},
                            {"{name3}", name3}, {"{nic}", nic}, {"{mistral}", mistral}}) {
      const auto at = args.find(key);
      if (at != std::string::npos) args.replace(at, std::string(key).size(), val);
    }
    const auto r = run_weft(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("weft: error: ", 0), 0u) << args << "\n" << r.out;
    for (const char* s : c.says) EXPECT_NE(r.out.find(s), std::string::npos) << args << "\n" << r.out;
  }
}

TEST(CliTune, OutFileIsReplacedOnlyWhole) {
  TempDir dir;
  const auto path = dir.file("report.json", "previous good report\n");
  const auto r = run_weft("tune --dry-run --model nope --format json --out " + path);
  EXPECT_EQ(r.code, 2);
  std::string content = test::file_contents(path);
  EXPECT_EQ(content, "previous good report\n");
}

}  // namespace
}  // namespace weft::test
