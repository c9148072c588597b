// `weft tune --dry-run`: the analytic half of tuning, no GPU needed.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/flops.h"
#include "core/json_io.h"
#include "core/output_guard.h"
#include "core/units.h"
#include "memory/shapes.h"
#include "tuner/device_profile.h"
#include "trainer/loop.h"
#include "tuner/recipe.h"
#include "tuner/space_scan.h"
#include "report/html_report.h"
#include "report/report.h"

namespace weft::cli {

namespace {

struct TuneArgs {
  ModelArgs model;
  ClusterArgs cluster;
  RunArgs run;
  SpaceArgs space;
  bool dry_run = false;
  std::string format = "table";
  std::string out;
  std::string layout;
  std::string save_recipe;
  int64_t top = 10;
  bool all = false;
  bool exhaustive = false;
  double margin = 0.05;
  std::string profile;
  LoraArgs lora;
  CLI::Option* out_option = nullptr;
  CLI::Option* save_recipe_option = nullptr;
};

// Under LoRA, the dry-run also says what full fine-tuning of the same model
// would take on this cluster: its best layout, or that none fits and the
// smallest device count (doubling, up to 64 times) where one does.
std::string full_fine_tuning_note(const tuner::SpaceContext& lora_ctx, const tuner::SpaceLimits& limits,
                                  const tuner::SpaceReport& lora_report) {
  const auto best = [](const tuner::SpaceReport& r) -> const tuner::Candidate* {
    return r.fitting > 0 && !r.candidates.empty() && r.candidates.front().verdict == tuner::Verdict::fits
               ? &r.candidates.front()
               : nullptr;
  };
  const auto row = [&](const char* what, const tuner::Candidate& c, int64_t gpus) {
    return fmt::format("  {:<22} {:>5} GPUs  {:<60} {:>8.1f}% MFU {:>12.0f} tokens/s {:>8.1f} GiB peak\n", what, gpus,
                       c.layout.to_string(), 100 * c.cost.mfu, c.cost.tokens_per_second,
                       double(c.memory.peak()) / double(GiB));
  };
  tuner::SpaceContext full = lora_ctx;
  full.run.lora = {};
  std::string s = fmt::format("\nLoRA against full fine-tuning of {} ({}):\n", lora_ctx.model.name,
                              lora_summary(lora_ctx.model, lora_ctx.run.lora));
  if (const auto* c = best(lora_report)) s += row("LoRA", *c, lora_ctx.cluster.gpus);
  else s += fmt::format("  {:<22} {:>5} GPUs  no layout fits\n", "LoRA", lora_ctx.cluster.gpus);
  for (int64_t factor = 1; factor <= 64; factor *= 2) {
    full.cluster = lora_ctx.cluster;
    full.cluster.gpus = lora_ctx.cluster.gpus * factor;
    tuner::SpaceReport r;
    try {
      r = tuner::search(full, limits, 1, full.cluster.device);
    } catch (const InputError&) {
      continue;
    }
    if (const auto* c = best(r)) {
      s += row(factor == 1 ? "full fine-tuning" : "full fine-tuning (more)", *c, full.cluster.gpus);
      if (factor > 1)
        s += fmt::format("  full fine-tuning fits on no layout of {} GPUs; {} is the smallest doubling that fits\n",
                         lora_ctx.cluster.gpus, full.cluster.gpus);
      return s;
    }
  }
  return s + fmt::format("  full fine-tuning fits on no layout of up to {} GPUs\n", 64 * lora_ctx.cluster.gpus);
}

// Formats other than CSV are built whole in memory: a row is a few hundred
// bytes there, and a JSON row a few KB while it is built.
constexpr int64_t kRowsInMemory = 200'000;
// The page keeps a point of a few tens of bytes for each layout it plots
// (most of them binned on a grid in the end): ten million stay under 1 GiB.
constexpr int64_t kPageLayouts = 10'000'000;

// Every row of `scan` as CSV, predicted again in blocks on every core and
// written as they come, to `out` (built aside and renamed into place) or to
// stdout.
void write_streamed_csv(const tuner::SpaceScan& scan, const tuner::SpaceContext& ctx, const std::string& out) {
  namespace fs = std::filesystem;
  const std::string tmp = out.empty() ? std::string() : fmt::format("{}.tmp-{}", out, ::getpid());
  std::FILE* f = out.empty() ? stdout : std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw InputError(fmt::format("--out {}: cannot write {}: {}", out, tmp, std::strerror(errno)));
  const auto put = [&](const std::string& s) {
    if (std::fwrite(s.data(), 1, s.size(), f) != s.size())
      throw InputError(fmt::format("--out {}: cannot write: {}", out.empty() ? "stdout" : out, std::strerror(errno)));
  };
  try {
    put(report::report_csv_header());
    constexpr int64_t kBlock = 4096;
    std::vector<std::string> rows(static_cast<size_t>(kBlock));
    for (int64_t at = 0; at < scan.size(); at += kBlock) {
      const int64_t n = std::min(kBlock, scan.size() - at);
#pragma omp parallel for schedule(dynamic, 64)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t position = at + i;
        rows[size_t(i)] = report::report_csv_row(scan.candidate(ctx, position),
                                                 position < scan.summary.fitting ? position + 1 : 0, ctx);
      }
      for (int64_t i = 0; i < n; ++i) put(rows[size_t(i)]);
    }
    if (f != stdout) {
      if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0)
        throw InputError(fmt::format("--out {}: cannot write: {}", out, std::strerror(errno)));
      std::fclose(f);
      f = nullptr;
      fs::rename(tmp, out);
      std::fprintf(stderr, "weft: wrote %s (%lld layouts, streamed)\n", out.c_str(),
                   static_cast<long long>(scan.size()));
    }
  } catch (...) {
    if (f != nullptr && f != stdout) std::fclose(f);
    std::error_code ec;
    if (!tmp.empty()) fs::remove(tmp, ec);
    throw;
  }
}

int run_tune(const TuneArgs& a) {
  if (!a.dry_run)
    throw InputError("weft tune ranks layouts with the models only: pass --dry-run; to tune with real steps "
                     "on the devices (and train), run weft train --auto");
  if (a.top <= 0) throw InputError(fmt::format("--top {} must be positive", a.top));
  if (!(a.margin >= 0 && a.margin < 1))
    throw InputError(fmt::format("--margin {} must be in [0, 1)", a.margin));
  const auto format = report::report_format_parse(a.format);
  // The files it will write, before any work: never an input, nor a file
  // that is not an earlier output of the same kind.
  {
    std::vector<std::string> inputs;
    for (const std::string& p : {a.model.model, a.cluster.gpu, a.profile})
      if (!p.empty() && std::filesystem::exists(p)) inputs.push_back(p);
    if (!a.out.empty() || a.out_option->count() > 0)
      output_check(a.out, format == report::ReportFormat::html ? OutputKind::html_report : OutputKind::dry_run_report,
                   inputs, "--out");
    if (!a.save_recipe.empty() || a.save_recipe_option->count() > 0) {
      if (!a.out.empty()) inputs.push_back(a.out);
      output_check(a.save_recipe, OutputKind::recipe, inputs, "--save-recipe");
    }
  }

  tuner::SpaceContext ctx;
  ctx.model = a.model.resolve();
  ctx.cluster = a.cluster.resolve();
  ctx.run = a.run.resolve(ctx.cluster.device);
  ctx.run.lora = a.lora.resolve();
  lora_check_model(ctx.model, ctx.run.lora);
  ctx.constants = tuner::cost_defaults(ctx.cluster.device);
  if (!a.profile.empty()) {
    // A measured profile describes this machine with the dry-run's ranks per
    // node; the threads it was measured with are its own (a dry-run runs none).
    const auto p = tuner::profile_load(a.profile);
    const auto here = tuner::machine_fingerprint(ctx.cluster.device, std::min(ctx.cluster.gpus, ctx.cluster.gpus_per_node),
                                                 p.fingerprint.value("threads", int64_t{0}));
    tuner::profile_use(p, a.profile, here, ctx.cluster, ctx.constants);
  }
  ctx.memory.margin = a.margin;
  // The space's pins, and an MoE model's capacity factors where several are
  // listed (the model drops at the first until a layout names its own).
  tuner::SpaceLimits limits = a.space.resolve();
  if (const auto caps = a.model.capacity_factors(); caps.size() > 1) {
    if (!a.layout.empty())
      throw InputError(fmt::format("--layout evaluates one layout at one capacity factor; --moe-capacity-factor "
                                   "lists {} (give one, or cap:F in the layout)",
                                   caps.size()));
    limits.capacity = caps;
  }
  cli::require_fp8_device(limits, ctx.cluster.device);

  const int64_t top = a.all ? std::numeric_limits<int64_t>::max() : a.top;
  const auto no_layout = [&] {
    // Only folded grids asked for (--ep-fold on): the fold's own rules first.
    const bool only_folded = !limits.ep_fold.empty() &&
                             std::find(limits.ep_fold.begin(), limits.ep_fold.end(), false) == limits.ep_fold.end();
    const bool tp_one = !limits.tp.empty() &&
                        std::all_of(limits.tp.begin(), limits.tp.end(), [](int64_t t) { return t <= 1; });
    if (only_folded && !ctx.model.moe.enabled())
      return InputError(fmt::format("--ep-fold on folds an MoE model's ep group over the tp ranks, but {} is dense; "
                                    "drop --ep-fold",
                                    ctx.model.name));
    if (only_folded && tp_one)
      return InputError(fmt::format("--ep-fold on folds the ep group over the tp ranks, so it needs tp above 1 "
                                    "(with sp and an expert tp degree of 1), but --tp pins {}; pin a larger --tp or "
                                    "drop --ep-fold",
                                    fmt::join(limits.tp, ",")));
    return InputError(fmt::format(
        "no layout of {} on {} devices matches: tp, cp and pp must divide the device count, and the "
        "global batch {} must be divisible by mb*dp; relax the pinned knobs or change --gpus / "
        "--global-batch",
        ctx.model.name, ctx.cluster.gpus, ctx.run.global_batch));
  };
  tuner::SpaceReport report;
  // A space too large to hold as candidates is ranked in a few bytes a
  // layout (tuner::space_scan) and its rows predicted again as they are
  // written: the CSV streams every one; other formats list at most
  // kRowsInMemory rows, and more is refused here, before any work.
  std::optional<tuner::SpaceScan> scan;
  bool stream_csv = false;
  if (a.layout.empty() && !a.all && !a.exhaustive && format != report::ReportFormat::html) {
    // The listed rows only: the search predicts what its bounds cannot rule out.
    report = tuner::search(ctx, limits, top, ctx.cluster);
    if (report.evaluated == 0) throw no_layout();
  } else if (a.layout.empty()) {
    const int64_t size = tuner::space_size(ctx, limits, ctx.cluster);
    if (size == 0) throw no_layout();
    const bool whole = a.all || format == report::ReportFormat::html;
    const int64_t listed = whole ? size : std::min(top, size);
    const bool html = format == report::ReportFormat::html;
    if (html && size > kPageLayouts)
      throw InputError(fmt::format("the space holds {} layouts, and the page plots every one, past the {} it is "
                                   "built for in bounded memory; pin knobs to shrink the space (--tp, --pp, --mb, "
                                   "...), or use --format csv, which streams every row",
                                   size, kPageLayouts));
    if (!html && format != report::ReportFormat::csv && listed > kRowsInMemory)
      throw InputError(fmt::format("the space holds {} layouts, and --all would list every one as {}, past the {} rows "
                                   "that format is built in memory for; give --top N (at most {}), pin knobs to "
                                   "shrink the space, or use --format csv, which streams every row",
                                   size, a.format, kRowsInMemory, kRowsInMemory));
    if (size <= kRowsInMemory) {
      report = tuner::evaluate(ctx.model, ctx.run, ctx.cluster,
                               tuner::enumerate(ctx.model, ctx.run, ctx.cluster.gpus, limits,
                                                ctx.cluster),
                               ctx.constants, ctx.memory);
    } else {
      scan = tuner::space_scan(ctx, limits, ctx.cluster, html);
      report = scan->summary;
      stream_csv = format == report::ReportFormat::csv && listed > kRowsInMemory;
      // The rows held: those listed, or (streamed, or the page's table)
      // enough for the checks and the recipe below.
      const int64_t held = std::min<int64_t>(stream_csv || html ? 1000 : listed, scan->size());
      report.candidates.reserve(size_t(held));
      for (int64_t i = 0; i < held; ++i) report.candidates.push_back(scan->candidate(ctx, i));
    }
  } else {
    Layout l = Layout::parse(a.layout);
    cli::layout_capacity(a.model, "--layout " + a.layout, l, ctx.model);
    l.validate(ctx.model, ctx.run, ctx.cluster.gpus);
    report = tuner::evaluate(ctx.model, ctx.run, ctx.cluster, {l}, ctx.constants, ctx.memory);
  }
  if (report.fitting == 0 && !report.candidates.empty() &&
      report.candidates.front().verdict == tuner::Verdict::invalid) {
    // Nothing even valid: a user error, reported with the distinct rules broken.
    std::vector<std::string> why;
    for (const auto& c : report.candidates)
      if (std::find(why.begin(), why.end(), c.reason) == why.end() && why.size() < 3)
        why.push_back(c.reason);
    throw InputError(fmt::format("none of the {} layouts is valid for {} on {} devices: {}",
                                 report.evaluated, ctx.model.name, ctx.cluster.gpus,
                                 fmt::join(why, "; ")));
  }
  // Per-stage detail for the best layout (the sweep evaluates first and last).
  if (!report.candidates.empty() && report.candidates.front().verdict == tuner::Verdict::fits) {
    auto& best = report.candidates.front();
    memory::MemoryOptions all = ctx.memory;
    all.all_stages = true;
    best.memory = memory::estimate(model_for(ctx.model, best.layout), ctx.run, best.layout, ctx.cluster.device, all);
  }
  if (!a.save_recipe.empty()) {
    if (report.fitting == 0)
      throw InputError(fmt::format("no layout fits, so there is no recipe to save to '{}'", a.save_recipe));
    // The best layout the trainer can run: a recipe is for training. Where
    // every listed one cannot run yet, the search lists every fitting layout.
    const auto first_runnable = [&](tuner::SpaceReport& rep, std::string& skipped) -> tuner::Candidate* {
      for (auto& c : rep.candidates) {
        if (c.verdict != tuner::Verdict::fits) break;
        try {
          trainer::check_trainable(ctx.model, c.layout, ctx.cluster.device.kind, trainer::Trainable::anywhere,
                                   ctx.run.seq);
          return &c;
        } catch (const LayoutError& e) {
          if (skipped.empty()) skipped = e.what();
        }
      }
      return nullptr;
    };
    std::string skipped;
    tuner::Candidate* runnable = first_runnable(report, skipped);
    if (runnable == nullptr && int64_t(report.candidates.size()) < report.fitting && a.layout.empty()) {
      report = tuner::search(ctx, limits, report.fitting, ctx.cluster);
      runnable = first_runnable(report, skipped);
    }
    if (runnable == nullptr)
      throw InputError(fmt::format("none of the {} layouts that fit can be trained yet ({}), so there is no "
                                   "recipe to save to '{}'",
                                   report.fitting, skipped, a.save_recipe));
    if (runnable != &report.candidates.front())
      std::fprintf(stderr, "weft: the best-ranked layout cannot be trained yet (%s); the recipe takes the best that "
                           "can\n",
                   skipped.c_str());
    {
      memory::MemoryOptions all = ctx.memory;
      all.all_stages = true;
      runnable->memory =
          memory::estimate(model_for(ctx.model, runnable->layout), ctx.run, runnable->layout, ctx.cluster.device, all);
    }
    const auto& best = *runnable;
    tuner::Recipe r = tuner::recipe_for(model_for(ctx.model, best.layout), ctx.cluster, ctx.run, best.layout, "dry-run");
    r.predicted = {{"step_s", best.cost.step}, {"tokens_per_s", best.cost.tokens_per_second},
                   {"mfu", best.cost.mfu}, {"peak_flops", best.cost.peak_flops},
                   {"peak_bytes", best.memory.peak()}};
    r.tuning = {{"evaluated", report.evaluated}, {"visited", report.visited}, {"fitting", report.fitting},
                {"pruned", report.pruned}};
    tuner::recipe_save(a.save_recipe, r);
    std::fprintf(stderr, "weft: saved recipe %s (%s)\n", a.save_recipe.c_str(), best.layout.to_string().c_str());
  }
  if (stream_csv) {
    write_streamed_csv(*scan, ctx, a.out);
    return 0;
  }
  std::string text = scan && format == report::ReportFormat::html
                         ? report::report_html(report::report_data_scan(*scan, report, ctx, top))
                         : report::report_render(format, report, ctx, top);
  if (ctx.run.lora.enabled() && (format == report::ReportFormat::table || format == report::ReportFormat::md))
    text += full_fine_tuning_note(ctx, limits, report);
  // Where the best layout runs FP8, the GEMMs it leaves in bf16, and why.
  if ((format == report::ReportFormat::table || format == report::ReportFormat::md) && !report.candidates.empty())
    if (const std::string bf16 = memory::fp8_bf16_gemms_text(ctx.model, ctx.run, report.candidates.front().layout);
        !bf16.empty())
      text += fmt::format("\nFP8 GEMMs of the best layout ({}): {}\n",
                          gemm_precision_text(report.candidates.front().layout), bf16);
  if (a.out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    file_write_atomic(a.out, text);
    std::fprintf(stderr, "weft: wrote %s (%lld layouts)\n", a.out.c_str(),
                 static_cast<long long>(report.evaluated));
  }
  return 0;
}

}  // namespace

Command add_tune_command(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  auto* sub = app.add_subcommand("tune", "Rank parallel layouts for a model on a cluster");
  add_model_options(*sub, args->model);
  add_cluster_options(*sub, args->cluster);
  add_run_options(*sub, args->run);
  add_lora_options(*sub, args->lora);
  add_space_options(*sub, args->space);
  sub->add_flag("--dry-run", args->dry_run,
                "Evaluate with the memory and cost models only (no devices needed)");
  sub->add_option("--format", args->format, "Output: table, json, csv, md, or html (a page with plots of every layout; see weft report)")
      ->capture_default_str();
  args->out_option = sub->add_option("--out", args->out, "Write the report to this file instead of stdout (a new file, or "
                                     "a report of weft's written earlier)");
  sub->add_option("--layout", args->layout,
                  "Evaluate this one layout (canonical text form) instead of the space")
      ->check(non_empty());
  args->save_recipe_option = sub->add_option("--save-recipe", args->save_recipe,
                                             "Save the best layout as a recipe file (a new file, or a recipe written "
                                             "earlier)");
  sub->add_option("--top", args->top, "Layouts listed, in every format (fitting ones by rank first)")
      ->capture_default_str();
  sub->add_flag("--all", args->all, "List every layout evaluated (overrides --top; predicts every layout)");
  sub->add_flag("--exhaustive", args->exhaustive,
                "Predict every layout of the space instead of searching it with bounds (the same rows; "
                "slower on large spaces)");
  sub->add_option("--profile", args->profile,
                  "Device profile (weft calibrate) whose measured rates and constants price the layouts");
  sub->add_option("--margin", args->margin,
                  "Fraction of device memory kept free for fragmentation")
      ->capture_default_str();
  return {sub, [args] { return run_tune(*args); }};
}

}  // namespace weft::cli
