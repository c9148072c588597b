#include "report/report.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include <numeric>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/flops.h"
#include "core/error.h"
#include "core/units.h"
#include "trainer/loop.h"
#include "report/html_report.h"

namespace weft::report {

using namespace weft::tuner;  // the spaces, trials and contexts a report describes

ReportFormat report_format_parse(const std::string& s) {
  if (s == "table") return ReportFormat::table;
  if (s == "json") return ReportFormat::json;
  if (s == "csv") return ReportFormat::csv;
  if (s == "md") return ReportFormat::md;
  if (s == "html") return ReportFormat::html;
  throw InputError(fmt::format("unknown report format '{}'; valid: table, json, csv, md, html", s));
}

namespace {

double gib(int64_t b) { return double(b) / double(GiB); }

// The numerical side of grad:bf16, which the step time and memory columns do
// not show.
std::string grad_precision_note(const Layout& l) {
  if (l.grad != GradPrecision::bf16) return {};
  return "  gradients in bf16: half the gradient memory and data-parallel traffic of fp32, but each\n"
         "  micro-batch's accumulation and each reduction over dp rounds to 8 mantissa bits, so a\n"
         "  contribution below 2^-8 of the running sum is lost (--grad fp32 keeps them exact to fp32)\n";
}

// A layout's GEMM precision as the reports print it: its FP8 recipe, else
// the run's compute precision (fp32 on the CPU).
std::string gemms(const Layout& l, const RunSpec& run) {
  return l.fp8 == Fp8Recipe::off ? std::string(to_string(run.precision)) : gemm_precision_text(l);
}

// The tp degrees of the world at which the vocabulary is padded
// (ModelSpec::padded_vocab), with the padded sizes; empty when none.
std::vector<std::pair<int64_t, int64_t>> vocab_paddings(const ModelSpec& m, int64_t world) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t model_tp = std::gcd(std::gcd(m.heads, m.kv_heads), m.intermediate);
  for (int64_t t = 2; t <= world; ++t)
    if (world % t == 0 && model_tp % t == 0 && m.padded_vocab(t) > m.vocab) out.emplace_back(t, m.padded_vocab(t));
  return out;
}

std::string vocab_note(const ModelSpec& m, int64_t world) {
  const auto pads = vocab_paddings(m, world);
  if (pads.empty()) return "";
  std::string sizes;
  for (const auto& [t, vp] : pads) sizes += fmt::format("{}{} at tp {}", sizes.empty() ? "" : ", ", vp, t);
  return fmt::format("vocab   V={} is padded where tp does not divide it, to a multiple of {} x tp: {} (the padding "
                     "is masked out of the loss, and MFU counts V)\n",
                     m.vocab, kVocabPadMultiple, sizes);
}

std::string header(const SpaceReport& r, const SpaceContext& c) {
  const double usable = double(c.cluster.device.memory_bytes) * (1 - c.memory.margin);
  std::string peak_kind = c.cluster.device.kind == DeviceKind::cpu ? "fp32" : "dense bf16";
  const std::string space =
      r.exhaustive
          ? fmt::format("evaluated {} layouts in {:.1f} ms ({:.0f} layouts/s): {} fit, {} pruned\n", r.evaluated,
                        r.seconds * 1e3, r.seconds > 0 ? double(r.evaluated) / r.seconds : 0.0, r.fitting,
                        r.evaluated - r.fitting)
          : fmt::format("searched {} layouts (the full product of the knobs) in {:.1f} ms: visited {} ({:.2g}%), "
                        "{} of them fit; the rest ruled out by rules and bounds, below (--exhaustive predicts "
                        "every one)\n",
                        r.evaluated, r.seconds * 1e3, r.visited,
                        r.evaluated > 0 ? 100.0 * double(r.visited) / double(r.evaluated) : 0.0, r.fitting);
  // FP8 layouts are measured against the same bf16 peak (dividing by the
  // FP8 peak would halve their MFU and make FP8 and BF16 runs incomparable).
  const std::string fp8_note =
      c.cluster.device.has_fp8()
          ? fmt::format("FP8 layouts' MFU is against the same {:.0f} TFLOP/s bf16 peak, not the {:.0f} TFLOP/s FP8 "
                        "peak; GEMMs: the precision of the blocks' linear layers\n",
                        c.cluster.device.peak_bf16_flops / 1e12, c.cluster.device.peak_fp8_flops / 1e12)
          : "";
  return fmt::format(
      "model   {}\n{}cluster {}\nrun     seq {}, global batch {} ({:.2f}M tokens/step), {}{}\n"
      "MFU against the {} peak of {:.1f} TFLOP/s per device, of {}; memory margin {:.0f}% "
      "(usable {:.1f} of {:.1f} GiB)\n{}{}",
      c.model.summary(), vocab_note(c.model, c.cluster.gpus), c.cluster.summary(), c.run.seq, c.run.global_batch,
      double(c.run.tokens_per_step()) / 1e6, to_string(c.run.precision),
      c.run.lora.enabled() ? "\nlora    " + lora_summary(c.model, c.run.lora) + " (MFU counts 4N + adapters: no weight gradients of frozen weights)" : "",
      peak_kind,
      c.cluster.device.peak_flops(to_string(c.run.precision)) / 1e12, mfu_flops_text(c.model), 100 * c.memory.margin,
      usable / double(GiB), gib(c.cluster.device.memory_bytes), fp8_note, space);
}

// The pipeline's balance: each stage's time per micro-batch (the cost
// model's, tuner::stage_times) and how far the slowest is over their mean,
// the share of the steady state the other stages wait.
std::string stage_times_text(const Layout& l, const SpaceContext& ctx) {
  const auto t = tuner::stage_times(ctx.model, ctx.run, l, ctx.cluster, ctx.constants);
  double sum = 0, slowest = 0;
  std::vector<std::string> each;
  for (size_t s = 0; s < t.size(); ++s) {
    sum += t[s];
    slowest = std::max(slowest, t[s]);
    each.push_back(fmt::format("{} ({})", format_seconds(t[s]), l.stage_layers(ctx.model, int64_t(s))));
  }
  return fmt::format("  stage times per micro-batch (layers): {}; slowest {:.1f}% over the mean{}\n",
                     fmt::join(each, ", "), 100 * (slowest * double(t.size()) / sum - 1),
                     l.uneven() ? fmt::format(" (split {})", split_text(l.split)) : "");
}

std::string breakdown(const Candidate& c, const SpaceContext& ctx) {
  std::string s = fmt::format("best layout: {}\n", c.layout.to_string());
  s += fmt::format("  memory per stage (GiB){:>4}", "");
  for (auto cat : memory::kAllCategories) s += fmt::format("{:>12}", memory::to_string(cat));
  s += fmt::format("{:>10}\n", "total");
  for (const auto& st : c.memory.stages) {
    s += fmt::format("  stage {:<3} ({:>3} layers, {:>2} in flight)", st.stage, st.layers,
                     st.in_flight_chunks);
    for (int64_t b : st.bytes) s += fmt::format("{:>12.2f}", gib(b));
    s += fmt::format("{:>10.2f}\n", gib(st.total));
  }
  const auto& k = c.cost;
  auto part = [&](const char* name, double v) {
    return fmt::format("    {:<12} {:>10} {:>5.1f}%\n", name, format_seconds(v), 100 * v / k.step);
  };
  s += fmt::format("  GEMMs {}; predicted step {} = {:.0f} tokens/s, {:.1f} TFLOP/s per device, MFU {:.1f}% "
                   "({} peak {:.1f} TFLOP/s{})\n",
                   gemms(c.layout, ctx.run), format_seconds(k.step), k.tokens_per_second,
                   k.model_flops_per_gpu / 1e12, 100 * k.mfu,
                   ctx.cluster.device.kind == DeviceKind::cpu ? "fp32" : "vs the dense bf16", k.peak_flops / 1e12,
                   k.fp8_peak_flops > 0 ? fmt::format("; {:.1f}% of the {:.0f} TFLOP/s FP8 peak",
                                                      100 * k.fp8_peak_utilization, k.fp8_peak_flops / 1e12)
                                        : "");
  s += part("compute", k.compute) + part("recompute", k.recompute) + part("tp comm", k.tp_comm) +
       part("cp comm", k.cp_comm) + part("pp bubble", k.pp_bubble) + part("pp p2p", k.pp_p2p) + part("dp comm", k.dp_comm) +
       part("optimizer", k.optimizer);
  if (c.layout.pp > 1) s += stage_times_text(c.layout, ctx);
  s += grad_precision_note(c.layout);
  return s;
}

// One row of a ranked table: the same layouts, in the same order, as the
// JSON and CSV reports list (the first `top` of the ranking, fitting ones
// first). A fitting row notes the listed layouts predicted exactly alike
// with it but for the attention kind (weft's flash and cuDNN's fused
// attention are priced alike on a device where cuDNN's was never measured;
// the profiler tells them apart), and why the trainer cannot run it yet, if
// it cannot.
struct Row {
  const Candidate* c;
  int64_t rank = 0;                // 0: not fitting
  std::vector<int64_t> alike;      // ranks of the listed twins
  std::string untrainable;
  std::string layout() const { return c->layout.to_string() + (untrainable.empty() ? "" : " *"); }
  // "as #1 but attn": the note after a fitting row with listed twins.
  std::string alike_note() const {
    if (alike.empty()) return {};
    std::string ranks;
    for (int64_t k : alike) ranks += fmt::format("{}#{}", ranks.empty() ? "" : ",", k);
    return fmt::format("as {} but attn", ranks);
  }
  // What a row that does not fit shows in place of its step time.
  std::string pruned() const {
    return c->prune_class.empty() ? fmt::format("{}: {}", to_string(c->verdict), c->reason) : c->prune_class;
  }
};

// Why the trainer cannot run a layout on the device yet ("" when it can),
// without the "layout <text>: " its error starts with.
std::string cannot_run_yet(const SpaceContext& ctx, const Layout& l) {
  try {
    trainer::check_trainable(ctx.model, l, ctx.cluster.device.kind, trainer::Trainable::anywhere, ctx.run.seq);
  } catch (const LayoutError& e) {
    const std::string what = e.what(), prefix = "layout " + l.to_string() + ": ";
    return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
  }
  return {};
}

std::vector<Row> ranked_rows(const SpaceReport& r, const SpaceContext& ctx, int64_t top) {
  auto key = [](const Candidate& c) {
    Layout l = c.layout;
    l.attention = AttentionKind::flash;
    return fmt::format("{} {:a}", l.to_string(), c.cost.step);
  };
  std::vector<Row> rows;
  std::unordered_map<std::string, std::vector<size_t>> twins;
  int64_t fitting = 0;
  for (const auto& c : r.candidates) {
    if (int64_t(rows.size()) >= top) break;
    Row row{&c, 0, {}, {}};
    if (c.verdict == Verdict::fits) {
      row.rank = ++fitting;
      row.untrainable = cannot_run_yet(ctx, c.layout);
      twins[key(c)].push_back(rows.size());
    }
    rows.push_back(std::move(row));
  }
  for (const auto& [k, members] : twins)
    for (size_t i : members)
      for (size_t j : members)
        if (i != j) rows[i].alike.push_back(rows[j].rank);
  for (auto& row : rows) std::sort(row.alike.begin(), row.alike.end());
  return rows;
}

// The rules behind the order, and what a mark means.
std::string table_notes(const std::vector<Row>& rows, double tie) {
  std::string s = fmt::format(
      "  order: predicted step time; of the layouts within {:g}% of the fastest, the one with the least memory "
      "comes first (the model cannot tell them apart); layouts that do not fit follow, unranked.\n",
      100 * tie);
  for (const auto& row : rows)
    if (!row.alike.empty()) {
      s += "  as #k but attn: predicted exactly alike with rank k, differing only in the attention kind\n";
      break;
    }
  for (const auto& row : rows)
    if (!row.untrainable.empty()) {
      s += "  * the trainer cannot run this layout yet: " + row.untrainable + "\n";
      break;
    }
  return s;
}

// Where the best-ranked layout cannot be trained yet: the best that can,
// among the ranked fitting layouts (whether listed or not), and how much
// slower it is predicted to be; "" where the best can.
std::string best_runnable_note(const SpaceReport& r, const SpaceContext& ctx, const std::vector<Row>& rows) {
  if (rows.empty() || rows.front().rank != 1 || rows.front().untrainable.empty()) return {};
  int64_t rank = 0;
  for (const auto& c : r.candidates) {
    if (c.verdict != Verdict::fits) break;
    ++rank;
    if (!cannot_run_yet(ctx, c.layout).empty()) continue;
    const double best = r.candidates.front().cost.step;
    return fmt::format("  best the trainer can run: #{} {}, {} a step, MFU {:.1f}% (step time {:+.1f}% against #1; "
                       "`--save-recipe` saves it)\n",
                       rank, c.layout.to_string(), format_seconds(c.cost.step), 100 * c.cost.mfu,
                       100 * (c.cost.step / best - 1));
  }
  return fmt::format("  none of the {} fitting layouts ranked here can be trained yet; `--save-recipe` searches every "
                     "fitting layout for the best that can\n",
                     rank);
}

// When nothing fits: the layout that misses by the least memory.
const Candidate* nearest_to_fitting(const SpaceReport& r) {
  const Candidate* best = nullptr;
  for (const auto& c : r.candidates)
    if (c.verdict == Verdict::out_of_memory && (!best || c.memory.peak() < best->memory.peak())) best = &c;
  return best;
}

}  // namespace

std::string report_table(const SpaceReport& r, const SpaceContext& ctx, int64_t top) {
  std::string s = header(r, ctx) + "\n";
  s += fmt::format("{:>4}  {:<78} {:<16} {:>16} {:>10} {:>11} {:>10} {:>6}\n", "rank", "layout", "GEMMs",
                   "mem GiB (worst)", "step", "tokens/s", "TFLOP/s/dev", "MFU");
  const auto rows = ranked_rows(r, ctx, top);
  for (const Row& row : rows) {
    const Candidate& c = *row.c;
    const std::string rank = row.rank > 0 ? fmt::format("{}", row.rank) : "-";
    const std::string mem = c.verdict == Verdict::invalid
                                ? ""
                                : fmt::format("{:>7.1f} / {:<6.1f}", gib(c.memory.peak()), gib(c.memory.usable));
    const std::string precision = gemms(c.layout, ctx.run);
    if (row.rank == 0) {
      s += fmt::format("{:>4}  {:<78} {:<16} {:>16} {}\n", rank, row.layout(), precision, mem, row.pruned());
      continue;
    }
    s += fmt::format("{:>4}  {:<78} {:<16} {:>16} {:>10} {:>11.0f} {:>10.1f} {:>5.1f}%{}\n", rank, row.layout(), precision,
                     mem, format_seconds(c.cost.step), c.cost.tokens_per_second, c.cost.model_flops_per_gpu / 1e12,
                     100 * c.cost.mfu, row.alike.empty() ? "" : "  " + row.alike_note());
  }
  if (rows.empty() || rows.front().rank == 0) s += "  (no layout fits; see the pruning reasons below)\n";
  if (!rows.empty()) s += table_notes(rows, ctx.tie) + best_runnable_note(r, ctx, rows);
  s += "\npruned by reason:\n";
  if (r.pruned.empty()) s += "  (none)\n";
  for (const auto& [why, n] : r.pruned) s += fmt::format("  {:>8}  {}\n", n, why);
  if (!r.candidates.empty() && r.candidates.front().verdict == Verdict::fits) {
    s += '\n';
    s += breakdown(r.candidates.front(), ctx);
  } else if (const Candidate* c = nearest_to_fitting(r)) {
    s += fmt::format("\nnearest to fitting: {}\n  {}\n", c->layout.to_string(), c->reason);
  }
  return s;
}

nlohmann::json report_json(const SpaceReport& r, const SpaceContext& ctx, int64_t top) {
  nlohmann::json j;
  j["model"] = ctx.model;
  j["run"] = ctx.run;
  j["cluster"] = ctx.cluster;
  j["cost_constants"] = ctx.constants;
  j["memory_margin"] = ctx.memory.margin;
  if (ctx.run.lora.enabled()) j["trainable_params"] = lora_params(ctx.model, ctx.run.lora);
  for (const auto& [t, vp] : vocab_paddings(ctx.model, ctx.cluster.gpus)) j["padded_vocab"][std::to_string(t)] = vp;
  j["evaluated"] = r.evaluated;
  j["visited"] = r.visited;
  j["exhaustive"] = r.exhaustive;
  j["fitting"] = r.fitting;
  j["pruned"] = r.pruned;
  j["seconds"] = r.seconds;
  auto& rows = j["layouts"] = nlohmann::json::array();
  int64_t rank = 0;
  j["listed"] = std::min<int64_t>(top, int64_t(r.candidates.size()));
  for (const auto& c : r.candidates) {
    if (int64_t(rows.size()) >= top) break;
    nlohmann::json row{{"layout", c.layout.to_string()},
                       {"gemm_precision", gemms(c.layout, ctx.run)},
                       {"verdict", to_string(c.verdict)}};
    if (c.verdict == Verdict::fits) {
      row["rank"] = ++rank;
      if (const std::string why = cannot_run_yet(ctx, c.layout); !why.empty())
        row["cannot_run_yet"] = why;
    }
    if (!c.reason.empty()) row["reason"] = c.reason;
    if (!c.prune_class.empty()) row["prune_class"] = c.prune_class;
    if (c.verdict != Verdict::invalid) {
      row["prediction"] = c.cost;
      auto& stages = row["memory_stages"] = nlohmann::json::array();
      for (const auto& st : c.memory.stages) {
        nlohmann::json sj{{"stage", st.stage}, {"layers", st.layers},
                          {"in_flight", st.in_flight_chunks}, {"total_bytes", st.total}};
        for (auto cat : memory::kAllCategories)
          sj[memory::to_string(cat)] = st.bytes[static_cast<size_t>(cat)];
        stages.push_back(sj);
      }
      if (c.layout.pp > 1) row["stage_times_s"] = tuner::stage_times(ctx.model, ctx.run, c.layout, ctx.cluster, ctx.constants);
      row["memory_peak_bytes"] = c.memory.peak();
      row["memory_usable_bytes"] = c.memory.usable;
    }
    rows.push_back(std::move(row));
  }
  return j;
}

std::string report_csv_header() {
  return "rank,layout,verdict,reason,peak_bytes,usable_bytes,step_s,tokens_per_s,model_tflops_per_dev,"
         "mfu,compute_s,recompute_s,tp_comm_s,cp_comm_s,pp_bubble_s,pp_p2p_s,dp_comm_s,optimizer_s,gemm_precision,"
         "cannot_run_yet\n";
}

std::string report_csv_row(const Candidate& c, int64_t rank, const SpaceContext& ctx) {
  std::string reason = c.reason;
  for (char& ch : reason)
    if (ch == '"') ch = '\'';
  std::string not_yet = c.verdict == Verdict::fits ? cannot_run_yet(ctx, c.layout) : "";
  for (char& ch : not_yet)
    if (ch == '"') ch = '\'';
  std::string s = fmt::format("{},{},{},\"{}\",", rank > 0 ? fmt::format("{}", rank) : "", c.layout.to_string(),
                              to_string(c.verdict), reason);
  if (c.verdict == Verdict::invalid) return s + fmt::format(",,,,,,,,,,,,,,{},\"\"\n", gemms(c.layout, ctx.run));
  const auto& k = c.cost;
  return s + fmt::format(
                 "{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{},\"{}\"\n",
                 c.memory.peak(), c.memory.usable, k.step, k.tokens_per_second, k.model_flops_per_gpu / 1e12, k.mfu,
                 k.compute, k.recompute, k.tp_comm, k.cp_comm, k.pp_bubble, k.pp_p2p, k.dp_comm, k.optimizer,
                 gemms(c.layout, ctx.run), not_yet);
}

std::string report_csv(const SpaceReport& r, const SpaceContext& ctx, int64_t top) {
  std::string s = report_csv_header();
  int64_t rank = 0, listed = 0;
  for (const auto& c : r.candidates) {
    if (listed++ >= top) break;
    s += report_csv_row(c, c.verdict == Verdict::fits ? ++rank : 0, ctx);
  }
  return s;
}

std::string report_md(const SpaceReport& r, const SpaceContext& ctx, int64_t top) {
  std::string s = "# weft dry-run tuning report\n\n```\n" + header(r, ctx) + "```\n\n";
  s += "| rank | layout | GEMMs | memory (worst stage) | step | tokens/s | TFLOP/s/dev | MFU |\n";
  s += "|---:|---|---|---:|---:|---:|---:|---:|\n";
  const auto rows = ranked_rows(r, ctx, top);
  for (const Row& row : rows) {
    const Candidate& c = *row.c;
    const std::string layout = fmt::format("`{}`{}", c.layout.to_string(), row.untrainable.empty() ? "" : " \\*");
    const std::string mem = c.verdict == Verdict::invalid
                                ? ""
                                : fmt::format("{:.1f} / {:.1f} GiB", gib(c.memory.peak()), gib(c.memory.usable));
    if (row.rank == 0) {
      s += fmt::format("| - | {} | {} | {} | {} | | | |\n", layout, gemms(c.layout, ctx.run), mem, row.pruned());
      continue;
    }
    s += fmt::format("| {} | {}{} | {} | {} | {} | {:.0f} | {:.1f} | {:.1f}% |\n", row.rank, layout,
                     row.alike.empty() ? "" : " (" + row.alike_note() + ")", gemms(c.layout, ctx.run), mem,
                     format_seconds(c.cost.step),
                     c.cost.tokens_per_second, c.cost.model_flops_per_gpu / 1e12, 100 * c.cost.mfu);
  }
  if (!rows.empty()) {
    s += '\n';
    s += table_notes(rows, ctx.tie) + best_runnable_note(r, ctx, rows);
  }
  s += "\n## Pruned\n\n| layouts | reason |\n|---:|---|\n";
  for (const auto& [why, n] : r.pruned) s += fmt::format("| {} | {} |\n", n, why);
  if (!r.candidates.empty() && r.candidates.front().verdict == Verdict::fits)
    s += "\n## Best layout\n\n```\n" + breakdown(r.candidates.front(), ctx) + "```\n";
  else if (const Candidate* c = nearest_to_fitting(r))
    s += fmt::format("\n## Nearest to fitting\n\n`{}`: {}\n", c->layout.to_string(), c->reason);
  return s;
}

std::string report_render(ReportFormat f, const SpaceReport& r, const SpaceContext& ctx,
                          int64_t top) {
  switch (f) {
    case ReportFormat::table: return report_table(r, ctx, top);
    case ReportFormat::json: return report_json(r, ctx, top).dump(1) + "\n";
    case ReportFormat::csv: return report_csv(r, ctx, top);
    case ReportFormat::md: return report_md(r, ctx, top);
    case ReportFormat::html:
      return report_html(report_data_space(r, ctx, top));
  }
  return {};
}

}  // namespace weft::report
