// No command destroys a user's file: every subcommand that writes a file
// (--out, --save-recipe, --script) or a folder (export --out) is pointed at
// each kind of input and run file, and each is refused with exit 2 while the
// target stays byte for byte what it was; the same commands pointed at their
// own earlier outputs replace them. A refused train --overwrite moves nothing
// aside, and an empty argument is refused at once instead of hanging.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

// Every file under `root` (or `root` itself) with its bytes.
std::map<std::string, std::string> contents(const std::string& root) {
  std::map<std::string, std::string> out;
  if (fs::is_regular_file(root)) {
    out[root] = slurp(root);
    return out;
  }
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out[e.path().string()] = slurp(e.path().string());
  return out;
}

class CliOutputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const std::string data = corpus(*dir_);
    data_ = new std::string(data);
    auto r = run_weft("train --data " + data + kSmall + " --steps 2 --layout tp1-pp1-dp1-mb2 --out " + path("run"));
    ASSERT_EQ(r.code, 0) << r.out;
    r = run_weft("export --checkpoint " + path("run/checkpoints/step_000002") + " --out " + path("hf"));
    ASSERT_EQ(r.code, 0) << r.out;
    r = run_weft("train --data " + data + kSmall + " --steps 1 --layout tp1-pp1-dp1-mb2 --init " + path("hf") +
                 " --lora 4 --out " + path("lora"));
    ASSERT_EQ(r.code, 0) << r.out;
    r = run_weft("tune --dry-run --model tiny --gpu h100 --gpus 4 --save-recipe " + path("r.json"));
    ASSERT_EQ(r.code, 0) << r.out;
    dir_->file("notes.txt", "a user's own notes\n");
    // A Hugging Face folder of the user's: the export's files, no marker.
    fs::create_directories(path("user-hf"));
    fs::copy_file(path("hf/config.json"), path("user-hf/config.json"));
    fs::copy_file(path("hf/model.safetensors"), path("user-hf/model.safetensors"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete data_;
  }
  static std::string path(const std::string& p) { return dir_->path(p); }

  static TempDir* dir_;
  static std::string* data_;
};

TempDir* CliOutputs::dir_ = nullptr;
std::string* CliOutputs::data_ = nullptr;

TEST_F(CliOutputs, NoFileOfARunOrAnInputIsWrittenOver) {
  const std::string ck = path("run/checkpoints/step_000002");
  const std::vector<std::string> targets = {
      path("run/metrics.jsonl"), ck + "/manifest.json",      ck + "/model.safetensors", path("run/memory/rank0.json"),
      path("r.json"),            path("notes.txt"),          path("hf/model.safetensors"), path("hf/config.json")};
  std::map<std::string, std::string> before;
  for (const auto& root : {path("run"), path("hf"), path("lora"), path("user-hf"), path("r.json"), path("notes.txt")})
    for (auto& [f, bytes] : contents(root)) before[f] = bytes;

  const std::string dry = "tune --dry-run --model tiny --gpu h100 --gpus 4 --top 2";
  for (const std::string& t : targets) {
    std::vector<std::string> commands = {
        "report " + path("run") + " --out " + t,
        dry + " --out " + t,
        dry + " --format html --out " + t,
        "recipe sbatch " + path("r.json") + " --out " + path("jobs/a") + " --script " + t,
        "calibrate --device cpu --out " + t,
    };
    if (t != path("r.json")) commands.push_back(dry + " --save-recipe " + t);  // a recipe replaces a recipe
    for (const std::string& cmd : commands) {
      const auto r = run_weft(cmd);
      EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
      EXPECT_NE(r.out.find(t.substr(dir_->path("").size())), std::string::npos) << "the refusal names the path: "
                                                                                 << r.out;
    }
  }
  // A page of a JSON report written over that report.
  ASSERT_EQ(run_weft(dry + " --format json --out " + path("s.json")).code, 0);
  const std::string s_json = slurp(path("s.json"));
  EXPECT_EQ(run_weft("report " + path("s.json") + " --out " + path("s.json")).code, 2);
  EXPECT_EQ(slurp(path("s.json")), s_json);

  // Export folders: the run, its checkpoint, a user's model folder, and the
  // base a LoRA run was started from (its merge would change the base hash
  // every later merge and resume checks).
  const std::string lora_ck = path("lora/checkpoints/step_000001");
  for (const std::string& cmd :
       {"export --checkpoint " + ck + " --out " + path("run"), "export --checkpoint " + ck + " --out " + ck,
        "export --checkpoint " + ck + " --out " + path("run/checkpoints"),
        "export --checkpoint " + ck + " --out " + path("user-hf"),
        "export --merge --checkpoint " + lora_ck + " --out " + path("hf"),
        "export --lora --checkpoint " + lora_ck + " --out " + path("user-hf"),
        "export --lora --checkpoint " + lora_ck + " --out " + path("hf")}) {
    const auto r = run_weft(cmd);
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.out;
  }

  // train --overwrite refused for a bad later argument moves nothing aside.
  for (const std::string& bad : {std::string(" --lora 4 --lora-init ") + path("no-such-adapter"),
                                 std::string(" --tensorboard /proc/no-such-folder")}) {
    const auto r = run_weft("train --data " + *data_ + kSmall + " --steps 1 --layout tp1-pp1-dp1-mb2 --overwrite --out " +
                            path("run") + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
  }
  for (const auto& e : fs::directory_iterator(dir_->path("")))
    EXPECT_EQ(e.path().filename().string().find(".prev-"), std::string::npos) << e.path();

  std::map<std::string, std::string> after;
  for (const auto& root : {path("run"), path("hf"), path("lora"), path("user-hf"), path("r.json"), path("notes.txt")})
    for (auto& [f, bytes] : contents(root)) after[f] = bytes;
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [f, bytes] : before) EXPECT_TRUE(after.count(f) && after[f] == bytes) << f << " changed";
}

// Each command replaces what it wrote itself.
TEST_F(CliOutputs, EachCommandReplacesItsOwnEarlierOutput) {
  const std::string dry = "tune --dry-run --model tiny --gpu h100 --gpus 4 --top 2";
  for (const std::string& cmd :
       {dry + " --format csv --out " + path("d.csv"), dry + " --format md --out " + path("d.csv"),
        dry + " --format html --out " + path("d.html"), dry + " --save-recipe " + path("d-recipe.json"),
        "report " + path("run") + " --out " + path("run.html"),
        "recipe sbatch " + path("r.json") + " --out " + path("jobs/b") + " --script " + path("b.sbatch"),
        "export --checkpoint " + path("run/checkpoints/step_000002") + " --out " + path("again"),
        "export --lora --checkpoint " + path("lora/checkpoints/step_000001") + " --out " + path("peft")}) {
    for (int i = 0; i < 2; ++i) {
      const auto r = run_weft(cmd);
      EXPECT_EQ(r.code, 0) << cmd << " (time " << i + 1 << ")\n" << r.out;
    }
  }
  // The script is one bash parses.
  EXPECT_EQ(run_shell("bash -n " + path("b.sbatch") + " 2>&1").code, 0);
}

// weft recipe sbatch refuses, with exit 2 and nothing written, whatever
// would give a script that fails or runs something else than asked; the
// words of --train reach weft train as given, however they are quoted.
TEST_F(CliOutputs, SbatchRefusesWhatWouldBreakTheScript) {
  const std::string base = "recipe sbatch " + path("r.json") + " --out " + path("jobs/c");
  const std::string script = " --script " + path("c.sbatch");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {base + script + " --train \"--steps '10\"", "unbalanced '"},
      {base + script + " --train '--bogus-flag 1'", "weft train would refuse"},
      {base + script + " --train '--steps ten'", "weft train would refuse"},
      {base + script + " --train '--out elsewhere'", "sets itself"},
      {base + script + " --time abc", "not a Slurm time limit"},
      {base + script + " --partition 'gpu\nx'", "not a Slurm name"},
      {base + script + " --account 'a b'", "not a Slurm name"},
      {base + script + " --weft " + path("no-such-weft"), "not an executable file"},
      {base + script + " --tasks-per-node 3", "--tasks-per-node 3 does not divide"},
      {base + script + " --nodes 0", "--nodes 0 must be at least 1"},
      {"recipe sbatch " + path("r.json") + " --out " + path("notes.txt") + script, "is not a folder"},
      {"recipe sbatch " + path("r.json") + " --out /proc/no-such/run" + script, "cannot create the run folder"},
      {base + " --script " + path("jobs/c"), "is the run folder"},
      {base + " --script " + path("jobs"), "is the run folder"},
      {base + " --script " + dir_->path(""), "not a file"},
  };
  for (const auto& [args, says] : refused) {
    const auto r = run_weft(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(path("c.sbatch"))) << args;
  }
  // Spaces, quotes and shell characters in the words: bash parses the
  // script, and the words come back from it one by one as given.
  const auto r = run_weft(base + script + " --train \"--data '/a b/c\\$x' --steps 5 --change \\\"lr,seed\\\"\"");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(run_shell("bash -n " + path("c.sbatch") + " 2>&1").code, 0);
  const std::string text = slurp(path("c.sbatch"));
  // (The test's own shell turned \\$ into $ before weft saw it.)
  EXPECT_NE(text.find("'--data' '/a b/c$x' '--steps' '5' '--change' 'lr,seed'"), std::string::npos) << text;
}

// Listings of spaces of millions of layouts stay in bounded memory: under a
// 2 GiB address-space limit, formats built in memory refuse up front naming
// the row count, the CSV streams every row, and --exhaustive holds a few
// bytes a layout; an absurd cluster size is refused at once.
TEST(CliListings, LargeSpacesStayInBoundedMemory) {
  TempDir dir;
  const auto limited = [](const std::string& args) {
    return run_shell("ulimit -v 2097152; timeout 300 " + std::string(WEFT_BIN) + " " + args + " 2>&1");
  };
  const std::string big = "tune --dry-run --model llama3.1-70b --gpu h100 --gpus 64 --seq 8192 --global-batch 128";
  // (The page of a space this large is built in bounded memory:
  // CliReport.LargestDryRunStaysSmall.)
  for (const std::string f : {"json", "table", "md"}) {
    const auto r = limited(big + " --all --format " + f);
    EXPECT_EQ(r.code, 2) << f << "\n" << r.out.substr(0, 2000);
    EXPECT_NE(r.out.find("the space holds 13354272 layouts"), std::string::npos) << f << "\n" << r.out.substr(0, 2000);
    EXPECT_NE(r.out.find("--format csv"), std::string::npos) << r.out.substr(0, 2000);
  }
  // 420,336 layouts: past the rows held in memory, streamed.
  const std::string space = "tune --dry-run --model llama-7b --gpu h100 --gpus 16 --attn flash";
  auto r = limited(space + " --all --format csv --out " + dir.path("all.csv"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("420336 layouts, streamed"), std::string::npos) << r.out;
  std::ifstream in(dir.path("all.csv"));
  std::vector<std::string> head;
  int64_t lines = 0;
  for (std::string line; std::getline(in, line); ++lines)
    if (head.size() < 4) head.push_back(line);
  EXPECT_EQ(lines, 420337);
  // Its first rows are the search's, and --exhaustive's.
  for (const std::string& mode : {std::string(""), std::string(" --exhaustive")}) {
    r = limited(space + " --top 3 --format csv" + mode);
    ASSERT_EQ(r.code, 0) << r.out.substr(0, 2000);
    std::istringstream rows(r.out);
    std::string line;
    for (size_t i = 0; i < head.size() && std::getline(rows, line); ++i) EXPECT_EQ(line, head[i]) << mode << " row " << i;
  }
  r = run_weft("tune --dry-run --model tiny --gpu h100 --gpus 2147483648");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--gpus 2147483648 is past the 1048576 GPUs"), std::string::npos) << r.out;
}

// CLI11 never returns from an empty argument: refused before parsing.
TEST(CliArguments, AnEmptyArgumentIsRefusedAtOnce) {
  for (const std::string& args : {std::string("tune --dry-run --model tiny '' --top 1"),
                                  std::string("tune --dry-run --model tiny --memory-limit ''"),
                                  std::string("train --steps 1 ''")}) {
    const auto r = run_shell("timeout 20 " + std::string(WEFT_BIN) + " " + args + " 2>&1");
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("is empty"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace weft::test
