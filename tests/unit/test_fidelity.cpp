#include <set>
// The cost and memory models against public measured training runs
// (calibration/public_runs.csv): the presets' shipped profiles are what the
// fit gives today, and on the held-out sweeps (never fitted to) they predict
// MFU, rank layouts and tell fitting from out-of-memory within the bounds
// below. benchmarks/model_fidelity prints the tables behind these numbers.
#include <cmath>
#include <fstream>
#include <map>

#include "test_util.h"
#include "core/error.h"
#include "calibration/fidelity.h"

namespace weft::calibration {
namespace {

using namespace weft::tuner;

const PublicRunSet& runs() {
  static const PublicRunSet set = public_runs_load(calibration_dir() + "/public_runs.csv");
  return set;
}

// Rows in the real CSV's columns: the header, and a row from the cells
// given (the others empty).
struct CsvRows {
  std::string header;
  std::vector<std::string> columns;
  CsvRows() {
    std::ifstream real(calibration_dir() + "/public_runs.csv");
    std::getline(real, header);
    for (size_t at = 0, next; at <= header.size(); at = next + 1) {
      next = std::min(header.find(',', at), header.size());
      columns.push_back(header.substr(at, next - at));
    }
  }
  std::string row(const std::string& source, const std::map<std::string, std::string>& cells) const {
    std::string line;
    for (size_t i = 0; i < columns.size(); ++i) {
      const auto it = cells.find(columns[i]);
      line += (i ? "," : "") + (columns[i] == "source" ? source : it == cells.end() ? "" : it->second);
    }
    return line + "\n";
  }
};

TEST(Fidelity, RowsLoadWithTheirSplit) {
  const auto& set = runs();
  ASSERT_GT(set.runs.size(), 800u);
  int64_t held = 0, oom = 0;
  std::map<std::string, int64_t> sweeps_held;
  for (const auto& r : set.runs) {
    held += r.held_out;
    oom += r.oom;
    if (r.held_out) ++sweeps_held[r.sweep];
    if (!r.oom) {
      EXPECT_GT(r.measured_step_s, 0) << r.source << ":" << r.line;
      EXPECT_GT(r.measured_mfu, 0.05) << r.source << ":" << r.line;
      EXPECT_LT(r.measured_mfu, 0.85) << r.source << ":" << r.line;
    }
    EXPECT_TRUE(r.layout.violations(r.model, r.run, r.cluster.gpus).empty()) << r.source << ":" << r.line;
  }
  EXPECT_GT(held, int64_t(set.runs.size()) / 10);
  EXPECT_LT(held, int64_t(set.runs.size()) / 2);
  EXPECT_GT(oom, 300);
  // Rows weft cannot express are counted, not dropped silently.
  EXPECT_GT(set.skipped.at("attention 'flash1' (no weft kernel of its kind)"), 0);
  // The CSV's context-parallel rows (S6, S7, S10) are read for their cp:
  // S7's two Llama 3 rows and S6's three Llama 3.1 8B rows (FP8, on the
  // h100-96gb part) are expressed, as are S13's Grok-1 rows at cp2 (FP8
  // among them); S6's 405B rows state no global batch and S10's spreads 126
  // layers unevenly over pp x vpp.
  EXPECT_EQ(set.skipped_cp,
            (std::map<std::string, int64_t>{{"global_batch not stated", 3},
                                            {"layout weft cannot run: layers L=126 must be divisible by pp*vpp", 1}}));
  // Rows on the power-limited 96 GB part are judged, never fitted.
  for (const auto& r : set.runs)
    if (r.cluster.device.name == "h100-96gb") {
      EXPECT_TRUE(r.held_out) << r.source << ":" << r.line;
    }
}

// FP8 rows carry their framework's recipe, form sweeps of their own, and
// hold out 30% of each study's FP8 sweeps; the fidelity counts them apart.
TEST(Fidelity, Fp8RowsAreExpressedHeldOutAndReportedApart) {
  const auto& set = runs();
  std::map<Fp8Recipe, int64_t> recipes;
  std::map<std::string, std::pair<std::set<std::string>, std::set<std::string>>> sweeps;  // study: all, held
  for (const auto& r : set.runs) {
    if (r.layout.fp8 == Fp8Recipe::off) {
      EXPECT_EQ(r.sweep.find(" fp8"), std::string::npos) << r.sweep;
      continue;
    }
    ++recipes[r.layout.fp8];
    EXPECT_NE(r.sweep.find(" fp8"), std::string::npos) << r.sweep;
    EXPECT_TRUE(r.cluster.device.has_fp8()) << r.source << ":" << r.line;
    // (A study's MoE sweeps hold out their own share.)
    const std::string study = r.source.substr(0, r.source.find('_')) + (r.model.moe.enabled() ? " moe" : "");
    if (r.cluster.device.name != "h100-96gb") {  // those are all held out, outside the draw
      sweeps[study].first.insert(r.sweep);
      if (r.held_out) sweeps[study].second.insert(r.sweep);
    }
    // Transformer Engine's default (llm-foundry, NeMo 24.07) is delayed;
    // Megatron-Bridge's FP8-CS and torchtitan's Float8 are current
    // (tensorwise) scaling.
    const bool current = r.source.rfind("megatronbridge", 0) == 0 || r.source.rfind("torchtitan", 0) == 0;
    EXPECT_EQ(r.layout.fp8, current ? Fp8Recipe::tensorwise : Fp8Recipe::delayed) << r.source << ":" << r.line;
  }
  EXPECT_GE(recipes[Fp8Recipe::delayed], 10);
  EXPECT_GE(recipes[Fp8Recipe::tensorwise], 2);
  for (const auto& [study, v] : sweeps)
    if (v.first.size() >= 2) {
      EXPECT_EQ(v.second.size(), (3 * v.first.size() + 9) / 10) << study;
    }
  const auto f = fidelity_evaluate(set.runs, Split::held_out, [](const DeviceSpec& d) { return cost_defaults(d); });
  EXPECT_GE(f.fp8.measured, 5);
  EXPECT_GT(f.fp8.mae_points, 0);
  // The target: 5 points (the model reaches 4.98 since attention's
  // efficiency grows with the sequence; benchmarks/RESULTS.md, "FP8"), so
  // that a change that loses it fails.
  EXPECT_LE(f.fp8.mae_points, 5.0);
}

// Megatron-Core through Transformer Engine on Hopper runs cuDNN's attention
// and overlaps its tensor-parallel collectives (userbuffers); torchtitan's
// rows overlap them where they state AsyncTP. Other rows keep flash (or
// Megatron's fused softmax) and expose them.
TEST(PublicRuns, FrameworksKeepTheirAttentionKernelAndTensorParallelOverlap) {
  int64_t te = 0, async_tp = 0;
  for (const auto& r : runs().runs) {
    const bool hopper = r.cluster.device.name.rfind("h100", 0) == 0;
    const bool megatron = r.source.rfind("nemo", 0) == 0 || r.source.rfind("megatron", 0) == 0;
    const std::string where = r.source + ":" + std::to_string(r.line);
    if (megatron && hopper) {
      ++te;
      EXPECT_EQ(r.layout.attention, AttentionKind::cudnn) << where;
      EXPECT_TRUE(r.tp_comm_overlapped) << where;
    } else if (r.source.rfind("automodel", 0) == 0 || r.source.rfind("mcoremodelzoo", 0) == 0) {
      // NeMo AutoModel's and the MCore MoE ModelZoo's rows state Transformer
      // Engine's attention (the attention column), cuDNN's on Hopper, and
      // no tp overlap.
      EXPECT_EQ(r.layout.attention, AttentionKind::cudnn) << where;
      EXPECT_FALSE(r.tp_comm_overlapped) << where;
    } else {
      EXPECT_NE(r.layout.attention, AttentionKind::cudnn) << where;
      if (r.tp_comm_overlapped) {
        ++async_tp;
        EXPECT_EQ(r.source.rfind("torchtitan", 0), 0u) << where;
      }
    }
  }
  EXPECT_GE(te, 7);
  EXPECT_GE(async_tp, 1);
  // torchtitan's eager rows run an unfused RMSNorm, its compiled ones the
  // norm Inductor fuses.
  std::map<NormKind, int64_t> titan_norms;
  for (const auto& r : runs().runs)
    if (r.source.rfind("torchtitan", 0) == 0) ++titan_norms[r.layout.norm];
  EXPECT_GE(titan_norms[NormKind::unfused], 2);
  EXPECT_GE(titan_norms[NormKind::fused], 2);
  // The overlap is priced: with it, such a row's tp time shrinks to the
  // overlap cost's share, and a row without tp collectives is unchanged.
  for (const auto& r : runs().runs)
    if (r.tp_comm_overlapped && r.layout.tp > 1) {
      CostConstants k = cost_defaults(r.cluster.device);
      const auto exposed = predict(r.model, r.run, r.layout, r.cluster, k);
      k.tp_overlap = 1;
      const auto hidden = predict(r.model, r.run, r.layout, r.cluster, k);
      EXPECT_NEAR(hidden.tp_comm, exposed.tp_comm * k.overlap_cost, 1e-9 * exposed.step) << r.line;
    }
}

// A context-parallel row weft can express keeps its degree, takes its
// framework's default transport, and counts apart in the fidelity.
TEST(PublicRuns, ContextParallelRowsKeepTheirDegree) {
  const CsvRows csv;
  const std::map<std::string, std::string> cells = {
      {"model", "Llama 3.1 8B"}, {"layers", "32"},     {"hidden", "4096"},  {"heads", "32"},
      {"kv_heads", "8"},         {"ffn", "14336"},     {"vocab", "128256"}, {"seq", "8192"},
      {"gpu", "H100 80GB HBM3"}, {"gpus", "8"},        {"global_batch", "8"}, {"micro_batch", "1"},
      {"tp", "1"},               {"pp", "1"},          {"dp", "4"},         {"cp", "2"},
      {"recompute", "full"},     {"status", "measured"}, {"tokens_per_s_per_gpu", "4000"}};
  const std::string path = ::testing::TempDir() + "/public_runs_cp.csv";
  std::ofstream(path) << csv.header << "\n" << csv.row("torchtitan_example", cells) << csv.row("nemo_example", cells);
  const auto set = public_runs_load(path);
  ASSERT_EQ(set.runs.size(), 2u);
  EXPECT_EQ(set.runs[0].layout.cp, 2);
  EXPECT_EQ(set.runs[0].layout.cp_comm, CpComm::allgather);  // torchtitan's context_parallel_rotate_method
  EXPECT_EQ(set.runs[1].layout.cp_comm, CpComm::ring);       // Megatron-Core's cp_comm_type p2p
  EXPECT_EQ(set.runs[0].layout.world(), 8);
  const auto f = fidelity_evaluate(set.runs, Split::all, [](const DeviceSpec& d) { return cost_defaults(d); });
  EXPECT_EQ(f.context_parallel.measured, 2);
  EXPECT_EQ(f.total.measured, 2);
  EXPECT_GT(f.context_parallel.mae_points, 0);
}

// A Mixture-of-Experts row names its weft preset, whose shape its columns
// must state alike; it keeps its ep and expert tp degrees, counts apart in
// the fidelity, splits its own sweeps and is never fitted.
TEST(PublicRuns, MoeRowsTakeTheirPresetAndFitTheMoeConstantsAlone) {
  const CsvRows csv;
  std::map<std::string, std::string> cells = {
      {"model", "Mixtral 8x7B"}, {"layers", "32"}, {"hidden", "4096"}, {"heads", "32"}, {"kv_heads", "8"},
      {"ffn", "14336"}, {"vocab", "32000"}, {"seq", "4096"}, {"gpu", "H100 80GB HBM3"}, {"gpus", "64"},
      {"global_batch", "256"}, {"micro_batch", "1"}, {"tp", "1"}, {"pp", "4"}, {"vpp", "8"}, {"dp", "16"},
      {"ep", "8"}, {"recompute", "none"}, {"status", "measured"}, {"tflops_per_gpu", "438"},
      {"tokens_per_s_per_gpu", "3000"}, {"preset", "mixtral-8x7b"}};
  const std::string path = ::testing::TempDir() + "/public_runs_moe.csv";
  std::string rows = csv.header + "\n";
  for (int i = 0; i < 4; ++i) {
    cells["seq"] = std::to_string(4096 << (i % 2));
    cells["gpus"] = std::to_string(64 << (i / 2)), cells["dp"] = std::to_string(16 << (i / 2));
    rows += csv.row("megatron_moe", cells);
  }
  std::ofstream(path) << rows;
  const auto set = public_runs_load(path);
  ASSERT_EQ(set.runs.size(), 4u);
  const PublicRun& r = set.runs.front();
  EXPECT_TRUE(r.model.moe.enabled());
  EXPECT_EQ(r.model.moe.experts, 8);
  EXPECT_EQ(r.model.name, "Mixtral 8x7B");
  EXPECT_EQ(r.layout.ep, 8);
  EXPECT_EQ(r.layout.vpp, 8);
  EXPECT_TRUE(r.layout.violations(r.model, r.run, r.cluster.gpus).empty());
  int64_t held = 0;
  for (const auto& x : set.runs) held += x.held_out;
  EXPECT_EQ(held, 2);  // 30% of its 4 sweeps, rounded up
  const auto f = fidelity_evaluate(set.runs, Split::all, [](const DeviceSpec& d) { return cost_defaults(d); });
  EXPECT_EQ(f.moe.measured, 4);
  EXPECT_GT(f.moe.mae_points, 0);
  // Beside the real rows: held out, they leave the fit as it was; in the
  // fitted split they move the MoE constants and no other.
  std::vector<PublicRun> held_out = runs().runs, fitted = runs().runs;
  for (PublicRun x : set.runs) {
    x.held_out = true;
    held_out.push_back(x);
    x.held_out = false;
    fitted.push_back(x);
  }
  const CostConstants start = datasheet_constants(device_preset("h100"));
  const nlohmann::json base = fidelity_fit(runs().runs, "hopper", start).constants;
  EXPECT_EQ(nlohmann::json(fidelity_fit(held_out, "hopper", start).constants), base);
  nlohmann::json moved = fidelity_fit(fitted, "hopper", start).constants;
  EXPECT_NE(moved, base);
  for (const char* name : {"expert_gemm_efficiency", "fp8_expert_gemm_efficiency", "dispatch_efficiency"})
    moved[name] = base[name];
  EXPECT_EQ(moved, base);
  // A Mixture of Experts weft has no preset of, from its columns (every
  // layer routed; a GELU expert priced as SwiGLU's matmuls).
  {
    std::map<std::string, std::string> grok = cells;
    grok.erase("preset");
    grok.insert({{"experts", "8"}, {"top_k", "2"}, {"moe_ffn", "32768"}});
    grok["model"] = "Grok-1 proxy", grok["layers"] = "8", grok["hidden"] = "6144", grok["heads"] = "48",
    grok["vocab"] = "131072", grok["ffn"] = "32768", grok["pp"] = "1", grok["vpp"] = "", grok["dp"] = "64",
    grok["gpus"] = "64";
    std::ofstream(path) << csv.header << "\n" << csv.row("megatron_moe", grok);
    const auto g = public_runs_load(path);
    ASSERT_EQ(g.runs.size(), 1u) << (g.skipped.empty() ? "" : g.skipped.begin()->first);
    const ModelSpec& gm = g.runs[0].model;
    EXPECT_EQ(gm.moe.experts, 8);
    EXPECT_EQ(gm.moe.top_k, 2);
    EXPECT_EQ(gm.moe.expert_intermediate, 32768);
    EXPECT_EQ(gm.moe_layers(), 8);
    grok["top_k"] = "9";
    std::ofstream(path) << csv.header << "\n" << csv.row("megatron_moe", grok);
    EXPECT_THROW(public_runs_load(path), InputError);
  }
  // Columns that disagree with the preset are an error naming both.
  cells["layers"] = "40";
  std::ofstream(path) << csv.header << "\n" << csv.row("megatron_moe", cells);
  try {
    public_runs_load(path);
    FAIL() << "a row unlike its preset loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layers 40 differs from preset mixtral-8x7b's 32"), std::string::npos)
        << e.what();
  }
}

// The shipped profiles are the fit of the current model to the current rows:
// a change to either without `weft calibrate --public` fails here.
TEST(Fidelity, ShippedProfilesAreTheFit) {
  for (const char* family : {"a100", "hopper"}) {
    const auto shipped = preset_profile(device_preset(family == std::string("a100") ? "a100-80gb" : "h100"));
    ASSERT_TRUE(shipped) << family;
    const auto fresh = fidelity_profile(runs(), family, "public_runs.csv");
    const nlohmann::json a = shipped->constants, b = fresh.constants;
    for (const auto& [name, v] : a.items())
      EXPECT_NEAR(v.get<double>(), b[name].get<double>(), 1e-6 * std::max(1.0, std::abs(v.get<double>())))
          << family << " " << name << ": run `weft calibrate --public` and commit calibration/profiles/";
  }
}

TEST(Fidelity, HeldOutSweepsWithinBounds) {
  const auto after = fidelity_evaluate(runs().runs, Split::held_out, [](const DeviceSpec& d) { return cost_defaults(d); });
  const auto before =
      fidelity_evaluate(runs().runs, Split::held_out, [](const DeviceSpec& d) { return datasheet_constants(d); });
  const auto& t = after.total;
  ASSERT_GT(t.measured, 100);
  ASSERT_GE(t.sweeps, 3);
  // MFU within 5 points on average (the datasheet constants: ~15 too high).
  EXPECT_LE(t.mae_points, 5.0);
  EXPECT_GT(before.total.mae_points, 10.0);
  EXPECT_LT(std::abs(t.bias_points), 2.5);
  // Layouts of one model on one cluster ranked as measured.
  EXPECT_GE(t.mean_spearman, 0.8);
  // The layout ranked first measured within 2 MFU points of the best in 90%
  // of the held-out sweeps.
  EXPECT_GE(double(t.best_within_2), 0.9 * double(t.sweeps));
  // Runs that trained are predicted to fit; most measured OOMs predicted OOM.
  // Not torchtitan's selective rows: its op-level recomputation (every other
  // matmul output kept, pointwise ops redone) keeps less than weft's
  // selective mode (the attention core redone, all else kept), which is what
  // they are read as; at mb 2 and T 8192 weft counts more than the board
  // holds (benchmarks/RESULTS.md, "cp rows on the 96 GB H100").
  std::vector<PublicRun> comparable;
  for (const auto& r : runs().runs)
    if (!(r.source.rfind("torchtitan", 0) == 0 && r.layout.ckpt == Checkpointing::selective)) comparable.push_back(r);
  const auto memory = fidelity_evaluate(comparable, Split::held_out, [](const DeviceSpec& d) { return cost_defaults(d); });
  EXPECT_GE(double(memory.total.fit_predicted), 0.95 * double(memory.total.measured));
  EXPECT_GE(double(t.oom_predicted), 0.5 * double(t.oom));
}

// The public MoE rows (calibration/SOURCES.md, "MoE rows"): their fitted
// split fits the MoE constants (calibration/fidelity.h), and the held-out
// split's MFU error is the target, 5 points. Both splits, and the
// bf16 and FP8 rows apart, are bounded so that a change that loses accuracy
// here fails (benchmarks/RESULTS.md: 2.4 held out, 2.9 fitted; bf16 3.2,
// FP8 2.5).
TEST(Fidelity, MoeHeldOutRowsMeetTheTarget) {
  std::vector<PublicRun> bf16, fp8, all;
  for (const auto& r : runs().runs)
    if (r.model.moe.enabled()) {
      (r.layout.fp8 == Fp8Recipe::off ? bf16 : fp8).push_back(r);
      all.push_back(r);
    }
  ASSERT_GE(bf16.size(), 17u);
  ASSERT_GE(fp8.size(), 22u);
  const auto judged = [](const std::vector<PublicRun>& rows, Split split, bool shipped = true) {
    return fidelity_evaluate(rows, split, [shipped](const DeviceSpec& d) {
      return shipped ? cost_defaults(d) : datasheet_constants(d);
    });
  };
  const auto held = judged(all, Split::held_out), fitted = judged(all, Split::fitted);
  ASSERT_GE(held.moe.measured, 10);
  ASSERT_GE(fitted.moe.measured, 20);
  EXPECT_LE(held.moe.mae_points, 3.2);
  EXPECT_LE(fitted.moe.mae_points, 3.5);
  EXPECT_LT(std::abs(held.moe.bias_points), 2.0);
  // The datasheet constants (every MoE constant 1: priced as dense GEMMs and
  // plain all-to-alls) miss the held-out rows by twice the target.
  EXPECT_GT(judged(all, Split::held_out, false).moe.mae_points, 10.0);
  const auto f = judged(bf16, Split::all), f8 = judged(fp8, Split::all);
  EXPECT_EQ(f.moe.measured, int64_t(bf16.size()));
  EXPECT_LE(f.moe.mae_points, 4.0);
  EXPECT_GE(f.moe.fit_predicted, 12);
  EXPECT_EQ(f8.moe.measured, int64_t(fp8.size()));
  EXPECT_LE(f8.moe.mae_points, 3.0);
  // Every FP8 MoE row is expressed now: Megatron-Bridge's (FP8-CS:
  // tensorwise), NeMo's Grok-1 and Maverick ones (delayed).
  EXPECT_EQ(runs().skipped.count("moe: FP8 GEMMs in MoE blocks"), 0u);
  int64_t delayed = 0;
  for (const auto& r : fp8) delayed += r.layout.fp8 == Fp8Recipe::delayed;
  EXPECT_GE(delayed, 11);
  // Megatron's ep folded over the tp ranks at ETP 1 (the ModelZoo's
  // Qwen3-235B rows, Megatron-Bridge's EP32 over TP2, Grok-1 2025-09) reads
  // as epfold.
  int64_t folded = 0;
  for (const auto& r : bf16) folded += r.layout.ep_fold ? 1 : 0;
  EXPECT_GE(folded, 4);
}

TEST(Fidelity, SpearmanHandlesTiesAndTooFewPoints) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  EXPECT_NEAR(spearman({1, 2, 2, 3}, {1, 2, 3, 4}), 0.9486832980505138, 1e-12);
  EXPECT_TRUE(std::isnan(spearman({1, 2}, {1, 2})));
  EXPECT_TRUE(std::isnan(spearman({1, 1, 1}, {1, 2, 3})));
}

TEST(PublicRuns, MalformedFilesAreRefusedWithTheLine) {
  const std::string path = ::testing::TempDir() + "/public_runs_bad.csv";
  std::ofstream(path) << "source,model\nx,\"unterminated\n";
  WEFT_EXPECT_THROW_MSG(public_runs_load(path), InputError, path.c_str(), "unterminated quote");
  std::ofstream(path) << "model,source\n";
  WEFT_EXPECT_THROW_MSG(public_runs_load(path), InputError, "header");
  WEFT_EXPECT_THROW_MSG(public_runs_load(path + ".missing"), InputError, "cannot read");
}

}  // namespace
}  // namespace weft::calibration
