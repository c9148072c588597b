// Dry-run reports of an evaluated layout space: a terminal table, and every
// layout (fitting or not) as JSON, CSV or Markdown for scripts and docs, and
// as an HTML page with plots for people.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tuner/space.h"

namespace weft::report {

enum class ReportFormat { table, json, csv, md, html };
ReportFormat report_format_parse(const std::string& s);

// The first `top` layouts of the ranking, the same ones in the same order
// in every format: fitting ones by rank, then (when fewer fit) those pruned.
// The table notes the listed layouts predicted alike but for the attention
// kind ("as #1 but attn") and marks with * those the trainer cannot run yet;
// it adds the rule behind the order, the pruning summary and the best
// layout's memory and time breakdown (or, when nothing fits, the layout
// nearest to fitting).
std::string report_table(const tuner::SpaceReport& r, const tuner::SpaceContext& ctx, int64_t top);
// The same layouts with their verdict, memory, predictions and pruning
// reason; every layout with top = the count (`--all`).
nlohmann::json report_json(const tuner::SpaceReport& r, const tuner::SpaceContext& ctx, int64_t top);
std::string report_csv(const tuner::SpaceReport& r, const tuner::SpaceContext& ctx, int64_t top);
// The CSV's header line and one row (rank 0: not fitting), for writing a
// listing of millions of rows as it is made.
std::string report_csv_header();
std::string report_csv_row(const tuner::Candidate& c, int64_t rank, const tuner::SpaceContext& ctx);
std::string report_md(const tuner::SpaceReport& r, const tuner::SpaceContext& ctx, int64_t top);

// html: the page of report/html_report.h over every layout evaluated (its
// plots need the whole space; `top` does not apply).
std::string report_render(ReportFormat f, const tuner::SpaceReport& r, const tuner::SpaceContext& ctx,
                          int64_t top);

}  // namespace weft::report
