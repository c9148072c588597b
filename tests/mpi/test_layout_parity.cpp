// Layout parity with real mpirun processes: a tiny GQA Llama trained 5 steps
// from the same seed and data under many layouts (tp, sp, pp 1F1B and interleaved, dp, ZeRO-1, 2 and 3,
// micro-batch 1 and 2, checkpointing modes, attention and norm variants) on 1, 2, 4 and 8
// ranks must give the single-rank losses within a relative 1e-5 (fp32). Every
// rank's arena peaks must match the memory model's prediction for its stage
// within 5% per category. A checkpoint saved under one layout resumes under
// another with the same losses. Prints the table of layouts and deviations.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../e2e/cli_runner.h"
#include "../unit/test_util.h"
#include "mpi_env.h"
#include "parity_fixture.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

TEST(LayoutParity, LossesMatchTheSingleRankRunAndMemoryMatchesTheModel) {
  Fixture f;
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  const std::vector<std::string> layouts = {
      "tp1-pp1-dp1-mb1",
      "tp2-pp1-dp1-mb2",
      "tp1-pp2-dp1-mb1",
      "tp1-pp1-dp2-mb2",
      "tp2-pp2-dp1-mb1-ckpt:full",
      "tp2-pp1-dp2-mb1-ckpt:selective",
      "tp1-pp2-dp2-mb2-ckpt:ffn",
      "tp4-pp1-dp1-mb2-attn:materialized-norm:unfused",
      "tp1-pp4-dp1-mb1-ckpt:full@1",
      "tp2-pp2-dp2-mb1",
      "tp1-pp8-dp1-mb1",
      "tp2-pp1-dp4-mb1-ckpt:full",
      "tp4-pp2-dp1-mb2",
      "tp2-pp1-dp1-mb2-sp",
      "tp2-pp2-dp2-mb1-sp-ckpt:selective",
      "tp1-pp1-dp2-mb2-zero1",
      "tp2-pp1-dp2-mb1-sp-zero1-norm:unfused",
      "tp1-pp2-dp4-mb1-zero1",
      "tp1-pp2-dp1-mb1-vpp2",
      "tp1-pp4-dp1-mb1-vpp2",
      "tp2-pp2-dp2-mb1-vpp2-sp-zero1-ckpt:full@2",
      "tp1-pp1-dp2-mb2-zero2",
      "tp2-pp2-dp2-mb1-vpp2-sp-zero2",
      "tp1-pp1-dp4-mb1-zero2-ckpt:full",
      "tp1-pp1-dp2-mb2-zero3",
      "tp2-pp2-dp2-mb1-sp-zero3",
      "tp1-pp2-dp4-mb1-zero3-ckpt:full",
      "tp1-pp4-dp2-mb1-vpp2-zero3",
      "tp2-pp1-dp2-mb1-zero3-ckpt:selective-attn:materialized-norm:unfused",
      "tp1-pp1-dp4-mb1-zero3-ckpt:ffn",
  };
  std::printf("%s", parity_table(f, ref, layouts).c_str());
}

// Context parallelism: every transport at cp 2 and 4, and composed with tp
// and sp, interleaved pp, dp under ZeRO-1, -2 and -3, checkpointing,
// materialized attention and the unfused norm; the same losses as one rank,
// and each rank's arena equal to the memory model per category.
TEST(LayoutParity, ContextParallelism) {
  Fixture f;
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  const std::vector<std::string> layouts = {
      "tp1-cp2-pp1-dp1-mb2-cp:ring",
      "tp1-cp2-pp1-dp1-mb2-cp:allgather",
      "tp1-cp2-pp1-dp1-mb2-cp:a2a",
      "tp1-cp4-pp1-dp1-mb2-cp:ring",
      "tp1-cp4-pp1-dp1-mb1-cp:allgather",
      "tp1-cp4-pp1-dp1-mb2-cp:a2a",
      "tp2-cp2-pp1-dp1-mb2-sp-cp:ring",
      "tp2-cp2-pp1-dp1-mb1-sp-cp:a2a",
      "tp1-cp2-pp2-dp1-mb1-vpp2-cp:ring",
      "tp1-cp2-pp1-dp2-mb1-zero1-cp:allgather",
      "tp1-cp2-pp1-dp2-mb2-zero2-attn:materialized-norm:unfused-cp:a2a",
      "tp1-cp2-pp1-dp2-mb1-zero3-cp:ring",
      "tp1-cp2-pp1-dp1-mb2-ckpt:full-cp:ring",
      "tp1-cp2-pp1-dp1-mb2-ckpt:selective-cp:a2a",
      "tp1-cp2-pp1-dp1-mb2-ckpt:ffn-attn:materialized-cp:allgather",
      "tp2-cp2-pp2-dp1-mb1-sp-ckpt:full@2-cp:allgather",
  };
  std::printf("%s", parity_table(f, ref, layouts).c_str());
}

// FP8 (emulated on the CPU): the scales agree across layouts, for
// tensorwise (amaxes reduced over tp and cp at each cast) and delayed scaling
// (histories reduced over the stage's ranks each step), with tp and sp, pp
// 1F1B and interleaved, dp under ZeRO-1, -2 and -3 (whose weights are
// quantised at each use), cp's three transports, checkpointing and bf16 edge
// blocks. The model's GEMMs are multiples of 16 up to tp 2, and every layout
// keeps B*T/cp rows a multiple of 16, so every GEMM of an FP8 block runs in
// FP8. The FP8 losses differ from fp32's (the quantisation is real).
//
// The bounds: the first step's loss, from the same weights, within 5e-5 of
// the one-rank run's (measured 1.3e-5 at most here, 2.1e-7 on other text;
// with each rank scaling by its own part's amax instead, 1.1e-4 under cp 2
// and 3.8e-4 under tp 2). Later steps within 3e-3 (measured 1.0e-3 here, 1.8e-3
// at most on other text): a summation-order difference
// of 1e-7 moves a few values across a rounding boundary of the 3-bit (E4M3)
// or 2-bit (E5M2) mantissa, a 6-25% change of that value, which moves its
// neighbours' values across theirs in the next GEMMs; layouts that sum in
// the same order as one rank (pp, and dp up to the gradient reduction) stay
// closer (2e-5 to 2e-4 here after five steps).
TEST(LayoutParity, Fp8ScalesAgreeAcrossLayouts) {
  Fixture f;
  const auto fp32 = f.train("tp1-pp1-dp1-mb2", f.dir.path("fp32"));
  std::string table = fmt::format("{:<62} {:>5} {:>12} {:>14}\n", "layout", "ranks", "max rel dev", "worst mem dev");
  for (const char* recipe : {"fp8:tensorwise", "fp8:delayed"}) {
    const auto ref = f.train(fmt::format("tp1-pp1-dp1-mb2-{}", recipe), f.dir.path(fmt::format("ref-{}", recipe)));
    ASSERT_EQ(ref.size(), 5u);
    const double off = max_rel(ref, fp32);
    EXPECT_GT(off, 1e-3) << recipe << ": FP8 barely changed the losses, so little was quantised";
    EXPECT_LT(off, 0.02) << recipe;
    table += fmt::format("{:<62} {:>5} {:>12.2e} {:>14}\n", fmt::format("({} against fp32)", recipe), 1, off, "");
    const std::vector<std::string> layouts = {
        "tp2-pp1-dp1-mb2",
        "tp2-pp1-dp1-mb2-sp",
        "tp1-pp2-dp1-mb2",
        "tp1-pp2-dp1-mb2-vpp2-ckpt:full",
        "tp1-pp1-dp2-mb2-zero1",
        "tp2-pp1-dp2-mb2-zero2-ckpt:selective",
        "tp1-pp1-dp2-mb2-zero3",
        "tp1-cp2-pp1-dp1-mb2-cp:ring",
        "tp1-cp2-pp1-dp1-mb2-cp:allgather",
        "tp2-cp2-pp1-dp1-mb2-sp-cp:a2a",
        "tp2-cp2-pp2-dp1-mb2-ckpt:ffn-cp:ring",
        "tp1-cp2-pp1-dp2-mb2-zero3-cp:allgather",
    };
    for (const auto& layout : layouts) table += parity_row(f, ref, layout + "-" + recipe, 3e-3, 5e-5);
  }
  // Edge blocks in bf16 (here fp32): the first and last block unquantised.
  const auto edge = f.train("tp1-pp1-dp1-mb2-fp8:tensorwise@1", f.dir.path("edge"));
  table += parity_row(f, edge, "tp2-pp2-dp1-mb2-sp-fp8:tensorwise@1", 3e-3, 5e-5);
  std::printf("%s", table.c_str());
}

// FP8 inputs kept for the weight gradients (memory::fp8_saved_inputs): a
// block that keeps the norm outputs and the SwiGLU output as the forward's
// codes must multiply exactly what a block recomputing them quantises again
// (the same values under the same scale). Full recomputation keeps none, ffn
// keeps only the attention norm's, none keeps all three: the losses are
// identical, not merely close, under sp (the codes gathered again), pipelining
// (several micro-batches' codes in flight) and cp (scales over cp). A kept
// input read from another micro-batch or layer moves them by ~1e-3, inside
// the parity bound above, so this test holds them to equality.
TEST(LayoutParity, Fp8KeptInputsAreWhatRecomputationQuantises) {
  Fixture f;
  for (const char* base : {"tp2-pp2-dp1-mb2-sp-fp8:tensorwise", "tp1-pp2-dp1-mb2-vpp2-fp8:delayed",
                           "tp2-cp2-pp1-dp1-mb2-sp-cp:ring-fp8:tensorwise"}) {
    const std::string layout = base;
    const size_t at = layout.find("-fp8:");
    const auto with = [&](const char* ckpt) { return layout.substr(0, at) + "-ckpt:" + ckpt + layout.substr(at); };
    const auto none = f.train(layout, f.dir.path(std::string("none-") + base));
    ASSERT_EQ(none.size(), 5u) << layout;
    for (const char* mode : {"full", "ffn"}) {
      const auto other = f.train(with(mode), f.dir.path(std::string(mode) + "-" + base));
      ASSERT_EQ(other.size(), 5u) << with(mode);
      for (size_t i = 0; i < none.size(); ++i)
        EXPECT_EQ(other[i], none[i]) << with(mode) << " step " << i + 1 << " against ckpt:none";
    }
  }
}

// Block scaling: its tiles are 128 wide, so a model whose local GEMM
// dimensions stay multiples of 128 under tp 2 (C 256, F 256, 4 heads and 4
// kv heads of 64) and sequences whose cp 2 chunks are 128 tokens (T 512).
// No amax crosses ranks: every tile lies inside one rank's part and is the
// tile one rank would form, so each layout quantises what one rank does;
// the bounds are tensorwise's, for the same rounding-boundary reason.
constexpr const char* kBlockConfig = R"({"vocab_size": 256, "hidden_size": 256, "intermediate_size": 256,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";

TEST(LayoutParity, Fp8BlockScalesAgreeAcrossLayouts) {
  Fixture f(false, kBlockConfig);
  f.seq = 512;
  f.global_batch = 4;
  f.steps = 3;
  const auto fp32 = f.train("tp1-pp1-dp1-mb2", f.dir.path("fp32"));
  const auto ref = f.train("tp1-pp1-dp1-mb2-fp8:blockwise", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 3u);
  const double off = max_rel(ref, fp32);
  EXPECT_GT(off, 1e-4) << "block-scaled FP8 barely changed the losses, so little was quantised";
  EXPECT_LT(off, 0.02);
  std::string table = fmt::format("{:<62} {:>5} {:>12} {:>14}\n", "layout", "ranks", "max rel dev", "worst mem dev");
  table += fmt::format("{:<62} {:>5} {:>12.2e} {:>14}\n", "(fp8:blockwise against fp32)", 1, off, "");
  for (const char* layout : {"tp2-pp1-dp1-mb2-sp", "tp1-pp2-dp1-mb2", "tp1-pp1-dp2-mb2-zero1", "tp1-pp1-dp2-mb1-zero3",
                             "tp1-cp2-pp1-dp1-mb2-cp:ring", "tp2-cp2-pp1-dp1-mb1-sp-cp:allgather"})
    table += parity_row(f, ref, std::string(layout) + "-fp8:blockwise", 3e-3, 5e-5);
  std::printf("%s", table.c_str());
}

// Tied embeddings: over several stages the first stage's table and the last
// stage's head copy are kept equal by summing their gradients, on the
// reduced shards under ZeRO-1, -2 and -3; on one stage under ZeRO-2 and -3
// the head's part of the table's gradient is reduced as a group of its own,
// and under ZeRO-3 the head gathers the table with the final norm.
TEST(LayoutParity, TiedEmbeddings) {
  Fixture f(/*tied=*/true);
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  for (const char* layout : {"tp1-pp2-dp1-mb1", "tp2-pp2-dp2-mb1-sp-zero1", "tp1-pp4-dp1-mb1-vpp2",
                             "tp1-pp1-dp2-mb1-zero2", "tp2-pp2-dp2-mb1-sp-zero2", "tp1-pp1-dp2-mb1-zero3",
                             "tp1-pp2-dp2-mb1-zero3", "tp2-pp2-dp2-mb1-sp-zero3", "tp1-cp2-pp2-dp1-mb1-cp:ring",
                             "tp1-cp2-pp1-dp2-mb1-zero1-cp:a2a"}) {
    const auto losses = f.train(layout, f.dir.path(std::string("t-") + layout));
    EXPECT_LE(max_rel(losses, ref), 1e-5) << layout;
  }
}

// A vocabulary tp does not divide (259 ids, byte data under 256) is padded
// to a multiple of 128 x tp: 512 rows at tp 2 and 4, so at tp 4 one rank
// holds only padding and another three real ids. The padding is masked out of
// the loss: the losses are the unpadded single rank's (fp32, 1e-5), tied or
// not, over pp and sp and ZeRO-3, and every rank's arena is the memory
// model's. A checkpoint stores the 259 rows only and resumes under other
// paddings, and without one.
constexpr const char* kOddVocabConfig = R"({"vocab_size": 259, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";

// The rows of tensor `name` in a safetensors file, from its JSON header.
int64_t safetensors_rows(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(size_t(n), '\0');
  in.read(header.data(), std::streamsize(n));
  return nlohmann::json::parse(header).at(name).at("shape").at(0).get<int64_t>();
}

TEST(LayoutParity, PaddedVocabulary) {
  for (const bool tied : {false, true}) {
    Fixture f(tied, kOddVocabConfig);
    const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
    ASSERT_EQ(ref.size(), 5u);
    std::string table;
    const std::vector<std::string> layouts =
        tied ? std::vector<std::string>{"tp4-pp1-dp1-mb2", "tp2-pp2-dp1-mb1-sp"}
             : std::vector<std::string>{"tp2-pp1-dp1-mb2", "tp4-pp1-dp1-mb2", "tp2-pp2-dp1-mb1-sp",
                                        "tp2-pp1-dp2-mb1-zero3"};
    for (const auto& layout : layouts) table += parity_row(f, ref, layout);
    std::printf("%s%s", tied ? "tied:\n" : "", table.c_str());
    if (tied) continue;
    const auto saved = f.dir.path("save-tp2");
    const auto r = Fixture::run_mpi(
        2, fmt::format("train --data {} --model {} --seq {} --global-batch {} --steps {} --warmup 2 --log-every 1 "
                       "--threads 1 --eval-samples 8 --layout tp2-pp1-dp1-mb2 --ckpt-every 3 --out {}",
                       f.data, f.config, f.seq, f.global_batch, f.steps, saved));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("vocabulary padded from 259 to 512 for tp=2"), std::string::npos) << r.out;
    const auto ckpt = saved + "/checkpoints/step_000003";
    EXPECT_EQ(safetensors_rows(ckpt + "/model.safetensors", "model.embed_tokens.weight"), 259);
    EXPECT_EQ(safetensors_rows(ckpt + "/model.safetensors", "lm_head.weight"), 259);
    for (const char* to : {"tp1-pp1-dp1-mb2", "tp4-pp1-dp1-mb2"}) {
      const auto losses = f.train(to, f.dir.path(std::string("resumed-") + to), "--resume-from " + ckpt);
      ASSERT_EQ(losses.size(), 2u) << to;
      for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(losses[i], ref[3 + i], 1e-5 * ref[3 + i]) << to << " step " << 4 + i;
    }
    // Exported at the model's 259 ids, and a start for runs padded or not.
    const auto exported = f.dir.path("exported");
    const auto e = run_weft("export --checkpoint " + ckpt + " --out " + exported);
    ASSERT_EQ(e.code, 0) << e.out;
    std::ifstream cfg(exported + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(cfg).at("vocab_size"), 259);
    EXPECT_EQ(safetensors_rows(exported + "/model.safetensors", "lm_head.weight"), 259);
    f.steps = 2;
    const auto init_ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("init-tp1"), "--init " + exported);
    const auto init_tp4 = f.train("tp4-pp1-dp1-mb2", f.dir.path("init-tp4"), "--init " + exported);
    ASSERT_EQ(init_ref.size(), 2u);
    EXPECT_LE(max_rel(init_tp4, init_ref), 1e-5);
  }
}

TEST(LayoutParity, CheckpointsReshardAcrossLayouts) {
  Fixture f;
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("ref"));
  // Save at step 3 under one layout, resume to step 5 under others.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"tp2-pp2-dp1-mb1", {"tp1-pp1-dp2-mb1", "tp4-pp1-dp1-mb2", "tp1-pp1-dp1-mb1", "tp1-pp1-dp4-mb1-zero3"}},
      {"tp1-pp2-dp2-mb1-zero3", {"tp1-pp1-dp2-mb1-zero1", "tp2-pp1-dp2-mb1-sp-zero3"}},
      {"tp2-pp1-dp2-mb1-sp-zero1", {"tp1-pp2-dp1-mb2", "tp1-pp1-dp2-mb1-zero1"}},
      {"tp1-pp4-dp1-mb1-vpp2", {"tp2-pp2-dp1-mb1-sp"}},
      {"tp1-pp1-dp4-mb1-zero2", {"tp1-pp1-dp2-mb1-zero1"}},
      // Across context-parallel degrees and transports.
      {"tp1-cp2-pp1-dp2-mb1-zero1-cp:ring", {"tp1-pp1-dp1-mb2", "tp1-cp4-pp1-dp1-mb1-cp:allgather"}},
      {"tp1-pp1-dp2-mb1", {"tp2-cp2-pp1-dp1-mb1-sp-cp:a2a"}},
  };
  for (const auto& [from, tos] : cases) {
    const auto saved = f.dir.path("a-" + from);
    f.train(from, saved, "--ckpt-every 3");
    const auto ckpt = saved + "/checkpoints/step_000003";
    ASSERT_TRUE(fs::exists(ckpt + "/manifest.json")) << from;
    for (const auto& to : tos) {
      const auto losses = f.train(to, f.dir.path("b-" + from + "-" + to), "--resume-from " + ckpt);
      ASSERT_EQ(losses.size(), 2u) << from << " -> " << to;
      for (size_t i = 0; i < 2; ++i)
        EXPECT_NEAR(losses[i], ref[3 + i], 1e-5 * ref[3 + i]) << from << " -> " << to << " step " << 4 + i;
    }
  }
  // Delayed FP8 scaling carries its amax history in the checkpoint: resumed
  // under layouts that sum in one rank's order (pp, vpp, dp), the losses are
  // the uninterrupted run's exactly; without the history step 4 would scale
  // from its own amaxes and differ.
  const auto fp8_ref = f.train("tp1-pp1-dp1-mb2-fp8:delayed", f.dir.path("fp8-ref"), "--ckpt-every 3");
  const auto fp8_ckpt = f.dir.path("fp8-ref") + "/checkpoints/step_000003";
  for (const std::string to : {"tp1-pp1-dp1-mb2-fp8:delayed", "tp1-pp2-dp1-mb2-vpp2-fp8:delayed",
                               "tp1-pp1-dp2-mb2-zero1-fp8:delayed"}) {
    const auto losses = f.train(to, f.dir.path("fp8-b-" + to), "--resume-from " + fp8_ckpt);
    ASSERT_EQ(losses.size(), 2u) << to;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(losses[i], fp8_ref[3 + i], 1e-7 * fp8_ref[3 + i]) << to << " step " << 4 + i;
  }
  // The same checkpoint resumed with tensorwise scaling (no history) takes other steps.
  const auto tensorwise = f.train("tp1-pp1-dp1-mb2-fp8:tensorwise", f.dir.path("fp8-tw"), "--resume-from " + fp8_ckpt);
  ASSERT_EQ(tensorwise.size(), 2u);
  EXPECT_GT(std::fabs(tensorwise[0] - fp8_ref[3]) / fp8_ref[3], 1e-6);
}

// LoRA: the adapters shard with their base layers under tp (B split with a
// column-parallel layer's outputs, A with a row-parallel layer's inputs,
// the whole halves' gradients summed over tp), sp, pp 1F1B and interleaved,
// dp under ZeRO-0 to 3 (only adapters are sharded; the frozen base is
// whole on every dp rank), cp, checkpointing and tied embeddings (frozen);
// the same losses as one rank, and each rank's arena equal to the memory
// model per category. A LoRA checkpoint (the adapters, and the random base
// by its seed) resumes under other layouts with the uninterrupted losses.
TEST(LayoutParity, Lora) {
  Fixture f;
  const std::string lora = "--lora 4 --lora-alpha 6";
  const auto ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("lora-ref"), lora + " --ckpt-every 3");
  ASSERT_EQ(ref.size(), 5u);
  const auto full = f.train("tp1-pp1-dp1-mb2", f.dir.path("full-ref"));
  EXPECT_GT(max_rel(ref, full), 1e-4) << "LoRA trains other weights than full training";
  std::string table = fmt::format("{:<62} {:>5} {:>12} {:>14}\n", "layout (LoRA r 4)", "ranks", "max rel dev",
                                  "worst mem dev");
  for (const std::string layout :
       {"tp2-pp1-dp1-mb2", "tp2-pp1-dp1-mb2-sp", "tp1-pp2-dp1-mb1", "tp1-pp1-dp2-mb2-zero1",
        "tp1-pp1-dp2-mb2-zero3", "tp2-pp2-dp2-mb1", "tp1-pp1-dp2-mb1-zero2-ckpt:full",
        "tp2-pp2-dp2-mb1-vpp2-sp-zero2-ckpt:selective", "tp4-pp1-dp1-mb2-ckpt:ffn-norm:unfused",
        "tp2-pp1-dp2-mb1-sp-zero3-attn:materialized", "tp1-cp2-pp1-dp1-mb2-cp:ring",
        "tp2-cp2-pp1-dp1-mb1-sp-cp:a2a"})
    table += parity_row(f, ref, layout, 1e-5, 1e-5, lora);
  // Dropout on the adapters' inputs: every layout draws the same mask.
  const std::string drop = lora + " --lora-dropout 0.3";
  const auto drop_ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("drop-ref"), drop);
  EXPECT_GT(max_rel(drop_ref, ref), 1e-5) << "dropout changed nothing";
  for (const std::string layout : {"tp2-pp1-dp1-mb2-sp", "tp2-pp2-dp2-mb1-zero3-ckpt:full", "tp1-pp2-dp1-mb1-vpp2",
                                   "tp2-cp2-pp1-dp1-mb1-cp:allgather"})
    table += parity_row(f, drop_ref, layout, 1e-5, 1e-5, drop);
  // Adapters on some layers only; without down_proj's no SwiGLU output is
  // kept (the memory model agrees), under recomputation too.
  const std::string qv = "--lora 2 --lora-targets q,v,gate";
  const auto qv_ref = f.train("tp1-pp1-dp1-mb2", f.dir.path("qv-ref"), qv);
  table += parity_row(f, qv_ref, "tp2-pp2-dp2-mb1-sp-zero1", 1e-5, 1e-5, qv);
  table += parity_row(f, qv_ref, "tp2-pp1-dp2-mb1-zero2-ckpt:ffn", 1e-5, 1e-5, qv);
  std::printf("%s", table.c_str());
  // Tied embeddings stay tied and frozen over several stages.
  Fixture tied(/*tied=*/true);
  const auto tied_ref = tied.train("tp1-pp1-dp1-mb2", tied.dir.path("ref"), lora);
  EXPECT_LE(max_rel(tied.train("tp1-pp2-dp2-mb1-zero3", tied.dir.path("pp2"), lora), tied_ref), 1e-5);
  // Resumed under other layouts from the step-3 checkpoint.
  const auto ckpt = f.dir.path("lora-ref") + "/checkpoints/step_000003";
  for (const std::string to : {"tp2-pp2-dp1-mb1-sp", "tp1-pp1-dp4-mb1-zero3"}) {
    const auto losses = f.train(to, f.dir.path("lora-b-" + to), lora + " --resume-from " + ckpt);
    ASSERT_EQ(losses.size(), 2u) << to;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(losses[i], ref[3 + i], 1e-5 * ref[3 + i]) << to << " step " << 4 + i;
  }
  // Other LoRA settings than the checkpoint's are refused by name.
  const auto r = run_weft(fmt::format("train --data {} --model {} --seq 16 --global-batch 8 --steps 5 --layout mb2 "
                                      "--out {} --lora 8 --resume-from {}",
                                      f.data, f.config, f.dir.path("lora-bad"), ckpt));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("LoRA rank 4"), std::string::npos) << r.out;
}

TEST(LayoutParity, BadLayoutsAreClearErrors) {
  Fixture f;
  // Three ranks for a four-rank layout.
  auto r = Fixture::run_mpi(3, "train --data " + f.data + " --model " + f.config +
                                   " --seq 16 --global-batch 8 --steps 2 --layout tp2-pp2-dp1 --out " +
                                   f.dir.path("x"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("tp*pp*dp = 2*2*1 = 4 must equal the world size 3"), std::string::npos) << r.out;
  // A layout that does not divide the model.
  r = Fixture::run_mpi(2, "train --data " + f.data + " --model " + f.config +
                              " --seq 16 --global-batch 8 --steps 2 --layout tp1-pp2-dp1-vpp3 --out " +
                              f.dir.path("y"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("pp*vpp"), std::string::npos) << r.out;
}

// A rank that cannot open the checkpoint to resume from (as if its node
// lacked the file) fails before any collective, and so does every other
// rank, promptly and naming why, instead of waiting for it in the first step.
TEST(LayoutParity, ARankThatCannotBuildItsRunFailsEveryRank) {
  Fixture f;
  const auto saved = f.dir.path("good");
  f.train("tp1-pp1-dp2-mb1", saved, "--ckpt-every 3");
  const auto ckpt = saved + "/checkpoints/step_000003";
  ASSERT_TRUE(fs::exists(ckpt + "/manifest.json"));
  const std::string args = fmt::format(
      "train --data {} --model {} --seq 16 --global-batch 8 --steps 5 --threads 1 --comm-timeout 60 "
      "--layout tp1-pp1-dp2-mb1 --out {}",
      f.data, f.config, f.dir.path("resumed"));
  // Two programs under one mpirun: rank 0 resumes from the checkpoint, rank
  // 1 from a folder that is not there.
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_shell(fmt::format("{} --oversubscribe -np 1 {} {} --resume-from {} : -np 1 {} {} "
                                       "--resume-from {} 2>&1",
                                       MPIEXEC, WEFT_BIN, args, ckpt, WEFT_BIN, args, ckpt + "-missing"));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_LT(waited, 30.0) << r.out;
  EXPECT_NE(r.out.find("step_000003-missing"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("another rank failed while building the run"), std::string::npos) << r.out;
}

// A rank killed mid-run: the others must not hang. mpirun ends the job, and
// if it did not, each survivor's communication watchdog would (--comm-timeout).
// A rank killed mid-run (SIGKILL) ends the job; relaunching the same command
// with --resume in a plain loop, as a batch script or a supervisor would,
// continues from the last complete checkpoint (written in the background)
// and ends with the losses of an uninterrupted run, bit for bit.
TEST(LayoutParity, AKilledRankResumesToTheUninterruptedLosses) {
  Fixture f;
  const std::string layout = "tp1-pp2-dp2-mb1-zero1";
  const auto command = [&](const std::string& out) {
    return fmt::format(
        "{} --oversubscribe -np 4 {} train --data {} --model {} --seq 16 --global-batch 8 --steps 12 --warmup 2 "
        "--log-every 1 --threads 1 --eval-samples 8 --comm-timeout 10 --layout {} --ckpt-every 2 --out {} --resume",
        MPIEXEC, WEFT_BIN, f.data, f.config, layout, out);
  };
  const auto train_losses = [](const std::string& out) {
    std::vector<double> losses;
    std::ifstream in(out + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "train") losses.push_back(j["loss"].get<double>());
    }
    return losses;
  };
  ASSERT_EQ(run_shell(command(f.dir.path("whole")) + " > /dev/null 2>&1").code, 0);
  const auto ref = train_losses(f.dir.path("whole"));
  ASSERT_EQ(ref.size(), 12u);
  const std::string out = f.dir.path("killed");
  const std::string cmd = command(out);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string quiet = cmd + " > /dev/null 2>&1";
    ::execl("/bin/sh", "sh", "-c", quiet.c_str(), nullptr);
    ::_exit(127);
  }
  // Once a checkpoint is latest, kill one rank.
  for (int i = 0; i < 600 && !fs::exists(out + "/checkpoints/latest"); ++i) ::usleep(50000);
  const std::vector<int> ranks = weft_ranks(out);
  ASSERT_EQ(ranks.size(), 4u);
  ::kill(ranks[2], SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::printf("the job ended with exit code %d after a rank was killed\n", code);
  if (code == 0) GTEST_SKIP() << "the run finished before the kill landed";
  // The supervisor's loop: relaunch until the run completes.
  int launches = 0;
  for (; launches < 3; ++launches) {
    const auto r = run_shell(cmd + " 2>&1");
    if (r.code == 0) break;
  }
  ASSERT_LT(launches, 3) << "the relaunched run never completed";
  const auto losses = train_losses(out);
  ASSERT_EQ(losses.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(losses[i], ref[i]) << "step " << i + 1;
}

TEST(LayoutParity, ARankThatDiesEndsTheJobInBoundedTime) {
  Fixture f;
  const std::string out = f.dir.path("dying");
  const std::string cmd = fmt::format(
      "{} --oversubscribe -np 2 {} train --data {} --model {} --seq 16 --global-batch 8 --steps 1000000 "
      "--threads 1 --comm-timeout 10 --layout tp1-pp2-dp1-mb1 --out {} > /dev/null 2>&1",
      MPIEXEC, WEFT_BIN, f.data, f.config, out);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    ::_exit(127);
  }
  // Wait until training runs, then kill one rank.
  for (int i = 0; i < 300 && !fs::exists(out + "/metrics.jsonl"); ++i) ::usleep(100000);
  ::usleep(500000);
  const std::vector<int> ranks = weft_ranks(out);
  ASSERT_EQ(ranks.size(), 2u) << "could not find the two ranks";
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(ranks.back(), SIGKILL);
  int status = 0;
  for (int i = 0; i < 600; ++i) {
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    ::usleep(100000);
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_LT(waited, 60.0) << "the job did not end";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  // Every rank process is gone (or a zombie awaiting its parent) soon after.
  auto alive = [](int x) {
    std::ifstream st("/proc/" + std::to_string(x) + "/status");
    for (std::string line; std::getline(st, line);)
      if (line.rfind("State:", 0) == 0) return line.find('Z') == std::string::npos;
    return false;
  };
  for (int x : ranks) {
    for (int i = 0; i < 100 && alive(x); ++i) ::usleep(100000);
    EXPECT_FALSE(alive(x)) << "rank process " << x << " still running";
  }
  std::printf("job ended %.1f s after a rank was killed\n", waited);
}

}  // namespace
}  // namespace weft::test
