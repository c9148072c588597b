// The data an HTML report plots, built from the JSON files weft writes. Values
// are copied from the source, never recomputed, so a test (or a reader with
// the page's source open) can compare them exactly.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <functional>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "memory/shapes.h"
#include "report/html_report.h"
#include "report/report_fields.h"

namespace weft::report {

using namespace weft::tuner;  // the spaces, trials and contexts a report describes

namespace {

using nlohmann::json;

// Bins per axis of the density grid that stands in for the points a large
// dry-run does not keep exact: fine enough to show the cloud's shape at the
// plot's 1000-pixel width, small enough that the page stays a few hundred KB.
constexpr int kBinsX = 160, kBinsY = 100;
// Fitting layouts kept exact by rank, whatever the space's size.
constexpr size_t kTopExact = 200;
// Fitting layouts listed in the page's table at most (--top asks for how
// many; --all asks for every one, which no page table can hold).
constexpr size_t kTopListed = 1000;

double num(const json& j, const char* key) { return field_number(j, key); }

json categories() {
  json c = json::array();
  for (auto cat : memory::kAllCategories) c.push_back(memory::to_string(cat));
  return c;
}

// One layout with a prediction, as plotted. Its text is fetched only for the
// points kept exact (formatting 400k layouts costs more than the rest).
struct Point {
  const char* verdict = "";  // a verdict's name (static, or held by the Collector)
  int cls = 0;  // index into the page's classes
  double mfu = 0, step_s = 0;
  int64_t peak = 0;
  int64_t rank = 0;  // 0: not fitting
  size_t source = 0;  // for layout_of
};

// The fitting points on the memory/MFU Pareto front: none other reaches the
// same MFU with less memory.
std::vector<size_t> pareto(const std::vector<Point>& pts) {
  // Counted first: the space's millions of points leave no room for a
  // growing vector's spare half.
  std::vector<size_t> fit;
  fit.reserve(size_t(std::count_if(pts.begin(), pts.end(), [](const Point& p) { return p.rank > 0; })));
  for (size_t i = 0; i < pts.size(); ++i)
    if (pts[i].rank > 0) fit.push_back(i);
  std::sort(fit.begin(), fit.end(), [&](size_t a, size_t b) {
    return pts[a].peak != pts[b].peak ? pts[a].peak < pts[b].peak : pts[a].mfu > pts[b].mfu;
  });
  std::vector<size_t> front;
  double best = -1;
  for (size_t i : fit)
    if (pts[i].mfu > best) {
      best = pts[i].mfu;
      front.push_back(i);
    }
  return front;
}

// Collects points and their classes ("fits" first, then prune classes as met).
struct Collector {
  std::vector<Point> pts;
  json classes = json::array({"fits"});
  std::map<std::string, int> class_of{{"fits", 0}};
  std::set<std::string> verdicts;  // names read from a file, held for the points
  const char* verdict_name(const std::string& v) { return verdicts.insert(v).first->c_str(); }
  int class_index(const std::string& cls) {
    const auto [it, added] = class_of.emplace(cls, int(classes.size()));
    if (added) classes.push_back(cls);
    return it->second;
  }
};

// The page's data from the header (a dry-run JSON report whose first rows
// are the top-ranked layouts) and the points.
json dry_run_data(const json& head, Collector c, int64_t invalid, double usable, double peak_flops,
                  const std::function<std::string(size_t)>& layout_of) {
  json d{{"kind", "dry-run"}};
  const json& model_name = field_at(head, "/model/name"_json_pointer);
  const json& device_name = field_at(head, "/cluster/device/name"_json_pointer);
  const json& world = field_at(head, "/cluster/gpus"_json_pointer);
  const std::string model = model_name.is_string() ? model_name.get<std::string>() : "?";
  const std::string device = device_name.is_string() ? device_name.get<std::string>() : "?";
  const int64_t gpus = world.is_number_integer() ? world.get<int64_t>() : 0;
  d["title"] = fmt::format("weft dry-run: {} on {} x {}", model, gpus, device);
  for (const char* k : {"model", "run", "cluster", "memory_margin", "evaluated", "fitting", "pruned", "trainable_params"})
    if (head.contains(k)) d[k] = head[k];
  d["listed"] = int64_t(c.pts.size()) + invalid;
  d["categories"] = categories();
  d["classes"] = c.classes;
  d["invalid"] = invalid;
  d["usable_bytes"] = usable;
  const json& capacity = field_at(head, "/cluster/device/memory_bytes"_json_pointer);
  d["capacity_bytes"] = capacity.is_number() ? capacity.get<double>() : 0.0;
  d["peak_flops"] = peak_flops;

  // Small spaces: every point exact. Large ones: the Pareto front, the top
  // ranks and an even sample exact, the rest as counts on a grid.
  auto& pts = c.pts;
  std::vector<bool> exact(pts.size(), pts.size() <= kReportExactPoints);
  if (pts.size() > kReportExactPoints) {
    for (size_t i : pareto(pts)) exact[i] = true;
    for (size_t i = 0; i < pts.size(); ++i)
      if (pts[i].rank > 0 && pts[i].rank <= int64_t(kTopExact)) exact[i] = true;
    const size_t kept = size_t(std::count(exact.begin(), exact.end(), true));
    const size_t room = kReportExactPoints > kept ? kReportExactPoints - kept : 0;
    const double stride = double(pts.size()) / double(std::max<size_t>(room, 1));
    for (double x = 0; room > 0 && x < double(pts.size()); x += stride) exact[size_t(x)] = true;
  }
  double max_mem = usable, max_mfu = 0;
  for (const auto& p : pts) {
    max_mem = std::max(max_mem, double(p.peak));
    max_mfu = std::max(max_mfu, p.mfu);
  }
  // The page plots memory up to 3x the usable memory; binned layouts beyond
  // that share one overflow column (x index kBinsX) that it counts, not draws.
  const double x_end = usable > 0 ? std::min(max_mem, 3 * usable) : max_mem;
  const double dx = std::max(x_end, 1.0) / kBinsX, dy = std::max(max_mfu, 1e-9) / kBinsY;
  std::map<std::tuple<int, int, int>, int64_t> cells;
  json points = json::array();
  for (size_t i = 0; i < pts.size(); ++i) {
    const Point& p = pts[i];
    if (exact[i]) {
      json pt{{"layout", layout_of(p.source)}, {"verdict", p.verdict}, {"class", p.cls},
              {"mfu", p.mfu}, {"step_s", p.step_s}, {"peak_bytes", p.peak}};
      if (p.rank > 0) pt["rank"] = p.rank;
      points.push_back(std::move(pt));
      continue;
    }
    const int xi = std::min(kBinsX, int(double(p.peak) / dx));
    const int yi = std::min(kBinsY - 1, int(p.mfu / dy));
    ++cells[{p.cls, xi, yi}];
  }
  d["points"] = std::move(points);
  json bins{{"x_step_bytes", dx}, {"y_step_mfu", dy}, {"x_bins", kBinsX}, {"cells", json::array()}};
  int64_t binned = 0;
  for (const auto& [k, n] : cells) {
    bins["cells"].push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k), n});
    binned += n;
  }
  d["bins"] = std::move(bins);
  d["binned"] = binned;

  // The top layouts' step time by part (the page draws the first few and
  // lists them all), and the best one's memory by stage.
  json top = json::array();
  for (const auto& row : field_of(head, "layouts")) {
    if (top.size() >= kTopListed || field_text(row, "verdict") != "fits") break;
    json t{{"layout", field_text(row, "layout")},
           {"gemm_precision", field_text(row, "gemm_precision", "bf16")},
           {"rank", field_whole(row, "rank")},
           {"cannot_run_yet", field_text(row, "cannot_run_yet", "")}};
    for (const char* k : {"compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_bubble_s", "pp_p2p_s",
                          "dp_comm_s", "optimizer_s", "step_s", "mfu", "tokens_per_s"})
      t[k] = field_number(field_of(row, "prediction"), k);
    t["peak_bytes"] = field_whole(row, "memory_peak_bytes");
    if (top.empty()) {
      const json& stages = field_of(row, "memory_stages");
      d["best"] = {{"layout", field_text(row, "layout")}, {"stages", stages.is_array() ? stages : json::array()}};
    }
    top.push_back(std::move(t));
  }
  d["top"] = std::move(top);
  return d;
}

}  // namespace

json report_data_dry_run(const json& src) {
  if (!src.is_object() || !src.contains("layouts") || !src["layouts"].is_array())
    throw InputError("dry-run report: expected the JSON of weft tune --dry-run --format json (a \"layouts\" list)");
  // Every layout with a prediction is a point; invalid ones have none.
  Collector c;
  int64_t invalid = 0;
  double usable = 0, peak_flops = 0;
  const auto& rows = src["layouts"];
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    if (!field_of(row, "prediction").is_object()) {
      ++invalid;
      continue;
    }
    Point p;
    p.verdict = c.verdict_name(field_text(row, "verdict"));
    p.cls = c.class_index(std::string(p.verdict) == "fits" ? "fits" : field_text(row, "prune_class", p.verdict));
    p.mfu = num(row["prediction"], "mfu");
    p.step_s = num(row["prediction"], "step_s");
    p.peak = field_whole(row, "memory_peak_bytes");
    p.rank = field_whole(row, "rank");
    p.source = i;
    if (usable == 0) usable = num(row, "memory_usable_bytes");
    if (peak_flops == 0) peak_flops = num(row["prediction"], "peak_flops");
    c.pts.push_back(std::move(p));
  }
  return dry_run_data(src, std::move(c), invalid, usable, peak_flops,
                      [&](size_t i) { return field_text(rows[i], "layout"); });
}

json report_data_space(const SpaceReport& r, const SpaceContext& ctx, int64_t top) {
  // The header and the top rows as the JSON report has them; the points
  // straight from the candidates, with the same values report_json writes.
  const json head = report_json(r, ctx, std::clamp<int64_t>(top, 1, int64_t(kTopListed)));
  Collector c;
  int64_t invalid = 0, rank = 0;
  double usable = 0, peak_flops = 0;
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const Candidate& cand = r.candidates[i];
    if (cand.verdict == Verdict::fits) ++rank;
    if (cand.verdict == Verdict::invalid) {
      ++invalid;
      continue;
    }
    Point p;
    p.verdict = to_string(cand.verdict);
    p.cls = c.class_index(cand.verdict == Verdict::fits ? "fits" : cand.prune_class.empty() ? p.verdict : cand.prune_class);
    p.mfu = cand.cost.mfu;
    p.step_s = cand.cost.step;
    p.peak = cand.memory.peak();
    p.rank = cand.verdict == Verdict::fits ? rank : 0;
    p.source = i;
    if (usable == 0) usable = double(cand.memory.usable);
    if (peak_flops == 0) peak_flops = cand.cost.peak_flops;
    c.pts.push_back(std::move(p));
  }
  return dry_run_data(head, std::move(c), invalid, usable, peak_flops,
                      [&](size_t i) { return r.candidates[i].layout.to_string(); });
}

json report_data_scan(const SpaceScan& scan, const SpaceReport& head_rows, const SpaceContext& ctx, int64_t top) {
  // The header and the top rows from the rows held; the points from the
  // scan's compact values, the same numbers evaluate() gives (as floats).
  const json head = report_json(head_rows, ctx, std::clamp<int64_t>(top, 1, int64_t(kTopListed)));
  Collector c;
  for (size_t k = 1; k < scan.classes.size(); ++k) c.class_index(scan.classes[k]);
  int64_t invalid = 0, rank = 0;
  double usable = 0, peak_flops = 0;
  c.pts.reserve(scan.points.size());
  for (size_t i = 0; i < scan.points.size(); ++i) {
    const SpaceScan::Point& s = scan.points[i];
    const Verdict v = Verdict(s.verdict);
    if (v == Verdict::fits) ++rank;
    if (v == Verdict::invalid) {
      ++invalid;
      continue;
    }
    Point p;
    p.verdict = to_string(v);
    p.cls = c.class_index(scan.classes[s.cls]);
    p.mfu = s.mfu;
    p.step_s = s.step;
    p.peak = s.peak;
    p.rank = v == Verdict::fits ? rank : 0;
    p.source = i;
    c.pts.push_back(p);
  }
  for (const Candidate& first : head_rows.candidates) {
    if (first.verdict == Verdict::invalid) continue;
    usable = double(first.memory.usable);
    peak_flops = first.cost.peak_flops;
    break;
  }
  return dry_run_data(head, std::move(c), invalid, usable, peak_flops,
                      [&](size_t i) { return scan.layout_at(int64_t(scan.order[i])).to_string(); });
}

json report_data_tuning(const json& src) {
  if (!src.is_object() || !src.contains("trials") || !src["trials"].is_array())
    throw InputError("tuning report: expected the tuning.json of weft train --auto (a \"trials\" list)");
  json d = src;
  d["kind"] = "tuning";
  d["title"] = fmt::format("weft tuning: {} on {} x {}", field_text(src, "model", "?"), field_whole(src, "world"),
                           field_text(src, "device", "?"));
  // Trials this tuning ran carry their start (start_s); trials read from an
  // earlier run's journal have none and stay off the timeline. A tuning.json
  // from before start times were recorded has none at all: its trials are
  // drawn back to back, and the page says the times are estimated.
  bool any_start = false;
  for (const auto& trial : d["trials"])
    any_start = any_start || (trial.is_object() && trial.contains("start_s") && trial["start_s"].is_number());
  double t = 0;
  for (auto& trial : d["trials"]) {
    if (!trial.is_object()) continue;
    if (!any_start) {
      trial["start_s"] = t;
      t += num(trial, "seconds");
    } else if (!trial.contains("start_s") || !trial["start_s"].is_number()) {
      trial["on_timeline"] = false;
    }
  }
  d["timeline_estimated"] = !any_start;
  return d;
}

}  // namespace weft::report
