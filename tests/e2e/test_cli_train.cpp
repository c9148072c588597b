// `weft train` end to end on the CPU: progress and metrics, exact resume from
// a checkpoint, a clean stop on SIGINT, and one clear line with exit code 2
// for bad input, with nothing overwritten.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "cli_runner.h"
#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;


TEST(CliTrain, TrainsAndReports) {
  TempDir dir;
  const auto data = corpus(dir);
  const auto r = run_weft("train --data " + data + kSmall + " --steps 8 --eval-every 4 --out " + dir.path("run"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"step     8/8", "loss", "lr", "grad norm", "tok/s", "TFLOP/s", "MFU", "peak mem",
                        "validation loss", "unigram baseline", "checkpoint", "measured peak vs memory model",
                        "activations", "+0.00%"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  const auto l = losses(dir.path("run/metrics.jsonl"));
  ASSERT_EQ(l.size(), 8u);
  EXPECT_LT(l.back(), l.front());
  EXPECT_TRUE(fs::exists(dir.path("run/checkpoints/step_000008/model.safetensors")));
  // The memory measured apart from the arena: the process's resident peak
  // grew by at least what the model predicts (the arena's pages are written,
  // so resident), and by no more than the model plus the process's fixed
  // share (code, OpenMP and BLAS buffers, data pages: about 20 MiB here).
  EXPECT_NE(r.out.find("independent"), std::string::npos) << r.out;
  const auto mem = nlohmann::json::parse(std::ifstream(dir.path("run/memory/rank0.json")));
  int64_t model = 0;
  for (const auto& [k, v] : mem["predicted"].items()) model += v.get<int64_t>();
  ASSERT_TRUE(mem.contains("independent")) << mem.dump();
  const int64_t rss = mem["independent"]["bytes"].get<int64_t>();
  EXPECT_GE(rss, model) << "resident growth " << rss << " below the model's " << model;
#ifndef WEFT_TEST_ASAN
  // (Not under AddressSanitizer: its shadow memory and quarantine are resident too.)
  EXPECT_LE(rss, model * 3 / 2 + (int64_t{64} << 20)) << "resident growth " << rss << " vs the model's " << model;
#endif
  // --no-checkpoint trains the same and writes none.
  const auto n = run_weft("train --data " + data + kSmall + " --steps 2 --no-checkpoint --out " + dir.path("none"));
  ASSERT_EQ(n.code, 0) << n.out;
  EXPECT_EQ(losses(dir.path("none/metrics.jsonl")).size(), 2u);
  EXPECT_FALSE(fs::exists(dir.path("none/checkpoints")));
}

TEST(CliTrain, ResumeIsBitIdentical) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string common = "train --data " + data + kSmall + " --steps 6 --warmup 2";
  auto r = run_weft(common + " --ckpt-every 3 --out " + dir.path("a"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft(common + " --resume-from " + dir.path("a/checkpoints/step_000003") + " --out " + dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  const auto a = losses(dir.path("a/metrics.jsonl"));
  const auto b = losses(dir.path("b/metrics.jsonl"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a[3 + i], b[i]) << "step " << 4 + i;  // bit for bit
  // --resume finds the newest checkpoint of a run folder by itself.
  r = run_weft(common.substr(0, common.find("--steps")) + "--steps 7 --resume --out " + dir.path("a"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("at step 6"), std::string::npos) << r.out;
}

// SIGTERM in the middle of a validation that would take many seconds: the
// run stops at the next sample on its way (not after the validation), keeps
// its checkpoint and exits 143. Validation reads each window once, so the
// long one needs a large validation split: about 500k tokens, some 16 s on
// one core.
TEST(CliTrain, SigtermDuringValidationStopsPromptly) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i)
    text += "The quick brown fox " + std::to_string(i * 7919 % 100000) + " jumps over the lazy dog.\n%\n";
  const auto r = run_weft("data prepare --input " + dir.file("big.txt", text) + " --out " + dir.path("data") +
                          " --val-fraction 0.5");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto data = dir.path("data");
  const auto out = dir.path("run");
  const pid_t pid = spawn_weft("train --data " + data + " --steps 1000 --eval-every 2 --out " + out + kSmall +
                               " --eval-samples 100000000");
  ASSERT_GE(pid, 0);
  // Step 2 logged: validation has begun (it runs right after).
  for (int i = 0; i < 600 && losses(out + "/metrics.jsonl").size() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(losses(out + "/metrics.jsonl").size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("exited %.2f s after SIGTERM\n", waited);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 143);
  // Generous: the validation alone would take hours.
  EXPECT_LT(waited, 30.0);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/step_000002/manifest.json"));
  EXPECT_EQ(losses(out + "/metrics.jsonl").size(), 2u);
}

// Validation and weft eval read each window of the data at most once: a
// request for more, a huge one included, is capped and the output says so.
TEST(CliTrain, ValidationTakesAtMostTheWindowsTheDataHolds) {
  TempDir dir;
  const auto data = corpus(dir);
  auto r = run_weft("train --data " + data + kSmall + " --steps 2 --eval-samples 100000000 --out " + dir.path("run"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto at = r.out.find("validation: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string n = std::to_string(std::stoll(r.out.substr(at + 12)));
  EXPECT_LT(std::stoll(n), 1000) << r.out;
  EXPECT_NE(r.out.find("validation: " + n + " samples (the data holds " + n +
                       " windows of 33 tokens; --eval-samples 100000000 asked for more)"),
            std::string::npos)
      << r.out;
  // weft eval of the run's folder of checkpoints takes the newest and names it.
  r = run_weft("eval --data " + data + " --checkpoint " + dir.path("run/checkpoints") + " --samples 1000");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_000002, the newest checkpoint in " + dir.path("run/checkpoints")), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("over " + n + " validation samples of 32 tokens (the data holds " + n +
                       " windows of 33 tokens; --samples 1000 asked for more)"),
            std::string::npos)
      << r.out;
  r = run_weft("eval --data " + data + " --checkpoint " + dir.path("run/checkpoints/step_000002") + " --samples 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("over 3 validation samples of 32 tokens\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("using"), std::string::npos) << r.out;
}

TEST(CliTrain, SigintSavesACheckpointAndExits) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string out = dir.path("run");
  const pid_t pid = spawn_weft("train --data " + data + " --steps 100000 --out " + out + kSmall);
  ASSERT_GE(pid, 0);
  // Wait until it has run a few steps, then interrupt it.
  for (int i = 0; i < 600 && losses(out + "/metrics.jsonl").size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(losses(out + "/metrics.jsonl").size(), 3u);
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const size_t steps = losses(out + "/metrics.jsonl").size();
  int64_t dirs = 0;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints")) dirs += e.is_directory() ? 1 : 0;
  EXPECT_EQ(dirs, 1);
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06zu", steps);
  EXPECT_TRUE(fs::exists(out + "/checkpoints/" + name + "/manifest.json")) << name;
  std::ifstream latest(out + "/checkpoints/latest");
  std::string named;
  std::getline(latest, named);
  EXPECT_EQ(named, name);
  // The run's records end with one saying it was stopped, and the final
  // validation was skipped.
  std::string line, last;
  for (std::ifstream in(out + "/metrics.jsonl"); std::getline(in, line);) last = line;
  const auto end = nlohmann::json::parse(last);
  EXPECT_EQ(end["kind"], "end");
  EXPECT_EQ(end["interrupted"], true);
  EXPECT_EQ(end["signal"], "SIGINT");
  // The report page is written after a stop too.
  EXPECT_TRUE(fs::exists(out + "/report.html"));
}

// Two runs into one folder never lose the first: the second is refused
// naming the ways on; --resume continues from the checkpoint written last
// (not the highest step number lying around); --overwrite moves the earlier
// run aside whole.
TEST(CliTrain, RunFolderIsNeverLost) {
  TempDir dir;
  const auto data = corpus(dir);
  const auto out = dir.path("run");
  const std::string args = "train --data " + data + kSmall + " --eval-samples 2 --out " + out;
  auto r = run_weft(args + " --steps 4");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"finished after 4 steps", "checkpoint", "metrics.jsonl"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const auto ckpt4 = out + "/checkpoints/step_000004/model.safetensors";
  const auto bytes4 = fs::file_size(ckpt4);

  r = run_weft(args + " --steps 6");
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* s : {"already holds a run", "metrics.jsonl", "step_000004", "--resume", "--out", "--overwrite"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_EQ(losses(out + "/metrics.jsonl").size(), 4u);

  // A stray higher-numbered checkpoint (an older run's, copied in by hand)
  // does not win over the one this run wrote last.
  fs::copy(out + "/checkpoints/step_000004", out + "/checkpoints/step_000100", fs::copy_options::recursive);
  r = run_weft(args + " --steps 6 --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step_000004 at step 4"), std::string::npos) << r.out;
  EXPECT_EQ(losses(out + "/metrics.jsonl").size(), 6u);
  int64_t headers = 0;
  std::string line;
  for (std::ifstream in(out + "/metrics.jsonl"); std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("kind")) << line;
    if (j["kind"] == "run") {
      ++headers;
      for (const char* k : {"model", "layout", "seed", "commit", "start", "first_step"})
        EXPECT_TRUE(j.contains(k)) << k << " " << line;
      EXPECT_EQ(j["first_step"], headers == 1 ? 1 : 5) << line;
      // The commit the binary was built from (stamped at build time), as
      // --version says, and the checkout's HEAD where there is one.
      const std::string commit = j["commit"].get<std::string>();
      EXPECT_NE(run_weft("--version").out.find("(commit " + commit + ")"), std::string::npos) << commit;
      const auto head = run_shell(std::string("git -C ") + WEFT_SOURCE_DIR + " rev-parse --short=12 HEAD 2>/dev/null");
      if (head.code == 0 && commit != "unknown") {
        EXPECT_EQ(commit.substr(0, 12), head.out.substr(0, 12)) << "a stale commit stamp";
      }
    }
  }
  EXPECT_EQ(headers, 2);

  // At or past --steps, a resumed run says so and changes nothing.
  r = run_weft(args + " --steps 6 --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("nothing to train"), std::string::npos) << r.out;
  EXPECT_EQ(losses(out + "/metrics.jsonl").size(), 6u);

  r = run_weft(args + " --steps 2 --overwrite");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("aside to"), std::string::npos) << r.out;
  EXPECT_EQ(losses(out + "/metrics.jsonl").size(), 2u);
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(dir.path("")))
    if (e.path().filename().string().rfind("run.prev-", 0) == 0) aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(fs::file_size(aside[0] / "checkpoints/step_000004/model.safetensors"), bytes4);
  EXPECT_TRUE(fs::exists(aside[0] / "checkpoints/step_000006/manifest.json"));
  EXPECT_EQ(losses((aside[0] / "metrics.jsonl").string()).size(), 6u);
}

// The same text prepared as Megatron .bin/.idx trains exactly as weft's .tok
// does; a blend of the two trains, resumes bit-identically, and `weft eval`
// reports each dataset and the whole.
TEST(CliTrain, MegatronDataAndBlendsTrainResumeAndEvaluate) {
  TempDir dir;
  const auto data = corpus(dir);
  const auto r0 = run_weft("data prepare --input " + dir.path("corpus.txt") + " --out " + dir.path("mdata") +
                           " --val-fraction 0.1 --format megatron");
  ASSERT_EQ(r0.code, 0) << r0.out;
  const auto mdata = dir.path("mdata");
  const std::string steps = kSmall + " --steps 4 --warmup 2";
  auto r = run_weft("train --data " + data + steps + " --out " + dir.path("tok"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft("train --data " + mdata + steps + " --out " + dir.path("meg"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(losses(dir.path("meg/metrics.jsonl")), losses(dir.path("tok/metrics.jsonl")));

  const std::string blend = " --data 0.7 " + mdata + "/train 0.3 " + data;
  r = run_weft("train" + blend + steps + " --ckpt-every 2 --out " + dir.path("a"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("data 0.7 " + mdata + "/train 0.3 " + data), std::string::npos) << r.out;
  r = run_weft("train" + blend + steps + " --resume-from " + dir.path("a/checkpoints/step_000002") + " --out " +
               dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto a = losses(dir.path("a/metrics.jsonl"));
  const auto b = losses(dir.path("b/metrics.jsonl"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], a[2]);
  EXPECT_EQ(b[1], a[3]);
  EXPECT_NE(a, losses(dir.path("tok/metrics.jsonl")));

  const auto ckpt = dir.path("a/checkpoints/step_000004");
  r = run_weft("eval --checkpoint " + ckpt + " --samples 3 --data " + mdata + " " + data);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const std::string& s : std::vector<std::string>{"  " + mdata + ": loss ", "  " + data + ": loss ", "overall: loss ", "perplexity",
                              "3 validation samples of 32 tokens", "the mean over every token"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  // The two hold the same validation tokens, so their losses agree.
  const auto loss_of = [&](const std::string& out, const std::string& label) {
    const auto at = out.find(label + ": loss ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + label.size() + 7));
  };
  EXPECT_GT(loss_of(r.out, "  " + mdata), 0);
  EXPECT_EQ(loss_of(r.out, "  " + mdata), loss_of(r.out, "  " + data));
  r = run_weft("eval --checkpoint " + ckpt + " --samples 3 --data 0.25 " + mdata + "/train 0.75 " + data);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const std::string& s : std::vector<std::string>{"0.25 x " + mdata + "/train: loss", "0.75 x " + data + ": loss", "3 training samples",
                              "weighted by the blend"})
    EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "' in\n" << r.out;
  const double overall = loss_of(r.out, "overall");
  EXPECT_NEAR(overall, 0.25 * loss_of(r.out, "0.25 x " + mdata + "/train") + 0.75 * loss_of(r.out, "0.75 x " + data),
              2e-6);
}

TEST(CliTrain, BadInputIsOneClearLineAndNothingIsOverwritten) {
  TempDir dir;
  const auto data = corpus(dir);
  // A good checkpoint to protect.
  auto r = run_weft("train --data " + data + kSmall + " --steps 2 --out " + dir.path("good"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ckpt = dir.path("good/checkpoints/step_000002");
  const auto size_before = fs::file_size(ckpt + "/model.safetensors");

  const auto empty = dir.file("empty.tok", "");
  // A Megatron pair whose .bin has two bytes more than its .idx describes.
  ASSERT_EQ(run_weft("data prepare --input " + dir.path("corpus.txt") + " --out " + dir.path("mdata") +
                     " --format megatron").code, 0);
  fs::copy(dir.path("mdata/train.idx"), dir.path("broken.idx"));
  fs::copy(dir.path("mdata/train.bin"), dir.path("broken.bin"));
  std::ofstream(dir.path("broken.bin"), std::ios::app | std::ios::binary) << "xx";
  const auto tiny_text = dir.file("tiny.txt", "hello there\n");
  ASSERT_EQ(run_weft("data prepare --input " + tiny_text + " --out " + dir.path("tinydata") +
                     " --val-fraction 0").code, 0);
  // A corrupted copy of the good checkpoint.
  fs::copy(ckpt, dir.path("corrupt"), fs::copy_options::recursive);
  {
    std::fstream f(dir.path("corrupt/model.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  struct Case {
    std::string args;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"--data " + dir.path("missing"), {"missing"}},
      {"--data " + dir.path("broken"), {"broken.bin", "broken.idx", "bytes"}},
      {"--data 0.7 " + data + " x " + data, {"weight 'x'", "not a number"}},
      {"--data 0.7 " + data + " -0.3 " + data, {"weight -0.3", ">= 0"}},
      {"--data 0 " + data + " 0 " + data, {"summing to 0"}},
      {"--data 0.7 " + data + " 0.3", {"no path"}},
      {"--data 1 " + data + " 1 " + dir.path("tinydata") + " --seq 64", {"sequence length 64", "tinydata"}},
      {"--data " + empty, {"empty"}},
      {"--data " + data + " --model tiny-test", {"vocab", "96"}},
      {"--data " + dir.path("tinydata") + " --seq 4096", {"4096"}},
      {"--data " + data + " --lr nan", {"--lr"}},
      {"--data " + data + " --lr inf", {"--lr"}},
      {"--data " + data + " --steps 99999999999999999999", {"--steps", "99999999999999999999", "64-bit"}},
      {"--data " + data + " --threads -1", {"--threads -1"}},
      {"--data " + data + " --eval-every -1", {"--eval-every -1"}},
      {"--data " + data + " --ckpt-every -1", {"--ckpt-every -1"}},
      {"--data " + data + " --comm-timeout nan", {"--comm-timeout", "nan", "finite"}},
      {"--data " + data + " --seq 2147483647", {"2147483647"}},
      {"--data " + data + " --steps 0", {"--steps 0"}},
      {"--data " + data + " --mb 3", {"global batch 4", "mb*dp"}},
      {"--data " + data + " --ckpt sometimes", {"sometimes"}},
      // --cp and --cp-comm choose the layout's context parallelism by hand.
      {"--data " + data + " --cp 2", {"tp*cp*pp*dp = 1*2*1*1 = 2", "world size 1"}},
      {"--data " + data + " --cp 0", {"--cp 0", "at least 1"}},
      {"--data " + data + " --cp-comm tree", {"'tree'", "ring, allgather, a2a"}},
      {"--data " + data + " --cp-comm a2a", {"cp:a2a", "cp=1"}},
      // --fp8 chooses the GEMM precision by hand (emulated on the CPU).
      // --zero chooses the ZeRO stage by hand, or pins it under --auto.
      {"--data " + data + " --zero 4", {"--zero 4", "0, 1, 2 or 3"}},
      {"--data " + data + " --zero 1 --layout tp1-pp1-dp1-mb2-zero2", {"--zero 1", "zero2", "disagree"}},
      {"--data " + data + " --fp8 fast", {"--fp8", "'fast'", "tensorwise, delayed, off"}},
      {"--data " + data + " --fp8 off@1", {"--fp8 'off@1'", "@N applies to tensorwise, delayed and blockwise"}},
      {"--data " + data + " --fp8 delayed@2", {"fp8:delayed@2", "all L=4"}},
      {"--data " + data + " --device cuda", {"cuda"}},
      {"--data " + data + " --resume-from " + ckpt + " --vocab 300", {"vocab", "300", "256"}},
      {"--data " + data + " --resume-from " + dir.path("corrupt"), {"model.safetensors"}},
      {"--data " + data + " --resume-from " + dir.path("nope"), {"nope"}},
      {"--data " + data + " --layout tp1-pp1-dp1-mb-1", {"mb is -1", "at least 1"}},
      {"--data " + data + " --vocab 0", {"--vocab 0", "from 1 to 2147483648"}},
      {"--data " + data + " --layout ''", {"--layout", "empty"}},
      {"--data " + data + " --overwrite --resume-from " + ckpt, {"--overwrite", "--resume-from " + ckpt}},
      {"--data " + data + " --step 3", {"--step", "did you mean --steps?"}},
      {"--data " + data + " --eval-sample 3", {"did you mean --eval-samples?"}},
      // The memory model against this machine, before anything is allocated.
      {"--data " + data + " --vocab 2147483647", {"layout tp1-pp1-dp1-mb2-", "does not fit", "bytes", "cpu"}},
  };
  for (const auto& c : cases) {
    // The failing runs write into the good run's folder: nothing may change there.
    const auto res = run_weft("train" + kSmall + " --steps 3 --out " + dir.path("good") + " " + c.args);
    EXPECT_EQ(res.code, 2) << c.args << "\n" << res.out;
    EXPECT_EQ(std::count(res.out.begin(), res.out.end(), '\n'), 1) << c.args << "\n" << res.out;
    EXPECT_EQ(res.out.rfind("weft: error: ", 0), 0u) << c.args << "\n" << res.out;
    for (const auto& s : c.says) EXPECT_NE(res.out.find(s), std::string::npos) << c.args << "\n" << res.out;
  }
  EXPECT_EQ(fs::file_size(ckpt + "/model.safetensors"), size_before);
  EXPECT_FALSE(fs::exists(dir.path("good/checkpoints/step_000003")));
  EXPECT_EQ(losses(dir.path("good/metrics.jsonl")).size(), 2u);
}

TEST(CliTrain, RecipesFromTheDryRunAreCheckedAndReused) {
  TempDir dir;
  const auto data = corpus(dir);
  const auto recipe = dir.path("tiny.json");
  auto r = run_weft("tune --dry-run --model tiny --gpu cpu --gpus 1 --seq 32 --global-batch 4 --precision fp32 "
                    "--save-recipe " + recipe);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft("recipe show " + recipe);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tiny on 1 x cpu"), std::string::npos) << r.out;
  // A matching run uses it; a different sequence length is refused by name.
  r = run_weft("train --data " + data + " --model tiny --seq 32 --global-batch 4 --threads 1 --steps 2 --recipe " +
               recipe + " --out " + dir.path("a"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft("train --data " + data + " --model tiny --seq 16 --global-batch 4 --threads 1 --steps 2 --recipe " +
               recipe + " --out " + dir.path("b"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("seq: recipe 32, this run 16"), std::string::npos) << r.out;
  r = run_weft("train --data " + data + " --model tiny --seq 16 --global-batch 4 --threads 1 --steps 2 --recipe " +
               recipe + " --force-recipe --out " + dir.path("c"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: using recipe"), std::string::npos) << r.out;
  r = run_weft("recipe list " + dir.path(""));
  EXPECT_NE(r.out.find("tiny.json: tiny on 1 x cpu"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace weft::test
