// `weft report PATH`: one self-contained HTML page for a run folder, a
// tuning.json or a dry-run JSON report (report/html_report.h).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/json_io.h"
#include "core/output_guard.h"
#include "report/html_report.h"

namespace weft::cli {

namespace {

struct ReportArgs {
  std::string input;
  std::string out;
  CLI::Option* out_option = nullptr;
};

int run_report(const ReportArgs& a) {
  namespace fs = std::filesystem;
  // A run folder's page goes beside its metrics unless told otherwise; a
  // JSON file's goes next to it with .html in place of .json.
  std::string out = a.out;
  const fs::path in(a.input);
  if (out.empty() && a.out_option->count() == 0)
    out = fs::is_directory(in) ? (in / "report.html").string() : fs::path(in).replace_extension(".html").string();
  // Checked before reading: the page may replace only an earlier page, never
  // the input, nor a run folder's metrics, checkpoints or recipe.
  if (out != "-") {
    std::vector<std::string> inputs;
    if (fs::is_directory(in)) {
      for (const char* f : {"metrics.jsonl", "memory", "checkpoints", "tuning", "tuning.json", "tuning.md",
                            "recipe.json", "tensorboard"})
        inputs.push_back((in / f).string());
    } else {
      inputs.push_back(a.input);
    }
    output_check(out, OutputKind::html_report, inputs, "--out");
  }
  const std::string html = report::report_html_for(a.input);
  if (out == "-") {
    std::fwrite(html.data(), 1, html.size(), stdout);
    return 0;
  }
  file_write_atomic(out, html);
  std::fprintf(stderr, "weft: wrote %s (%.1f KB); open it in a browser\n", out.c_str(), double(html.size()) / 1e3);
  return 0;
}

}  // namespace

void write_run_report(const std::string& out_dir, std::FILE* log) {
  try {
    fmt::print(log, "report {}\n", report::report_write_run(out_dir));
  } catch (const std::exception& e) {
    fmt::print(log, "warning: no report.html in {}: {}\n", out_dir, e.what());
  }
  std::fflush(log);
}

Command add_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  auto* sub = app.add_subcommand("report", "Write a self-contained HTML report with plots of a run folder, a "
                                           "tuning.json or a dry-run JSON report");
  sub->add_option("input", a->input,
                  "A run folder (metrics.jsonl, memory/), a tuning.json (weft train --auto) or a dry-run JSON "
                  "report (weft tune --dry-run --format json --all)")
      ->required();
  a->out_option = sub->add_option("--out", a->out,
                                  "The HTML file to write, new or an earlier report; - for stdout (default: "
                                  "report.html in a run folder, else the input with .html for .json)");
  return {sub, [a] { return run_report(*a); }};
}

}  // namespace weft::cli
