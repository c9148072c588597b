// Dry-run reports of an evaluated layout space: a terminal table, and every
// layout (fitting or not) as JSON, CSV or Markdown for scripts and docs.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tuner/space.h"

namespace weft::tuner {

struct ReportContext {
  ModelSpec model;
  RunSpec run;
  ClusterSpec cluster;
  CostConstants constants;
  memory::MemoryOptions memory;
};

enum class ReportFormat { table, json, csv, md };
ReportFormat report_format_parse(const std::string& s);

// The top `top` fitting layouts, the pruning summary and the best layout's
// memory and time breakdown.
std::string report_table(const SpaceReport& r, const ReportContext& ctx, int64_t top);
// Every layout with its verdict, memory, predictions and pruning reason.
nlohmann::json report_json(const SpaceReport& r, const ReportContext& ctx);
std::string report_csv(const SpaceReport& r, const ReportContext& ctx);
std::string report_md(const SpaceReport& r, const ReportContext& ctx, int64_t top);

std::string report_render(ReportFormat f, const SpaceReport& r, const ReportContext& ctx,
                          int64_t top);

}  // namespace weft::tuner
