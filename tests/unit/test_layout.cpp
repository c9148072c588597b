#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/layout.h"
#include "core/model_spec.h"
#include "test_util.h"

namespace weft {
namespace {

Layout random_layout(std::mt19937_64& rng) {
  auto pick = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };
  Layout l;
  l.tp = int64_t{1} << pick(4);
  l.pp = int64_t{1} << pick(4);
  l.dp = 1 + pick(64);
  l.mb = 1 + pick(8);
  l.vpp = 1 + pick(4);
  l.sp = pick(2) == 1;
  l.ckpt = Checkpointing(pick(4));
  l.ckpt_layers = l.ckpt == Checkpointing::none ? 0 : pick(5);
  l.attention = AttentionKind(pick(2));
  l.norm = NormKind(pick(2));
  l.zero = pick(4);
  l.cp = int64_t{1} << pick(4);
  l.cp_comm = l.cp > 1 ? CpComm(pick(3)) : CpComm::ring;
  l.ep = int64_t{1} << pick(3);
  l.dispatch = l.ep > 1 ? MoeDispatch(pick(2)) : MoeDispatch::a2a;
  l.fp8 = Fp8Recipe(pick(3));
  l.fp8_bf16_layers = l.fp8 == Fp8Recipe::off ? 0 : pick(3);
  // A shard group below dp x cp (one of all of them reads as none).
  if (l.zero > 0 && pick(2) == 1) {
    const int64_t g = 2 + pick(8);
    if (g < l.dp * l.cp) l.zero_group = g;
  }
  return l;
}

TEST(Layout, CanonicalTextRoundTrips) {
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 2000; ++i) {
    const Layout l = random_layout(rng);
    const std::string text = l.to_string();
    EXPECT_EQ(Layout::parse(text), l) << text;
    EXPECT_EQ(Layout::parse(text).to_string(), text);
    const nlohmann::json j = l;
    EXPECT_EQ(nlohmann::json::parse(j.dump()).get<Layout>(), l);
  }
}

TEST(Layout, CanonicalForm) {
  Layout l;
  l.tp = 2;
  l.pp = 4;
  l.dp = 8;
  l.sp = true;
  l.ckpt = Checkpointing::full;
  l.ckpt_layers = 3;
  l.zero = 1;
  EXPECT_EQ(l.to_string(), "tp2-pp4-dp8-mb1-vpp1-sp-ckpt:full@3-attn:flash-norm:fused-zero1-grad:fp32");
}

TEST(Layout, ParseAcceptsAnyOrderAndDefaults) {
  const auto l = Layout::parse("dp4-tp2-ckpt:selective-attn:materialized");
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.pp, 1);
  EXPECT_EQ(l.ckpt, Checkpointing::selective);
  EXPECT_EQ(l.attention, AttentionKind::materialized);
  EXPECT_EQ(l.norm, NormKind::fused);
}

// A field given twice would take the last value and drop the first without
// a word: refused, naming both.
TEST(Layout, AFieldGivenTwiceIsRefused) {
  for (const auto& [text, field] : std::vector<std::pair<std::string, std::string>>{
           {"tp2-tp1-pp1-dp1-mb1", "tp is given twice ('tp2' and 'tp1')"},
           {"tp1-pp1-dp1-mb1-zero3-zero0", "zero is given twice ('zero3' and 'zero0')"},
           {"tp1-pp1-dp1-mb1-fp8:delayed@1-fp8:tensorwise", "fp8 is given twice"},
           {"tp2-sp-pp1-dp1-mb1-nosp", "sp is given twice ('sp' and 'nosp')"},
           {"tp1-cp2-cp:ring-pp1-dp1-mb1-cp:a2a", "cp transport is given twice"},
           {"tp1-pp1-dp1-mb1-ckpt:full-ckpt:none", "ckpt is given twice"},
           {"mb1-mb2", "mb is given twice"}}) {
    WEFT_EXPECT_THROW_MSG(Layout::parse(text), InputError, field);
  }
  // cp and its transport are two fields.
  EXPECT_EQ(Layout::parse("tp1-cp2-pp1-dp1-mb1-cp:a2a").cp, 2);
}

TEST(Layout, EveryAttentionKindRoundTrips) {
  for (auto kind : {AttentionKind::flash, AttentionKind::materialized, AttentionKind::cudnn}) {
    Layout l;
    l.attention = kind;
    EXPECT_EQ(Layout::parse(l.to_string()), l) << l.to_string();
    EXPECT_EQ(attention_parse(to_string(kind)), kind);
  }
  EXPECT_EQ(Layout::parse("attn:cudnn").attention, AttentionKind::cudnn);
}

TEST(Layout, GradPrecisionRoundTripsAndNeedsBf16Compute) {
  for (auto g : {GradPrecision::fp32, GradPrecision::bf16}) {
    Layout l;
    l.grad = g;
    EXPECT_EQ(Layout::parse(l.to_string()), l) << l.to_string();
  }
  EXPECT_EQ(Layout::parse("tp1").grad, GradPrecision::fp32);
  EXPECT_EQ(Layout::parse("grad:bf16").grad_bytes(), 2);
  EXPECT_EQ(Layout::parse("grad:fp32").grad_bytes(), 4);
  WEFT_EXPECT_THROW_MSG(Layout::parse("grad:fp16"), InputError, "fp16", "fp32, bf16");
  const auto m = model_preset("tiny-test");
  const auto l = Layout::parse("tp1-pp1-dp1-mb1-grad:bf16");
  EXPECT_TRUE(l.violations(m, RunSpec{16, 4, Precision::bf16}, 1).empty());
  WEFT_EXPECT_THROW_MSG(l.validate(m, RunSpec{16, 4, Precision::fp32}, 1), LayoutError, "grad:bf16",
                        "precision fp32");
}

TEST(Layout, ParseErrorsNameTheField) {
  WEFT_EXPECT_THROW_MSG(Layout::parse("tp2-foo3"), InputError, "foo3", "tpN");
  WEFT_EXPECT_THROW_MSG(Layout::parse("tpX"), InputError, "tpX", "whole number");
  WEFT_EXPECT_THROW_MSG(Layout::parse("ckpt:most"), InputError, "most", "selective");
  WEFT_EXPECT_THROW_MSG(Layout::parse("attn:sparse"), InputError, "sparse", "cudnn");
  WEFT_EXPECT_THROW_MSG(Layout::parse(""), InputError, "empty");
  // A negative number reads as its own field after the '-': the message
  // names the value written, not an empty one.
  WEFT_EXPECT_THROW_MSG(Layout::parse("tp1-pp1-dp1-mb-1"), InputError, "tp1-pp1-dp1-mb-1", "mb is -1", "at least 1");
  WEFT_EXPECT_THROW_MSG(Layout::parse("tp-2-pp1"), InputError, "tp is -2");
  WEFT_EXPECT_THROW_MSG(Layout::parse("zero-1"), InputError, "zero is -1", "0, 1, 2 or 3");
  WEFT_EXPECT_THROW_MSG(Layout::parse("ckpt:full@-2"), InputError, "ckpt@K is -2");
  WEFT_EXPECT_THROW_MSG(Layout::parse("mb-x"), InputError, "'mb'", "not a whole number");
}

TEST(Layout, ValidationPrintsEveryValue) {
  const auto m = model_preset("llama-13b");  // H = 40, L = 40
  RunSpec run{2048, 2048, Precision::bf16};
  Layout l;
  l.tp = 3;
  l.pp = 3;
  l.dp = 7;
  l.mb = 3;
  WEFT_EXPECT_THROW_MSG(l.validate(m, run, 64), LayoutError, "tp*pp*dp = 3*3*7 = 63",
                        "world size 64", "H=40", "tp=3", "L=40", "pp*vpp = 3*1 = 3",
                        "global batch 2048", "mb*dp = 3*7 = 21");
  Layout sp;
  sp.sp = true;
  sp.dp = 64;
  WEFT_EXPECT_THROW_MSG(sp.validate(m, run, 64), LayoutError, "needs tp > 1");
  Layout v;
  v.vpp = 2;
  v.dp = 64;
  WEFT_EXPECT_THROW_MSG(v.validate(m, run, 64), LayoutError, "vpp=2 needs pp > 1");
  const auto g = model_preset("llama2-70b");  // H_kv = 8
  Layout kv;
  kv.tp = 16;
  kv.dp = 4;
  WEFT_EXPECT_THROW_MSG(kv.validate(g, run, 64), LayoutError, "H_kv=8", "tp=16");
  Layout z;
  z.zero = 4;
  z.dp = 64;
  WEFT_EXPECT_THROW_MSG(z.validate(m, run, 64), LayoutError, "zero=4");
  Layout k;
  k.pp = 4;
  k.dp = 16;
  k.ckpt = Checkpointing::full;
  k.ckpt_layers = 11;
  WEFT_EXPECT_THROW_MSG(k.validate(m, run, 64), LayoutError, "ckpt@11", "10 layers");
}

// Values no cluster has are refused by name, never wrapped: a degree past
// 2^20 GPUs, a world whose product passes 64 bits, and FP8 bf16 end blocks
// so many that twice their count would overflow (inputs the fuzzer found).
TEST(Layout, HugeValuesAreRefusedNotOverflowed) {
  const auto m = model_preset("tiny");
  RunSpec run{256, 16, Precision::bf16};
  WEFT_EXPECT_THROW_MSG(Layout::parse("cp5555555555555555550").validate(m, run, 8), LayoutError,
                        "cp=5555555555555555550 must be at most 1048576");
  WEFT_EXPECT_THROW_MSG(Layout::parse("tp1048576-cp1048576-pp1048576-dp1048576").validate(m, run, 8), LayoutError,
                        "= more than 2^63 must equal the world size 8");
  WEFT_EXPECT_THROW_MSG(Layout::parse("dp8-fp8:blockwise@5535055555554555072").validate(m, run, 8), LayoutError,
                        "keeps the first and last 5535055555554555072 blocks in bf16");
}

// Context parallelism: cp and its transport print only when cp > 1, so a
// layout without it reads as before; the world counts cp; each rule names
// its values.
TEST(Layout, ContextParallelismPrintsParsesAndValidates) {
  const Layout l = Layout::parse("tp2-cp4-pp1-dp2-mb1-cp:a2a");
  EXPECT_EQ(l.cp, 4);
  EXPECT_EQ(l.cp_comm, CpComm::a2a);
  EXPECT_EQ(l.world(), 16);
  EXPECT_EQ(l.shard_ways(), 8);
  EXPECT_EQ(l.to_string(), "tp2-cp4-pp1-dp2-mb1-vpp1-nosp-ckpt:none-attn:flash-norm:fused-zero0-grad:fp32-cp:a2a");
  EXPECT_EQ(Layout::parse("tp2-pp1-dp2-mb1").to_string().find("cp"), std::string::npos);
  EXPECT_EQ(Layout::parse("cp2-cp:allgather").cp_comm, CpComm::allgather);
  WEFT_EXPECT_THROW_MSG(Layout::parse("cp2-cp:ulysses"), InputError, "'ulysses'", "ring, allgather, a2a");
  WEFT_EXPECT_THROW_MSG(Layout::parse("cp-2"), InputError, "cp is -2");

  ModelSpec m = model_preset("tiny");  // H 4, H_kv 2, T divisible by 2 cp below
  RunSpec run{256, 16, Precision::fp32};
  auto violations = [&](const std::string& text, int64_t world) {
    return fmt::format("{}", fmt::join(Layout::parse(text).violations(m, run, world), "; "));
  };
  EXPECT_EQ(violations("cp4-dp2-mb1-cp:ring", 8), "");
  EXPECT_NE(violations("cp4-dp2-mb1", 4).find("tp*cp*pp*dp = 1*4*1*2 = 8 must equal the world size 4"),
            std::string::npos);
  run.seq = 100;  // not divisible by 2 * 4
  EXPECT_NE(violations("cp4-dp2-mb1", 8).find("seq T=100 into 2*cp = 8 equal chunks"), std::string::npos);
  run.seq = 256;
  // a2a splits the tp rank's 2 kv heads over cp: cp4 cannot.
  EXPECT_NE(violations("cp4-mb1-cp:a2a", 4).find("kv heads H_kv/tp=2 must be divisible"), std::string::npos);
  EXPECT_EQ(violations("cp2-mb1-cp:a2a", 2), "");
  EXPECT_NE(violations("cp2-mb1-attn:materialized", 2).find("cp:ring merges"), std::string::npos);
  EXPECT_EQ(violations("cp2-mb1-attn:materialized-cp:allgather", 2), "");
  EXPECT_NE(violations("mb1-cp:a2a", 1).find("cp:a2a names a context-parallel transport but cp=1"),
            std::string::npos);
  // Sequence parallelism then splits each rank's T / cp tokens by tp.
  run.seq = 12;
  EXPECT_NE(violations("tp4-sp-cp2-mb1", 8).find("T/cp = 6 tokens of each rank by tp=4"), std::string::npos);
}

TEST(Layout, Fp8PrintsParsesAndValidates) {
  const Layout l = Layout::parse("tp2-dp2-fp8:delayed@1");
  EXPECT_EQ(l.fp8, Fp8Recipe::delayed);
  EXPECT_EQ(l.fp8_bf16_layers, 1);
  EXPECT_EQ(l.to_string(), "tp2-pp1-dp2-mb1-vpp1-nosp-ckpt:none-attn:flash-norm:fused-zero0-grad:fp32-fp8:delayed@1");
  EXPECT_EQ(gemm_precision_text(l), "fp8:delayed@1");
  EXPECT_EQ(gemm_precision_text(Layout::parse("tp2")), "bf16");
  EXPECT_EQ(Layout::parse("tp2-fp8:off").to_string().find("fp8"), std::string::npos);
  EXPECT_TRUE(Layout::parse("fp8:tensorwise").to_string().ends_with("-grad:fp32-fp8:tensorwise"));
  EXPECT_EQ(Layout::parse("tp2-fp8:blockwise@2").fp8, Fp8Recipe::blockwise);
  EXPECT_TRUE(Layout::parse("fp8:blockwise@2").to_string().ends_with("-grad:fp32-fp8:blockwise@2"));
  WEFT_EXPECT_THROW_MSG(Layout::parse("fp8:e4m3"), InputError, "'e4m3'", "tensorwise, delayed, off, blockwise");
  WEFT_EXPECT_THROW_MSG(Layout::parse("fp8:delayed@x"), InputError, "fp8:delayed@x");

  ModelSpec m = model_preset("tiny");
  RunSpec run{256, 16, Precision::fp32};
  // Blocks 1 .. L-2 in FP8 with @1; none at @0 when off.
  for (int64_t i = 0; i < m.layers; ++i) {
    EXPECT_EQ(l.fp8_layer(m, i), i >= 1 && i < m.layers - 1) << i;
    EXPECT_FALSE(Layout::parse("tp2").fp8_layer(m, i));
  }
  auto violations = [&](const std::string& text) {
    return fmt::format("{}", fmt::join(Layout::parse(text).violations(m, run, 1), "; "));
  };
  EXPECT_EQ(violations("fp8:tensorwise"), "");
  EXPECT_NE(violations(fmt::format("fp8:delayed@{}", (m.layers + 1) / 2)).find("which is all L="), std::string::npos);
  EXPECT_NE(violations("fp8:off@1").find("FP8 is off"), std::string::npos);
}

TEST(Layout, ValidLayoutsPass) {
  const auto m = model_preset("llama-13b");
  RunSpec run{2048, 2048, Precision::bf16};
  const auto l = Layout::parse("tp2-pp4-dp8-mb1-vpp2-sp-ckpt:full@4-zero1");
  EXPECT_NO_THROW(l.validate(m, run, 64));
  EXPECT_EQ(l.micro_batches(run), 256);
  EXPECT_EQ(l.stage_layers(m, 0), 10);
  EXPECT_EQ(l.checkpointed_layers(m, 3), 4);
  EXPECT_TRUE(l.violations(m, run, 64).empty());
  // A vocabulary tp does not divide is padded (ModelSpec::padded_vocab), not refused.
  ModelSpec odd = m;
  odd.vocab = 32001;
  EXPECT_TRUE(Layout::parse("tp8-pp1-dp8-mb1").violations(odd, run, 64).empty());
}

// Uneven pipeline splits: the text (runs of equal counts as NxK, left out
// when even), each virtual stage's layers and first layer, the stages' sums,
// partial checkpointing per chunk, and every rule with its values.
TEST(Layout, SplitsPrintParseAndValidate) {
  auto m = model_preset("llama-13b");  // L = 40
  m.layers = 126;
  const RunSpec run{8192, 1024, Precision::bf16};
  const auto l = Layout::parse("tp8-cp2-pp8-dp8-mb1-vpp8-split:1.2x62.1");
  ASSERT_EQ(l.split.size(), 64u);
  EXPECT_EQ(l.split.front(), 1);
  EXPECT_EQ(l.split[1], 2);
  EXPECT_EQ(l.split.back(), 1);
  EXPECT_TRUE(l.uneven());
  EXPECT_TRUE(l.edge_split());
  EXPECT_EQ(Layout::parse(l.to_string()), l);
  EXPECT_NE(l.to_string().find("-split:1.2x62.1"), std::string::npos) << l.to_string();
  EXPECT_TRUE(l.violations(m, run, 1024).empty()) << fmt::format("{}", fmt::join(l.violations(m, run, 1024), "; "));
  // Virtual stage v = chunk * pp + stage; stage 0 holds v 0, 8, ..., 56.
  EXPECT_EQ(l.chunk_layers(m, 0, 0), 1);
  EXPECT_EQ(l.chunk_layers(m, 0, 1), 2);
  EXPECT_EQ(l.chunk_layers(m, 7, 7), 1);
  EXPECT_EQ(l.virtual_first_layer(m, 0), 0);
  EXPECT_EQ(l.virtual_first_layer(m, 1), 1);
  EXPECT_EQ(l.virtual_first_layer(m, 63), 125);
  EXPECT_EQ(l.stage_layers(m, 0), 15);
  EXPECT_EQ(l.stage_layers(m, 3), 16);
  EXPECT_EQ(l.stage_layers(m, 7), 15);
  EXPECT_EQ(l.max_stage_layers(m), 16);
  EXPECT_EQ(l.max_chunk_layers(m, 0), 2);
  // Every layer once, in order.
  int64_t next = 0;
  for (int64_t v = 0; v < 64; ++v) {
    EXPECT_EQ(l.virtual_first_layer(m, v), next);
    next += l.virtual_layers(m, v);
  }
  EXPECT_EQ(next, 126);
  // ckpt@K: K / vpp blocks of each chunk, at most the chunk's own.
  Layout k = l;
  k.ckpt = Checkpointing::full;
  k.ckpt_layers = 16;
  EXPECT_EQ(k.chunk_checkpointed(m, 0), 2);
  EXPECT_EQ(k.checkpointed_layers(m, 0), 15);
  EXPECT_EQ(k.checkpointed_layers(m, 3), 16);
  k.ckpt_layers = 8;
  EXPECT_EQ(k.checkpointed_layers(m, 0), 8);
  EXPECT_EQ(k.checkpointed_layers(m, 3), 8);
  k.ckpt_layers = 24;
  EXPECT_NE(fmt::format("{}", fmt::join(k.violations(m, run, 1024), "; ")).find("ckpt@24 exceeds the 16 layers"),
            std::string::npos);

  // Equal counts are the even split, and read as none.
  EXPECT_TRUE(Layout::parse("pp4-split:2x4").split.empty());
  EXPECT_EQ(Layout::parse("pp4-split:2x4").to_string(), Layout::parse("pp4").to_string());
  EXPECT_EQ(Layout::parse("pp2-split:3.5").split, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(split_text({0, 1, 1, 1, 3, 3, 0}), "0.1x3.3x2.0");
  EXPECT_EQ(split_parse("0.1x3.3x2.0"), (std::vector<int64_t>{0, 1, 1, 1, 3, 3, 0}));

  // The rules, each with its values.
  ModelSpec eight = model_preset("tiny-test");  // L = 8
  const RunSpec small{16, 8, Precision::fp32};
  const auto broken = [&](const std::string& text, int64_t world) {
    return fmt::format("{}", fmt::join(Layout::parse(text).violations(eight, small, world), "; "));
  };
  EXPECT_EQ(broken("pp2-split:3.5", 2), "");
  EXPECT_EQ(broken("pp2-split:0.8", 2), "");
  EXPECT_EQ(broken("pp2-vpp2-split:0.4.4.0", 2), "");
  EXPECT_NE(broken("pp2-split:3.4", 2).find("split:3.4 holds 7 layers; the model has L=8"), std::string::npos);
  EXPECT_NE(broken("pp2-split:2.3.3", 2).find("split:2.3x2 gives 3 virtual stages; pp*vpp = 2*1 = 2 need a count each"),
            std::string::npos);
  EXPECT_NE(broken("pp4-split:4.0.2.2", 4).find("leaves virtual stage 1 without a layer"), std::string::npos);
  // L does not divide: the message offers the split that counts the
  // embedding and the loss as layers where there is one.
  eight.layers = 7;
  EXPECT_NE(broken("pp4", 4).find("or the layout must give each virtual stage's layers (split:N.N...)"),
            std::string::npos);
  eight.layers = 126;
  EXPECT_NE(broken("pp8-vpp8", 8).find("(split:1.2x62.1), the embedding and the loss counted as layers"),
            std::string::npos);
  // Malformed text names the token.
  EXPECT_THROW(Layout::parse("pp2-split:3.x"), InputError);
  EXPECT_THROW(Layout::parse("pp2-split:3.5x0"), InputError);
  EXPECT_THROW(Layout::parse("pp2-split:"), InputError);
  EXPECT_THROW(Layout::parse("pp2-split:3.5-split:4.4"), InputError);

  // edge_split: the first and last given, the rest even.
  EXPECT_EQ(edge_split(126, 64, 1, 1), l.split);
  EXPECT_EQ(edge_split(8, 4, 2, 2), std::vector<int64_t>{});
  EXPECT_FALSE(edge_split(8, 4, 1, 2).has_value());
  EXPECT_EQ(edge_split(8, 2, 3, 5), (std::vector<int64_t>{3, 5}));
}

// Hybrid sharding: zeroN@G prints, parses and validates; a group of every
// dp x cp rank is plain ZeRO.
TEST(Layout, HybridShardingPrintsParsesAndValidates) {
  const ModelSpec m = model_preset("llama3.1-8b");
  const RunSpec run{8192, 64, Precision::bf16};
  const auto l = Layout::parse("tp2-cp2-pp1-dp8-mb1-zero3@4");
  EXPECT_EQ(l.zero, 3);
  EXPECT_EQ(l.zero_group, 4);
  EXPECT_EQ(l.zero_shards(), 4);
  EXPECT_EQ(l.zero_replicas(), 4);  // dp x cp = 16 ranks in 4 groups
  EXPECT_TRUE(l.hybrid_sharding());
  EXPECT_NE(l.to_string().find("-zero3@4-"), std::string::npos) << l.to_string();
  EXPECT_EQ(Layout::parse(l.to_string()), l);
  EXPECT_TRUE(l.violations(m, run, 32).empty()) << fmt::format("{}", fmt::join(l.violations(m, run, 32), "; "));
  // One group of all 16 is plain ZeRO-3, in the text too.
  const auto all = Layout::parse("tp2-cp2-pp1-dp8-mb1-zero3@16");
  EXPECT_EQ(all.zero_group, 0);
  EXPECT_EQ(all.zero_shards(), 16);
  EXPECT_EQ(all, Layout::parse("tp2-cp2-pp1-dp8-mb1-zero3"));
  const auto broken = [&](const std::string& text) {
    return fmt::format("{}", fmt::join(Layout::parse(text).violations(m, run, 32), "; "));
  };
  EXPECT_NE(broken("tp2-cp2-pp1-dp8-mb1-zero3@3").find("zero3@3: the shard group must divide dp x cp = 8 x 2 = 16"),
            std::string::npos);
  EXPECT_NE(broken("tp2-cp2-pp1-dp8-mb1-zero3@32").find("must divide dp x cp = 8 x 2 = 16"), std::string::npos);
  EXPECT_NE(broken("tp2-cp2-pp1-dp8-mb1-zero1@1").find("hold at least 2 ranks"), std::string::npos);
  EXPECT_NE(broken("tp2-cp2-pp1-dp8-mb1-zero0@4").find("zero0@4 names a shard group but ZeRO-0 shards nothing"),
            std::string::npos);
  WEFT_EXPECT_THROW_MSG(Layout::parse("dp4-zero3@0"), InputError, "give at least 2");
  WEFT_EXPECT_THROW_MSG(Layout::parse("dp4-zero3@x"), InputError, "'x' is not a whole number");
}

// Expert parallelism folds over dp x cp: its text after dp, the ZeRO shard
// group it implies (the expert data-parallel group), and every rule it
// breaks named with its values.
TEST(Layout, ExpertParallelismPrintsParsesAndValidates) {
  const ModelSpec m = model_preset("mixtral-8x7b");  // 8 experts
  const RunSpec run{4096, 64, Precision::bf16};
  const auto l = Layout::parse("tp1-cp2-pp4-dp8-ep2-mb1-zero1");
  EXPECT_EQ(l.ep, 2);
  EXPECT_EQ(l.expert_dp(), 8);     // dp x cp / ep
  EXPECT_EQ(l.zero_shards(), 8);   // ZeRO over the expert data-parallel group
  EXPECT_EQ(l.zero_replicas(), 2); // the shards sum over ep too
  EXPECT_NE(l.to_string().find("-dp8-ep2-mb1-"), std::string::npos) << l.to_string();
  EXPECT_EQ(Layout::parse(l.to_string()), l);
  EXPECT_EQ(Layout::parse("dp4-mb1").to_string().find("-ep"), std::string::npos);  // ep1 is left out
  EXPECT_TRUE(l.violations(m, run, 64).empty()) << fmt::format("{}", fmt::join(l.violations(m, run, 64), "; "));
  const auto broken = [&](const ModelSpec& model, const std::string& text, int64_t world) {
    return fmt::format("{}", fmt::join(Layout::parse(text).violations(model, run, world), "; "));
  };
  EXPECT_NE(broken(m, "tp1-pp1-dp6-ep3-mb1", 6).find("ep=3 must divide the 8 routed experts of mixtral-8x7b"),
            std::string::npos);
  EXPECT_NE(broken(m, "tp2-cp1-pp1-dp2-ep4-mb1", 4).find("ep=4 folds over dp x cp = 2 x 1 = 2 ranks and must divide it"),
            std::string::npos);
  EXPECT_NE(broken(model_preset("llama3.1-8b"), "tp1-pp1-dp2-ep2-mb1", 2).find("but llama3.1-8b is dense"),
            std::string::npos);
  EXPECT_NE(broken(m, "tp1-pp1-dp8-ep2-mb1-zero3@4", 8)
                .find("hybrid sharding and expert parallelism together are not supported"),
            std::string::npos);
  EXPECT_NE(broken(m, "tp1-pp1-dp2-ep0-mb1", 2).find("ep=0 must be at least 1"), std::string::npos);
  WEFT_EXPECT_THROW_MSG(Layout::parse("dp4-epx"), InputError, "'x' is not a whole number");
  // The dispatcher: a2a by default, printed at ep > 1, named where ep is 1.
  EXPECT_EQ(l.dispatch, MoeDispatch::a2a);
  EXPECT_NE(l.to_string().find("-dispatch:a2a"), std::string::npos) << l.to_string();
  const auto gathered = Layout::parse("tp1-cp2-pp4-dp8-ep2-mb1-zero1-dispatch:allgather");
  EXPECT_EQ(gathered.dispatch, MoeDispatch::allgather);
  EXPECT_EQ(Layout::parse(gathered.to_string()), gathered);
  EXPECT_NE(broken(m, "tp1-pp1-dp2-mb1-dispatch:allgather", 2).find("dispatch:allgather names an expert dispatcher but ep=1"),
            std::string::npos);
  // The expert tp degree: 1 or tp, with or without sp, printed after ep.
  const auto split = Layout::parse("tp2-pp1-dp4-ep2-etp2-mb1");
  EXPECT_EQ(split.etp, 2);
  EXPECT_NE(split.to_string().find("-dp4-ep2-etp2-mb1-"), std::string::npos) << split.to_string();
  EXPECT_EQ(Layout::parse(split.to_string()), split);
  EXPECT_TRUE(split.violations(m, run, 8).empty()) << fmt::format("{}", fmt::join(split.violations(m, run, 8), "; "));
  EXPECT_NE(broken(m, "tp4-pp1-dp2-etp2-mb1", 8).find("etp=2 must be 1 (experts whole on every tp rank) or tp=4"),
            std::string::npos);
  const auto split_sp = Layout::parse("tp2-pp1-dp2-etp2-mb1-sp");
  EXPECT_TRUE(split_sp.violations(m, run, 4).empty())
      << fmt::format("{}", fmt::join(split_sp.violations(m, run, 4), "; "));
  EXPECT_NE(broken(model_preset("llama3.1-8b"), "tp2-pp1-dp1-etp2-mb1", 2).find("but llama3.1-8b is dense"),
            std::string::npos);
  WEFT_EXPECT_THROW_MSG(Layout::parse("dp4-ep2-dispatch:ring"), InputError,
                        "unknown expert dispatcher 'ring'; valid: a2a, allgather");
}

// Megatron's expert grid folded over the tp ranks (epfold): ep counts the tp
// ranks too, so ep / tp of dp x cp; the expert data-parallel group and
// ZeRO's shards follow; each rule it needs is named when broken.
TEST(Layout, ExpertGridFoldedOverTensorParallelRanks) {
  const ModelSpec m = model_preset("mixtral-8x7b");
  const RunSpec run{4096, 64, Precision::bf16};
  const auto broken = [&](const ModelSpec& model, const std::string& text, int64_t world) {
    const auto v = Layout::parse(text).violations(model, run, world);
    return fmt::format("{}", fmt::join(v, "; "));
  };
  const auto fold = Layout::parse("tp4-pp1-dp16-ep8-epfold-mb1-sp-zero1");
  EXPECT_TRUE(fold.ep_fold);
  EXPECT_TRUE(fold.violations(m, run, 64).empty()) << fmt::format("{}", fmt::join(fold.violations(m, run, 64), "; "));
  EXPECT_EQ(fold.ep_dpcp(), 2);
  EXPECT_EQ(fold.expert_dp(), 8);
  EXPECT_EQ(fold.zero_shards(), 8);
  EXPECT_EQ(fold.zero_replicas(), 2);
  EXPECT_NE(fold.to_string().find("-dp16-ep8-epfold-mb1-"), std::string::npos) << fold.to_string();
  EXPECT_EQ(Layout::parse(fold.to_string()), fold);
  const auto same = Layout::parse("tp4-pp1-dp16-ep4-epfold-mb1-sp");  // ep = tp: all dp x cp hold the same experts
  EXPECT_EQ(same.ep_dpcp(), 1);
  EXPECT_EQ(same.expert_dp(), 16);
  EXPECT_NE(broken(m, "tp1-pp1-dp8-ep8-epfold-mb1", 8).find("epfold folds ep=8 over the tp ranks, but tp=1"),
            std::string::npos);
  EXPECT_NE(broken(m, "tp4-pp1-dp4-ep2-epfold-mb1-sp", 16).find("ep=2 counts the tp=4 ranks first and must be a multiple"),
            std::string::npos);
  EXPECT_NE(broken(m, "tp2-pp1-dp4-ep2-etp2-epfold-mb1-sp", 8).find("epfold with etp=2"), std::string::npos);
  EXPECT_NE(broken(m, "tp2-pp1-dp4-ep4-epfold-mb1-nosp", 8).find("epfold needs sp"), std::string::npos);
  EXPECT_NE(broken(m, "tp2-pp1-dp3-ep4-epfold-mb1-sp", 6).find("ep / tp = 2 of dp x cp = 3 x 1 = 3"),
            std::string::npos);
  EXPECT_NE(broken(m, "tp2-pp1-dp2-epfold-mb1-sp", 4).find("epfold folds the ep group over the tp ranks, but ep=1"),
            std::string::npos);
}

// An MoE capacity factor in the text (cap:F) reads back as the same double,
// however small or long, without an exponent; 0 (dropless) is left out.
TEST(Layout, CapacityFactorRoundTrips) {
  for (double f : {1.25, 0.1, 1e-5, 2.0 / 3.0, 1000.0}) {
    Layout l;
    l.capacity_factor = f;
    const std::string text = l.to_string();
    EXPECT_EQ(text.find('e', text.find("cap:")), std::string::npos) << text;
    EXPECT_EQ(Layout::parse(text).capacity_factor, f) << text;
  }
  EXPECT_EQ(Layout{}.to_string().find("cap:"), std::string::npos);
  EXPECT_NE(Layout::parse("mb2-cap:1.25").to_string().find("-cap:1.25"), std::string::npos);
  WEFT_EXPECT_THROW_MSG(Layout::parse("mb2-cap:abc"), InputError, "cap:abc must be an MoE capacity factor");
}

}  // namespace
}  // namespace weft
