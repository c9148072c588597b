// An MoE model (Mixtral's form: 8 layers of 4 experts, top-2; Llama 4's
// FFN: sigmoid top-1 on the expert's input, a shared expert, MoE layers
// interleaved with dense ones; Qwen3-MoE with its q and k norms; Llama 4's
// text model with its NoPE layers, temperature and QK L2 norm, also
// attending within chunks shorter than the sequence) trained 5
// steps from one seed under tensor (with and without sp), context,
// pipeline, interleaved and data-parallel layouts, ZeRO 0-3 and the
// checkpointing modes, with real mpirun ranks: the same losses and
// balancing losses as one rank within a relative 1e-5 (fp32), and every
// rank's arena the memory model's per category. The balancing loss is over
// each micro-batch (as in transformers and Megatron), so every layout keeps
// the reference's micro-batch of 1. Under pp the global loss's statistics
// travel with the micro-batch's activations and gradients
// (LlamaStage::moe_stats_travel). A capacity's drops match wherever the
// ranks route the reference's rows. Prints the tables. FP8 in the MoE
// blocks: test_moe_parity_fp8.cpp, a second source of this test.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/model_spec.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/safetensors.h"

#include "mpi_env.h"
#include "moe_parity_forms.h"
#include "parity_fixture.h"

namespace weft::test {
namespace {

const auto* env = ::testing::AddGlobalTestEnvironment(new MpiLaunchEnv);

TEST(MoeParity, GlobalBalancingLossOverDataAndPipelineRanks) {
  Fixture f(false, kMixtral);
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp1-dp2-mb1", "tp1-pp1-dp2-mb1-zero1", "tp1-pp1-dp2-mb1-zero2-ckpt:full",
                              "tp1-pp1-dp4-mb1-zero3-ckpt:ffn", "tp1-pp1-dp2-mb1-zero3-ckpt:selective",
                              "tp1-pp2-dp1-mb1", "tp1-pp2-dp1-mb1-vpp2", "tp1-pp4-dp1-mb1-vpp2-ckpt:full@2",
                              "tp1-pp2-dp2-mb1-zero1", "tp2-pp2-dp1-mb1-sp-ckpt:selective"},
                             "")
                        .c_str());
}

TEST(MoeParity, PerLayerBalancingLossOverPipelineStages) {
  Fixture f(false, kMixtral);
  const std::string scope = "--moe-aux-scope per_layer";
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"), scope);
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp2-dp1-mb1", "tp1-pp2-dp1-mb1-vpp2", "tp1-pp4-dp1-mb1-vpp2-ckpt:full@2",
                              "tp1-pp2-dp2-mb1-zero1", "tp1-pp2-dp2-mb1-zero3-ckpt:ffn"},
                             scope)
                        .c_str());
  // The scope changes the objective: the same run under the global loss differs.
  const auto global = f.train("tp1-pp1-dp1-mb1", f.dir.path("global"));
  ASSERT_EQ(global.size(), 5u);
  EXPECT_NE(global[4], ref[4]);
}

// A capacity caps each expert's choices per micro-batch of the rows a rank
// routes: layouts that keep the reference's rows on every rank (dp, ZeRO,
// pp, vpp, tp without sp) drop the same choices and match it; sp and cp
// split the rows, so they drop others (as in Megatron) and are not compared.
TEST(MoeParity, CapacityOverDataPipelineAndTensorRanks) {
  Fixture f(false, kMixtral);
  const std::string capacity = "--moe-capacity-factor 0.5";
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"), capacity);
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp1-dp2-mb1-zero1", "tp1-pp2-dp1-mb1-vpp2", "tp1-pp2-dp2-mb1-zero3-ckpt:ffn",
                              "tp2-pp1-dp1-mb1"},
                             capacity)
                        .c_str());
  // The capacity binds: the dropless run's losses differ.
  const auto dropless = f.train("tp1-pp1-dp1-mb1", f.dir.path("dropless"));
  ASSERT_EQ(dropless.size(), 5u);
  EXPECT_NE(dropless[4], ref[4]);
}

// Under tp the experts are whole on every rank: with sp each routes its own
// rows (their gradients summed over tp), without it all rows alike; under cp
// each routes its chunks. The router's statistics are summed over the ranks
// that split the micro-batch, so the balancing loss is the single rank's.
TEST(MoeParity, TensorAndContextParallelism) {
  forms_against_one_rank({kMixtral, kLlama4Ffn, kQwen3, kLlama4},
                         {"tp2-pp1-dp1-mb1", "tp2-pp1-dp1-mb1-sp", "tp1-cp2-pp1-dp1-mb1-cp:ring",
                          "tp1-cp2-pp1-dp1-mb1-ckpt:full-cp:a2a", "tp2-cp2-pp1-dp1-mb1-sp-cp:allgather",
                          "tp2-pp1-dp2-mb1-sp-zero1-ckpt:ffn", "tp1-cp2-pp1-dp2-mb1-zero3-cp:ring"});
}

// Expert parallelism: the experts split over ep ranks of dp x cp, each rank
// routing its own rows and sending each choice to the rank holding its
// expert (all-to-all), or gathering every rank's rows and reduce-scattering
// the outputs back (allgather). The experts' gradients sum over the ranks holding the same ones,
// the rest over every dp x cp rank, under each ZeRO stage, with tp (with
// and without sp), cp, pp and vpp beside it; and with the experts' width
// split over tp (etp2), their partial outputs summed over tp; under sp each
// tp rank routes and dispatches its own rows, and the tp ranks gather the
// rows they received and reduce-scatter the partial outputs back.
TEST(MoeParity, ExpertParallelism) {
  forms_against_one_rank({kMixtral, kLlama4Ffn},
                         {"tp1-pp1-dp2-ep2-mb1", "tp1-pp1-dp4-ep4-mb1-zero1", "tp1-pp1-dp4-ep2-mb1-zero1",
                          "tp1-pp1-dp4-ep2-mb1-zero2-ckpt:full", "tp1-pp1-dp4-ep2-mb1-zero3-ckpt:ffn",
                          "tp2-pp1-dp2-ep2-mb1-sp", "tp2-pp1-dp2-ep2-mb1-nosp-zero3",
                          "tp1-cp2-pp1-dp1-ep2-mb1-cp:ring", "tp1-pp2-dp2-ep2-mb1-vpp2-ckpt:selective",
                          "tp1-pp1-dp2-ep2-mb1-dispatch:allgather",
                          "tp1-pp1-dp4-ep4-mb1-zero1-dispatch:allgather",
                          "tp1-pp1-dp4-ep2-mb1-zero3-ckpt:ffn-dispatch:allgather",
                          "tp2-pp1-dp2-ep2-mb1-sp-dispatch:allgather",
                          "tp1-cp2-pp1-dp1-ep2-mb1-cp:allgather-dispatch:allgather",
                          "tp2-pp1-dp1-etp2-mb1", "tp2-pp1-dp2-ep2-etp2-mb1-zero1",
                          "tp2-pp1-dp2-ep2-etp2-mb1-zero3-ckpt:ffn-dispatch:allgather",
                          "tp2-pp2-dp1-etp2-mb1-vpp2-ckpt:full", "tp2-pp1-dp1-etp2-mb1-sp",
                          "tp2-pp1-dp2-ep2-etp2-mb1-sp-zero1",
                          "tp2-pp1-dp2-ep2-etp2-mb1-sp-zero3-ckpt:ffn-dispatch:allgather",
                          "tp2-cp2-pp1-dp1-ep2-etp2-mb1-sp-ckpt:full-cp:ring"});
}

// The dense parameters' optimizer state split over the ep replicas of each
// shard (memory/dense_split.h): with ZeRO 1-3 each replica updates its part
// of the shard's dense elements and the replicas gather the rest. A tied
// embedding across two stages sums its copies' gradients on the shards,
// where the replicas complete their parts first.
TEST(MoeParity, DenseStateSplitOverTheReplicas) {
  std::string tied = kMixtral;
  const std::string from = R"("tie_word_embeddings": false)";
  tied.replace(tied.find(from), from.size(), R"("tie_word_embeddings": true)");
  forms_against_one_rank({tied.c_str()}, {"tp1-pp2-dp4-ep2-mb1-zero1", "tp1-pp2-dp4-ep2-mb1-zero3-ckpt:ffn",
                                          "tp1-pp2-dp2-ep2-mb1-zero2"});
}

// LoRA on an MoE model: adapters on the attention's projections, the
// router and the experts (and Llama 4's shared expert) frozen; the
// balancing loss's gradient reaches the adapters through the router's
// input. Over tp with sp, ep (with the experts split over tp too), pp and cp.
TEST(MoeParity, LoraOnTheAttention) {
  forms_against_one_rank({kMixtral, kLlama4Ffn},
                         {"tp2-pp1-dp1-mb1-sp", "tp1-pp1-dp2-ep2-mb1-zero1",
                          "tp2-pp1-dp2-ep2-etp2-mb1-sp-zero2", "tp1-pp2-dp1-mb1-vpp2-ckpt:full",
                          "tp1-cp2-pp1-dp1-ep2-mb1-cp:ring"},
                         "--lora 4 --lora-targets q,k,v,o");
}

// One step of `config` on one rank, then under each of `layouts`: every
// tensor's gradient against the one rank's, printed (`extra`: more training
// arguments; zeros_ok as worst_gradient's).
void gradients_against_one_rank(const char* config, const std::vector<std::string>& layouts,
                                const std::string& extra = "", bool zeros_ok = false) {
  Fixture f(false, config);
  f.steps = 1;
  const std::string ref = f.dir.path("gref");
  ASSERT_EQ(f.train("tp1-pp1-dp1-mb1", ref, extra).size(), 1u);
  std::printf("%-62s %14s\n", extra.empty() ? "layout" : "layout (with extra arguments)", "worst grad dev");
  for (const std::string& layout : layouts) {
    const std::string out = f.dir.path("g-" + layout);
    ASSERT_EQ(f.train(layout, out, extra).size(), 1u) << layout;
    const double worst =
        worst_gradient(out + "/checkpoints/step_000001", ref + "/checkpoints/step_000001", layout, 1e-5, zeros_ok);
    std::printf("%-62s %14.2e\n", layout.c_str(), worst);
  }
}

TEST(MoeParity, ExpertParallelGradientsPerTensor) {
  gradients_against_one_rank(kMixtral, {"tp1-pp1-dp2-ep2-mb1", "tp1-pp1-dp4-ep4-mb1-zero3", "tp2-pp1-dp2-ep2-mb1-sp-zero1",
                                        "tp1-cp2-pp1-dp2-ep4-mb1-zero2", "tp1-pp2-dp2-ep2-mb1-vpp2",
                                        "tp1-pp1-dp4-ep4-mb1-zero1-dispatch:allgather", "tp2-pp1-dp2-ep2-etp2-mb1-zero1",
                                        "tp2-pp1-dp2-ep2-etp2-mb1-sp-zero1"});
}

// Megatron's folding of the expert grid (epfold): the ep group takes the
// tp ranks first, so each tp rank holds other experts and routes its own
// rows (sp) to them; ep = tp (the expert data-parallel group all of dp x
// cp, no replicas) and ep = 2 tp (ep / tp = 2 of dp x cp), under ZeRO 0-3,
// both dispatchers, cp, pp with vpp and recomputation. Then the gradients
// per tensor, router included, and LoRA on the experts (their adapters
// folded with them), each against one rank.
TEST(MoeParity, ExpertGridFoldedOverTensorParallelRanks) {
  forms_against_one_rank({kMixtral, kLlama4Ffn},
                         {"tp2-pp1-dp1-ep2-mb1-sp-epfold", "tp2-pp1-dp2-ep4-mb1-sp-epfold-zero1",
                          "tp2-pp1-dp2-ep2-mb1-sp-epfold-zero3-ckpt:ffn",
                          "tp2-pp1-dp2-ep4-mb1-sp-epfold-zero2-dispatch:allgather",
                          "tp2-cp2-pp1-dp1-ep4-mb1-sp-epfold-ckpt:full-cp:ring",
                          "tp2-pp2-dp1-ep2-mb1-vpp2-sp-epfold-ckpt:selective"});
  gradients_against_one_rank(kMixtral, {"tp2-pp1-dp2-ep4-mb1-sp-epfold-zero1", "tp2-pp1-dp2-ep2-mb1-sp-epfold"});
  forms_against_one_rank({kMixtral}, {"tp2-pp1-dp2-ep4-mb1-sp-epfold-zero2"}, "--lora 4 --lora-targets all");
}

// LoRA on every linear layer of an MoE model: the routed experts' fused
// gate_up and down adapters (whole on each rank that holds their expert,
// their gradients summed over the ranks holding the same ones, and over tp
// under sp or an expert tp degree, where each tp rank computes its part of
// the width), Llama 4's shared expert's and dense layers' split over tp as
// a dense FFN's; over ep with both dispatchers and ZeRO 0-3, tp with and
// without sp, etp with and without sp, cp, pp and vpp with recomputation.
// Then every adapter's gradient per tensor under ep and etp (B's: A's is
// zero at B's zero start).
TEST(MoeParity, LoraOnTheExperts) {
  forms_against_one_rank({kMixtral, kLlama4Ffn},
                         {"tp1-pp1-dp2-ep2-mb1", "tp1-pp1-dp4-ep4-mb1-zero1-dispatch:allgather",
                          "tp1-pp1-dp4-ep2-mb1-zero3-ckpt:ffn", "tp2-pp1-dp2-ep2-mb1-sp-zero2",
                          "tp2-pp1-dp1-mb1-nosp", "tp1-cp2-pp1-dp1-ep2-mb1-cp:ring",
                          "tp1-pp2-dp2-ep2-mb1-vpp2-ckpt:full", "tp2-pp1-dp1-etp2-mb1-nosp",
                          "tp2-pp1-dp2-ep2-etp2-mb1-sp-zero2-ckpt:selective"},
                         "--lora 4 --lora-targets all");
  gradients_against_one_rank(kLlama4Ffn,
                             {"tp1-pp1-dp4-ep4-mb1-zero3", "tp2-pp1-dp2-ep2-mb1-sp-zero1",
                              "tp2-pp1-dp2-ep2-etp2-mb1-sp-zero1", "tp2-pp1-dp1-etp2-mb1-nosp"},
                             "--lora 4 --lora-targets all", true);
}

// A batch routed very unevenly: a model whose routers score every expert but
// the first at exactly 0 sends every token to expert 1 (top-2 of 4: expert 0
// and then the first of the ties, or the first two ties), so one expert
// takes half of all choices, the most top-2 allows, and another none. Under
// expert parallelism one rank then computes most rows; the losses stay the
// single rank's, and the checkpoints reshard across ep degrees.
TEST(MoeParity, ExpertParallelismUnderVeryUnevenRouting) {
  Fixture f(false, kMixtral);
  const ModelSpec m = model_from_hf_config(f.config);
  // Weights drawn at random (fixed seed), the routers' rows past the first zero.
  std::mt19937_64 gen(20261129);
  std::vector<std::vector<float>> values;
  std::vector<checkpoint::TensorRef> refs;
  for (const auto& p : checkpoint::hf_param_table(m)) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    const bool norm = p.shape.size() == 1;
    std::normal_distribution<float> dist(0.0f, norm ? 0.1f : 1.0f / std::sqrt(float(p.shape.back())));
    for (auto& x : v) x = norm ? 1.0f + dist(gen) : dist(gen);
    if (p.kind == checkpoint::ParamKind::router)
      for (int64_t i = p.shape[1]; i < n; ++i) v[size_t(i)] = 0.0f;  // rows 1.. of (E, C)
    values.push_back(std::move(v));
    refs.push_back({p.name, checkpoint::DType::F32, p.shape, values.back().data()});
  }
  checkpoint::safetensors_write(f.dir.path("model/model.safetensors"), refs);
  const std::string init = "--init " + f.dir.path("model");
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"), init);
  ASSERT_EQ(ref.size(), 5u);
  // The first step's loads: expert 1 took every token in every MoE layer.
  std::ifstream in(f.dir.path("ref") + "/metrics.jsonl");
  bool seen = false;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] != "train" || j["step"] != 1) continue;
    seen = true;
    const int64_t tokens = f.seq * f.global_batch;
    for (const auto& row : j["expert_load"]["counts"]) {
      EXPECT_EQ(row[1].get<int64_t>(), tokens) << line;
      EXPECT_EQ(row[3].get<int64_t>(), 0) << line;
    }
    // The most uneven dispatch an expert each (ep 4): one took every routed
    // row, E / k times the mean expert's.
    EXPECT_DOUBLE_EQ(j["expert_load"]["dispatch_peaks"]["4"].get<double>(), double(m.moe.experts) / double(m.moe.top_k))
        << line;
  }
  EXPECT_TRUE(seen);
  std::printf("%s", table_of(f, ref,
                             {"tp1-pp1-dp2-ep2-mb1", "tp1-pp1-dp4-ep4-mb1-zero1", "tp1-pp1-dp4-ep2-mb1-zero3",
                              "tp2-pp1-dp2-ep2-mb1-sp", "tp1-pp1-dp4-ep4-mb1-dispatch:allgather",
                              "tp1-pp1-dp2-ep2-mb1-zero2-dispatch:allgather"},
                             init)
                        .c_str());
  // Receive buffers held for 2x balanced routing take it (the rank holding
  // experts 0 and 1 receives all of expert 1's rows and some of expert
  // 0's), with less memory; held for balanced routing they cannot, and
  // every rank stops naming the rows (exit 2).
  std::printf("%s", table_of(f, ref, {"tp1-pp1-dp2-ep2-mb1-zero1"}, init + " --moe-imbalance 2").c_str());
  const auto over = Fixture::run_mpi(
      2, fmt::format("train --data {} --model {} --seq {} --global-batch {} --steps 1 --threads 1 --comm-timeout 60 "
                     "--layout tp1-pp1-dp2-ep2-mb1 --moe-imbalance 1 {} --out {}",
                     f.data, f.config, f.seq, f.global_batch, init, f.dir.path("over")));
  EXPECT_EQ(over.code, 2) << over.out;
  if (const auto at = over.out.find("MoE layer"); at != std::string::npos)
    std::printf("%s\n", over.out.substr(at, over.out.find('\n', at) - at).c_str());
  EXPECT_NE(over.out.find("past the 32 its buffers hold (--moe-imbalance 1: 1 x the balanced 32); raise "
                          "--moe-imbalance (to at least 1.16 for this micro-batch; 0 holds the worst case, 64 rows)"),
            std::string::npos)
      << over.out;
  EXPECT_NE(over.out.find("no step of this launch completed, so it wrote no checkpoint"), std::string::npos)
      << over.out;
  // The same buffers under the initialised model's evaluation alone (--steps
  // 0 writes the step-0 checkpoint first): exit 2 naming the validation.
  const auto eval = Fixture::run_mpi(
      2, fmt::format("train --data {} --model {} --seq {} --global-batch {} --steps 0 --threads 1 --comm-timeout 60 "
                     "--eval-samples 8 --layout tp1-pp1-dp2-ep2-mb1 --moe-imbalance 1 {} --out {}",
                     f.data, f.config, f.seq, f.global_batch, init, f.dir.path("eval")));
  EXPECT_EQ(eval.code, 2) << eval.out;
  EXPECT_NE(eval.out.find("weft: error: the final validation: MoE layer 0: an ep rank's experts received"),
            std::string::npos)
      << eval.out;
  EXPECT_NE(eval.out.find(fmt::format("checkpoint {}/checkpoints/step_000000 holds step 0, the last completed\n",
                                      f.dir.path("eval"))),
            std::string::npos)
      << eval.out;
  // Saved at step 3 under one ep degree, resumed under others: steps 4 and
  // 5 are the reference's.
  const ReshardCases cases = {{"tp1-pp1-dp4-ep4-mb1-zero1", {"tp1-pp1-dp1-mb1", "tp1-pp1-dp2-ep2-mb1-zero3"}},
                              {"tp1-pp2-dp2-ep2-mb1", {"tp1-pp1-dp4-ep2-mb1-zero2"}}};
  for (const auto& [from, tos] : cases) {
    const auto saved = f.dir.path("a-" + from);
    f.train(from, saved, init + " --ckpt-every 3");
    for (const auto& to : tos) {
      const auto losses = f.train(to, f.dir.path("b-" + from + "-" + to),
                                  "--resume-from " + saved + "/checkpoints/step_000003");
      ASSERT_EQ(losses.size(), 2u) << from << " -> " << to;
      for (size_t i = 0; i < 2; ++i)
        EXPECT_NEAR(losses[i], ref[3 + i], 1e-5 * ref[3 + i]) << from << " -> " << to << " step " << 4 + i;
    }
  }
}

// Chunked attention under context parallelism: each transport gives the
// kernels the absolute positions of its blocks, so every one computes the
// single rank's attention within chunks (materialized through the
// all-gather; the ring takes flash only).
TEST(MoeParity, ChunkedAttentionUnderContextParallelism) {
  Fixture f(false, kLlama4Chunk);
  const auto ref = f.train("tp1-pp1-dp1-mb1", f.dir.path("ref"));
  ASSERT_EQ(ref.size(), 5u);
  std::printf("%s", table_of(f, ref,
                             {"tp1-cp2-pp1-dp1-mb1-cp:ring", "tp1-cp2-pp1-dp1-mb1-ckpt:full-cp:a2a",
                              "tp1-cp2-pp1-dp1-mb1-attn:materialized-cp:allgather",
                              "tp2-cp2-pp1-dp1-mb1-sp-cp:allgather"},
                             "")
                        .c_str());
  // The chunks change the model: the whole causal attention's run differs.
  Fixture whole(false, kLlama4);
  const auto unchunked = whole.train("tp1-pp1-dp1-mb1", whole.dir.path("ref"));
  ASSERT_EQ(unchunked.size(), 5u);
  EXPECT_NE(unchunked[4], ref[4]);
}

}  // namespace
}  // namespace weft::test
