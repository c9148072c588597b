// Self-contained HTML reports people can open in a browser: a dry-run's
// layout space, a tuning's trials, a training run's curves and memory.
//
// A page embeds the data it plots as JSON in
// <script type="application/json" id="weft-data"> and a small inline script
// draws SVG from that same block, so what a test reads back is what the
// reader sees. Nothing is fetched: no network, no fonts, no libraries.
// The data is built here (report_data_*) and the page around it in
// html_page.cpp; the numbers are copied from the source JSON, never
// recomputed, so they compare exactly.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "report/report.h"
#include "tuner/space_scan.h"

namespace weft::report {

// Above this many layouts with a prediction, a dry-run page keeps the top
// layouts and the fitting memory/MFU Pareto front exact and bins the rest.
inline constexpr size_t kReportExactPoints = 4000;
// Above this many train records, a run page keeps every k-th (and the last).
inline constexpr size_t kReportTrainRecords = 20000;

// The plotted data of a dry-run from its JSON report (report_json, e.g.
// `weft tune --dry-run --format json`): points (layout, verdict, prune class,
// MFU, peak bytes, step), bins of the points not kept exact, the top layouts'
// step breakdown and the best layout's memory per stage.
nlohmann::json report_data_dry_run(const nlohmann::json& dry_run);
// The same straight from an evaluated space (weft tune --dry-run --format
// html), without the JSON of every layout in between; the `top` fitting
// layouts (at most 1000) are listed with their step breakdown.
nlohmann::json report_data_space(const tuner::SpaceReport& r, const tuner::SpaceContext& ctx, int64_t top = 10);
// The same page data for a space ranked by tuner::space_scan with points:
// `head_rows` holds the first rows as candidates (the page's table and best
// layout), the scan every layout's point.
nlohmann::json report_data_scan(const tuner::SpaceScan& scan, const tuner::SpaceReport& head_rows,
                                const tuner::SpaceContext& ctx, int64_t top = 10);
// A tuning's data from its tuning.json (tune_report_json): copied as it is,
// with the trials' start times added for the timeline.
nlohmann::json report_data_tuning(const nlohmann::json& tuning);
// A run folder's data: metrics.jsonl (old records without "kind" too; several
// run headers when resumed), memory/rank*.json, and tuning.json / recipe.json
// when the folder has them.
nlohmann::json report_data_run(const std::string& run_dir);

// The page for data from one of the report_data_* functions.
std::string report_html(const nlohmann::json& data);

// `weft report PATH`: a run folder, a tuning.json or a dry-run JSON report.
// InputError naming the path and what is valid for anything else.
std::string report_html_for(const std::string& path);

// Writes <run_dir>/report.html for the run in that folder and returns its
// path (the end of `weft train`, interrupted or not).
std::string report_write_run(const std::string& run_dir);

}  // namespace weft::report
