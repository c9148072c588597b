#include <fstream>
#include <iterator>

#include "core/error.h"
#include "test_util.h"
#include "tuner/recipe.h"

namespace weft::tuner {
namespace {

Recipe sample() {
  Recipe r;
  r.weft_version = WEFT_VERSION;
  r.model = model_preset("llama-13b");
  r.device = "a100-80gb";
  r.device_memory = 80LL << 30;
  r.world = 64;
  r.gpus_per_node = 8;
  r.run = RunSpec{2048, 2048, Precision::bf16};
  r.layout = Layout::parse("tp1-pp2-dp32-mb1-zero1");
  r.source = "dry-run";
  r.predicted = {{"step_s", 23.9}, {"mfu", 0.723}};
  return r;
}

TEST(Recipe, RoundTripsThroughAFile) {
  test::TempDir dir;
  const auto r = sample();
  recipe_save(dir.path("r.json"), r);
  const auto back = recipe_load(dir.path("r.json"));
  EXPECT_EQ(back.layout, r.layout);
  EXPECT_EQ(back.model.hash(), r.model.hash());
  EXPECT_EQ(back.world, 64);
  EXPECT_EQ(back.run.seq, 2048);
  EXPECT_DOUBLE_EQ(back.predicted["mfu"].get<double>(), 0.723);
  EXPECT_TRUE(recipe_diff(r, back).empty());
}

// A layout with context parallelism comes back with its degree and transport.
TEST(Recipe, RoundTripsContextParallelism) {
  test::TempDir dir;
  auto r = sample();
  r.layout = Layout::parse("tp2-cp4-pp2-dp4-mb1-zero1-cp:a2a");
  recipe_save(dir.path("cp.json"), r);
  const auto back = recipe_load(dir.path("cp.json"));
  EXPECT_EQ(back.layout, r.layout);
  EXPECT_EQ(back.layout.cp, 4);
  EXPECT_EQ(back.layout.cp_comm, CpComm::a2a);
  EXPECT_EQ(back.layout.world(), 64);
}

TEST(Recipe, MismatchesNameEachField) {
  const auto r = sample();
  auto m = model_preset("llama-13b");
  auto c = cluster_resolve("a100-80gb", 64, 8);
  RunSpec run{2048, 2048, Precision::bf16};
  EXPECT_TRUE(recipe_mismatches(r, m, c, run).empty());
  m = model_preset("llama-7b");
  c = cluster_resolve("h100", 32, 8);
  run.seq = 4096;
  const auto d = recipe_mismatches(r, m, c, run);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_NE(d[0].find("model hash"), std::string::npos);
  EXPECT_EQ(d[1], "device: recipe a100-80gb, this run h100");
  EXPECT_EQ(d[2], "world size: recipe 64, this run 32");
  EXPECT_EQ(d[3], "seq: recipe 2048, this run 4096");
}

// A recipe tuned by ranks that shared a GPU (the MPI device communicator)
// timed host copies, not a cluster's links: it is kept, read back, and reused
// only by a run whose ranks share GPUs alike. Older files without the field
// were tuned on a GPU each.
TEST(Recipe, RanksPerGpuMustMatch) {
  Recipe r = sample();
  auto m = model_preset("llama-13b");
  auto c = cluster_resolve("a100-80gb", 64, 8);
  RunSpec run{2048, 2048, Precision::bf16};
  c.device.shared_by = 2;
  r.ranks_per_device = 2;
  EXPECT_TRUE(recipe_mismatches(r, m, c, run).empty());
  const Recipe back = recipe_from_json(recipe_to_json(r), "memory");
  EXPECT_EQ(back.ranks_per_device, 2);
  c.device.shared_by = 1;
  const auto d = recipe_mismatches(back, m, c, run);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0], "ranks per GPU: recipe 2, this run 1");
  auto old = recipe_to_json(sample());
  old["cluster"].erase("ranks_per_device");
  EXPECT_EQ(recipe_from_json(old, "old").ranks_per_device, 1);
  old["cluster"]["ranks_per_device"] = 0;
  EXPECT_THROW(recipe_from_json(old, "zero"), FileFormatError);
}

// A recipe tuned for full fine-tuning is no answer for a LoRA run (and one
// of another rank is none either); the recipe file keeps its LoRA settings.
TEST(Recipe, LoraSettingsMustMatch) {
  Recipe r = sample();
  const ModelSpec m = r.model;
  const ClusterSpec c = cluster_resolve("a100-80gb", 64, 8);
  RunSpec run = r.run;
  run.lora = LoraSpec::with_rank(16);
  auto d = recipe_mismatches(r, m, c, run);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0], "LoRA: recipe off, this run r 16 alpha 32 dropout 0 on q,k,v,o,gate,up,down");
  r.run.lora = LoraSpec::with_rank(8);
  test::TempDir dir;
  recipe_save(dir.path("r.json"), r);
  const Recipe back = recipe_load(dir.path("r.json"));
  EXPECT_EQ(back.run.lora, r.run.lora);
  d = recipe_mismatches(back, m, c, run);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("recipe r 8 alpha 16"), std::string::npos) << d[0];
}

TEST(Recipe, MalformedOrTruncatedFilesAreRefused) {
  test::TempDir dir;
  recipe_save(dir.path("good.json"), sample());
  const std::string text = test::file_contents(dir.path("good.json"));
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.file("cut.json", text.substr(0, text.size() / 2))), FileFormatError,
                        "cut.json", "not valid JSON");
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.file("other.json", R"({"hello": 1})")), FileFormatError,
                        "not a weft recipe");
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.file("number.json", R"({"format": 7})")), FileFormatError,
                        "not a weft recipe");
  std::string no_layout = text;
  no_layout.replace(no_layout.find("\"layout\""), 8, "\"layouT\"");
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.file("nolayout.json", no_layout)), FileFormatError, "nolayout.json",
                        "layout");
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.path("missing.json")), InputError, "missing.json");
}

// A value of the wrong type names the file and the field's path; a null
// figure (weft writes a NaN as null) reads as not recorded.
TEST(Recipe, WrongTypesNameTheFieldAndNullFiguresReadAsAbsent) {
  test::TempDir dir;
  const auto j = recipe_to_json(sample());
  auto edited = [&](auto edit) {
    auto e = j;
    edit(e);
    return e.dump();
  };
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.file("dev.json", edited([](auto& e) { e["cluster"]["device"] = 5; }))),
                        FileFormatError, "dev.json", "field 'cluster.device'", "must be string");
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.file("ver.json", edited([](auto& e) { e["weft_version"] = nullptr; }))),
                        FileFormatError, "ver.json", "field 'weft_version'");
  WEFT_EXPECT_THROW_MSG(recipe_load(dir.file("fig.json", edited([](auto& e) { e["predicted"]["mfu"] = true; }))),
                        FileFormatError, "fig.json", "predicted.mfu", "true");
  for (const auto& text : {j.dump(), edited([](auto& e) { e["predicted"]["step_s"] = nullptr; })}) {
    const auto back = recipe_load(dir.file("null.json", text));
    EXPECT_DOUBLE_EQ(back.predicted.value("mfu", 0.0), 0.723);
  }
  const auto back = recipe_load(dir.file("null.json", edited([](auto& e) { e["predicted"]["step_s"] = nullptr; })));
  EXPECT_FALSE(back.predicted.contains("step_s"));
}

TEST(Recipe, DiffListsChangedFields) {
  auto a = sample(), b = sample();
  b.layout = Layout::parse("tp2-pp1-dp32-mb1-zero1");
  b.world = 64;
  const auto d = recipe_diff(a, b);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("/layout"), std::string::npos);
}

}  // namespace
}  // namespace weft::tuner
