// LoRA through the command line: a base model trained and exported here,
// adapted with --init --lora; the run header, the summary and the metrics say
// how many parameters train; a resumed run gives the uninterrupted losses bit
// for bit on the CPU; eval reads the checkpoint on its base; export writes a
// PEFT folder that --lora-init starts from again, and a merged model whose
// loss is the adapted model's. Bad settings are refused by name.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "train_test_util.h"

namespace weft::test {
namespace {

namespace fs = std::filesystem;

// The loss `weft eval` prints for a checkpoint: "overall ... loss X".
double eval_loss(const std::string& checkpoint, const std::string& data) {
  const auto r = run_weft("eval --checkpoint " + checkpoint + " --data " + data + " --samples 4");
  EXPECT_EQ(r.code, 0) << r.out;
  const auto at = r.out.rfind("loss ");
  return at == std::string::npos ? -1 : std::stod(r.out.substr(at + 5));
}

TEST(CliLora, InitTrainResumeEvalExport) {
  TempDir dir;
  const auto data = corpus(dir);
  // A base model, exported as a Hugging Face folder.
  auto r = run_weft("train --data " + data + kSmall + " --steps 6 --out " + dir.path("base"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft("export --checkpoint " + dir.path("base/checkpoints/step_000006") + " --out " + dir.path("hf"));
  ASSERT_EQ(r.code, 0) << r.out;

  const std::string lora = "train --data " + data + kSmall + " --init " + dir.path("hf") +
                           " --lora 4 --lora-targets q,v,down --lr 1e-2 --warmup 1";
  r = run_weft(lora + " --steps 6 --out " + dir.path("a"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("LoRA r 4, alpha 8 on q,v,down"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("trainable (LoRA adapters) of"), std::string::npos) << r.out;
  const auto full = losses(dir.path("a/metrics.jsonl"));
  ASSERT_EQ(full.size(), 6u);
  EXPECT_LT(full.back(), full.front()) << "the adapters learn";
  {
    std::ifstream in(dir.path("a/metrics.jsonl"));
    std::string line;
    std::getline(in, line);
    const auto header = nlohmann::json::parse(line);
    EXPECT_EQ(header["run"]["lora"]["rank"], 4);
    EXPECT_LT(header["params"]["trainable"].get<int64_t>(), header["params"]["total"].get<int64_t>() / 10);
    const auto manifest =
        nlohmann::json::parse(slurp(dir.path("a/checkpoints/step_000006/manifest.json")));
    EXPECT_EQ(manifest["run"]["lora"]["base"]["source"], "pretrained");
    EXPECT_EQ(manifest["run"]["lora"]["base"]["hash"].get<std::string>().rfind("crc32c:", 0), 0u);
  }

  // Interrupted at step 3 and resumed: the same losses, bit for bit. The
  // resume needs no --init: the checkpoint names its base.
  r = run_weft(lora + " --steps 6 --ckpt-every 3 --out " + dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string resume = "train --data " + data + kSmall + " --lora 4 --lora-targets q,v,down --lr 1e-2 --warmup 1";
  r = run_weft(resume + " --steps 6 --out " + dir.path("c") + " --resume-from " + dir.path("b/checkpoints/step_000003"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto resumed = losses(dir.path("c/metrics.jsonl"));
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], full[3 + i]) << "step " << 4 + i;

  // Eval reads the adapters on their base; the merged export is the same model.
  const std::string ck = dir.path("a/checkpoints/step_000006");
  const double adapted = eval_loss(ck, data);
  r = run_weft("export --merge --checkpoint " + ck + " --out " + dir.path("merged"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft("train --data " + data + kSmall + " --init " + dir.path("merged") + " --steps 0 --out " + dir.path("m"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NEAR(eval_loss(dir.path("m/checkpoints/step_000000"), data), adapted, 1e-5 * adapted);
  EXPECT_LT(adapted, eval_loss(dir.path("base/checkpoints/step_000006"), data) + 1.0);

  // The PEFT export starts another run's adapters: its first loss is the
  // adapted model's, not the base's.
  r = run_weft("export --lora --checkpoint " + ck + " --out " + dir.path("peft"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir.path("peft/adapter_config.json")));
  r = run_weft(lora + " --steps 1 --out " + dir.path("d") + " --lora-init " + dir.path("peft"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_LT(losses(dir.path("d/metrics.jsonl"))[0], full[0]);

  // Refusals, each naming what is wrong.
  r = run_weft("export --checkpoint " + ck + " --out " + dir.path("x"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("holds LoRA adapters"), std::string::npos) << r.out;
  r = run_weft("export --lora --checkpoint " + dir.path("base/checkpoints/step_000006") + " --out " + dir.path("y"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("holds no LoRA adapters"), std::string::npos) << r.out;
  r = run_weft(lora + " --steps 1 --out " + dir.path("e") + " --lora-targets q,wq");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown layer 'wq'"), std::string::npos) << r.out;
  r = run_weft("train --data " + data + kSmall + " --steps 1 --out " + dir.path("f") + " --lora-init " + dir.path("peft"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("give --lora RANK"), std::string::npos) << r.out;
  r = run_weft("train --data " + data + kSmall + " --init " + dir.path("hf") + " --lora 8 --steps 1 --out " +
               dir.path("g") + " --lora-init " + dir.path("peft"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("the adapters are rank 4"), std::string::npos) << r.out;
  r = run_weft(lora + " --steps 1 --out " + dir.path("h") + " --lora-dropout 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--lora-dropout 1 must lie in [0, 1)"), std::string::npos) << r.out;
}

// A Mixture-of-Experts model takes adapters on its attention and on its
// routed experts (the default, every linear layer): they learn, the merged
// export (Mixtral's class) is the adapted model, and the adapters go out as
// a PEFT folder (the experts' packed, target_parameters) and come back.
// Adapting the experts' fused gate_up half, or with dropout, is refused by
// name.
TEST(CliLora, MixtureOfExperts) {
  TempDir dir;
  const auto data = corpus(dir);
  const std::string shape = " --seq 32 --global-batch 4 --mb 2 --threads 1 --log-every 1 --eval-samples 4";
  // The base: tiny-moe trained a step and exported (a run from a folder may
  // write its step 0).
  auto b = run_weft("train --model tiny-moe --data " + data + shape + " --steps 1 --out " + dir.path("base"));
  ASSERT_EQ(b.code, 0) << b.out;
  b = run_weft("export --checkpoint " + dir.path("base/checkpoints/step_000001") + " --out " + dir.path("hf"));
  ASSERT_EQ(b.code, 0) << b.out;
  for (const char* targets : {"q,k,v,o", "all"}) {
    SCOPED_TRACE(targets);
    const std::string out = dir.path(std::string("a-") + targets);
    const std::string lora = "train --init " + dir.path("hf") + " --data " + data + shape + " --lora 4 --lora-targets " +
                             targets + " --lr 1e-2 --warmup 1";
    auto r = run_weft(lora + " --steps 4 --out " + out);
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string listed = std::string(targets) == "all" ? "q,k,v,o,gate,up,down" : targets;
    EXPECT_NE(r.out.find("LoRA r 4, alpha 8 on " + listed), std::string::npos) << r.out;
    const auto l = losses(out + "/metrics.jsonl");
    ASSERT_EQ(l.size(), 4u);
    EXPECT_LT(l.back(), l.front()) << "the adapters learn";
    const std::string ck = out + "/checkpoints/step_000004";
    const double adapted = eval_loss(ck, data);
    r = run_weft("export --merge --checkpoint " + ck + " --out " + out + "-merged");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(slurp(out + "-merged/config.json").find("MixtralForCausalLM"), std::string::npos);
    r = run_weft("train --data " + data + shape + " --init " + out + "-merged --steps 0 --out " + out + "-m");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NEAR(eval_loss(out + "-m/checkpoints/step_000000", data), adapted, 1e-5 * adapted);
    r = run_weft("export --lora --checkpoint " + ck + " --out " + out + "-peft");
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string cfg = slurp(out + "-peft/adapter_config.json");
    EXPECT_EQ(cfg.find("experts.gate_up_proj") != std::string::npos, std::string(targets) == "all") << cfg;
    r = run_weft(lora + " --steps 0 --out " + out + "-b --lora-init " + out + "-peft");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NEAR(eval_loss(out + "-b/checkpoints/step_000000", data), adapted, 1e-5 * adapted);
  }
  // The experts' gate_up at its own rank, as PEFT fuses a Mixtral's gate and
  // up targets: written as PEFT's rank_pattern, and read back only by a run
  // that asks for it.
  const std::string twice = "train --init " + dir.path("hf") + " --data " + data + shape +
                            " --lora 4 --lora-gate-up-rank 8 --lr 1e-2 --warmup 1";
  auto r = run_weft(twice + " --steps 2 --out " + dir.path("g"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(the experts' gate_up at r 8, alpha 16)"), std::string::npos) << r.out;
  r = run_weft("export --lora --checkpoint " + dir.path("g/checkpoints/step_000002") + " --out " + dir.path("g-peft"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(slurp(dir.path("g-peft/adapter_config.json")).find(R"(".*\\.gate_up_proj": 8)"), std::string::npos)
      << slurp(dir.path("g-peft/adapter_config.json"));
  r = run_weft(twice + " --steps 0 --out " + dir.path("g-b") + " --lora-init " + dir.path("g-peft"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NEAR(eval_loss(dir.path("g-b/checkpoints/step_000000"), data),
              eval_loss(dir.path("g/checkpoints/step_000002"), data), 1e-5);
  r = run_weft("train --init " + dir.path("hf") + " --data " + data + shape + " --lora 4 --steps 0 --out " +
               dir.path("g-c") + " --lora-init " + dir.path("g-peft"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("the experts' gate_up rank 8; this run asks for rank 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--lora-gate-up-rank)"), std::string::npos) << r.out;
  r = run_weft("train --model tiny-moe --data " + data + shape + " --lora 4 --lora-targets q,gate --steps 1 --out " +
               dir.path("x"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--lora-targets q,gate on the MoE model tiny-moe: its routed experts' gate and up are one "
                       "tensor"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir.path("x")));
  r = run_weft("train --model tiny-moe --data " + data + shape + " --lora 4 --lora-dropout 0.1 --steps 1 --out " +
               dir.path("y"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--lora-dropout 0.1 with LoRA on tiny-moe's routed experts"), std::string::npos) << r.out;
}

// A Llama 4 text model (tests/fixtures/hf_moe/llama4's shape, the byte
// vocabulary): PEFT applies q and k adapters to rows in Meta's rotary order,
// the base's, so their B rows are exported so and read back into weft's; its
// experts, stored (E, in, out), take their packed adapters transposed. A
// run started from the exported adapters computes the adapted model's loss,
// which differs from the base's.
TEST(CliLora, Llama4AdaptersRoundTripThroughPeft) {
  TempDir dir;
  const auto data = corpus(dir);
  std::ofstream(dir.path("config.json")) << R"({"architectures": ["Llama4ForCausalLM"], "attention_bias": false, "attention_chunk_size": 16, "attention_dropout": 0.0, "attn_scale": 0.1, "attn_temperature_tuning": true, "dtype": "float32", "floor_scale": 4, "head_dim": 8, "hidden_act": "silu", "hidden_size": 16, "initializer_range": 0.02, "interleave_moe_layer_step": 2, "intermediate_size": 12, "intermediate_size_mlp": 24, "layer_types": ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"], "max_position_embeddings": 256, "model_type": "llama4_text", "moe_layers": [1, 3], "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0], "num_attention_heads": 4, "num_experts_per_tok": 1, "num_hidden_layers": 4, "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": true, "pad_token_id": null, "rms_norm_eps": 0.001, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "router_aux_loss_coef": 0.1, "router_jitter_noise": 0.0, "tie_word_embeddings": false, "transformers_version": "5.24.0", "use_cache": true, "use_qk_norm": true, "vocab_size": 256})";
  const std::string shape = " --seq 32 --global-batch 4 --mb 2 --threads 1 --log-every 1 --eval-samples 4";
  auto r = run_weft("train --model " + dir.path("config.json") + " --data " + data + shape + " --steps 2 --out " +
                    dir.path("base"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft("export --checkpoint " + dir.path("base/checkpoints/step_000002") + " --out " + dir.path("hf"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string lora = "train --init " + dir.path("hf") + " --data " + data + shape +
                           " --lora 4 --lora-targets all --lr 3e-2 --warmup 1";
  r = run_weft(lora + " --steps 4 --out " + dir.path("a"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string ck = dir.path("a/checkpoints/step_000004");
  const double adapted = eval_loss(ck, data), base = eval_loss(dir.path("base/checkpoints/step_000002"), data);
  EXPECT_GT(std::abs(adapted - base), 1e-4 * base) << "the adapters change the model";
  r = run_weft("export --lora --checkpoint " + ck + " --out " + dir.path("peft"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_weft(lora + " --steps 0 --out " + dir.path("b") + " --lora-init " + dir.path("peft"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NEAR(eval_loss(dir.path("b/checkpoints/step_000000"), data), adapted, 1e-5 * adapted);
}

}  // namespace
}  // namespace weft::test
