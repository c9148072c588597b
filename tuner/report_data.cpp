// The data an HTML report plots, built from the JSON files weft writes. Values
// are copied from the source, never recomputed, so a test (or a reader with
// the page's source open) can compare them exactly.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "memory/shapes.h"
#include "tuner/html_report.h"

namespace weft::tuner {

namespace {

using nlohmann::json;

// Bins per axis of the density grid that stands in for the points a large
// dry-run does not keep exact: fine enough to show the cloud's shape at the
// plot's 1000-pixel width, small enough that the page stays a few hundred KB.
constexpr int kBinsX = 160, kBinsY = 100;
// Fitting layouts kept exact by rank, whatever the space's size.
constexpr size_t kTopExact = 200;
// Layouts whose step breakdown is drawn.
constexpr size_t kTopBreakdown = 10;

double num(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

json categories() {
  json c = json::array();
  for (auto cat : memory::kAllCategories) c.push_back(memory::to_string(cat));
  return c;
}

// The fitting points on the memory/MFU Pareto front: none other reaches the
// same MFU with less memory.
std::set<size_t> pareto(const std::vector<json>& pts) {
  std::vector<size_t> fit;
  for (size_t i = 0; i < pts.size(); ++i)
    if (pts[i]["verdict"] == "fits") fit.push_back(i);
  std::sort(fit.begin(), fit.end(), [&](size_t a, size_t b) {
    const double ma = num(pts[a], "peak_bytes"), mb = num(pts[b], "peak_bytes");
    return ma != mb ? ma < mb : num(pts[a], "mfu") > num(pts[b], "mfu");
  });
  std::set<size_t> front;
  double best = -1;
  for (size_t i : fit)
    if (num(pts[i], "mfu") > best) {
      best = num(pts[i], "mfu");
      front.insert(i);
    }
  return front;
}

}  // namespace

json report_data_dry_run(const json& src) {
  if (!src.is_object() || !src.contains("layouts") || !src["layouts"].is_array())
    throw InputError("dry-run report: expected the JSON of weft tune --dry-run --format json (a \"layouts\" list)");
  json d{{"kind", "dry-run"}};
  const std::string model = src.value("/model/name"_json_pointer, std::string("?"));
  const std::string device = src.value("/cluster/device/name"_json_pointer, std::string("?"));
  const int64_t gpus = src.value("/cluster/gpus"_json_pointer, int64_t{0});
  d["title"] = fmt::format("weft dry-run: {} on {} x {}", model, gpus, device);
  for (const char* k : {"model", "run", "cluster", "memory_margin", "evaluated", "fitting", "pruned", "listed"})
    if (src.contains(k)) d[k] = src[k];
  d["categories"] = categories();

  // Every layout with a prediction is a point; invalid ones have none.
  std::vector<json> pts;
  json classes = json::array({"fits"});
  std::map<std::string, int> class_of{{"fits", 0}};
  int64_t invalid = 0;
  double usable = 0, peak_flops = 0;
  for (const auto& row : src["layouts"]) {
    if (!row.contains("prediction")) {
      ++invalid;
      continue;
    }
    const std::string verdict = row.value("verdict", "");
    const std::string cls = verdict == "fits" ? "fits" : row.value("prune_class", verdict);
    if (!class_of.count(cls)) {
      class_of[cls] = int(classes.size());
      classes.push_back(cls);
    }
    const auto& p = row["prediction"];
    json pt{{"layout", row.value("layout", "")}, {"verdict", verdict}, {"class", class_of[cls]},
            {"mfu", p.value("mfu", 0.0)}, {"step_s", p.value("step_s", 0.0)},
            {"peak_bytes", row.value("memory_peak_bytes", int64_t{0})}};
    if (row.contains("rank")) pt["rank"] = row["rank"];
    if (usable == 0) usable = num(row, "memory_usable_bytes");
    if (peak_flops == 0) peak_flops = num(p, "peak_flops");
    pts.push_back(std::move(pt));
  }
  d["classes"] = classes;
  d["invalid"] = invalid;
  d["usable_bytes"] = usable;
  d["capacity_bytes"] = src.value("/cluster/device/memory_bytes"_json_pointer, 0.0);
  d["peak_flops"] = peak_flops;

  // Small spaces: every point exact. Large ones: the Pareto front, the top
  // ranks and an even sample exact, the rest as counts on a grid.
  std::vector<bool> exact(pts.size(), pts.size() <= kReportExactPoints);
  if (pts.size() > kReportExactPoints) {
    for (size_t i : pareto(pts)) exact[i] = true;
    for (size_t i = 0; i < pts.size(); ++i)
      if (pts[i].contains("rank") && pts[i]["rank"].get<int64_t>() <= int64_t(kTopExact)) exact[i] = true;
    const size_t kept = size_t(std::count(exact.begin(), exact.end(), true));
    const size_t room = kReportExactPoints > kept ? kReportExactPoints - kept : 0;
    const double stride = double(pts.size()) / double(std::max<size_t>(room, 1));
    for (double x = 0; room > 0 && x < double(pts.size()); x += stride) exact[size_t(x)] = true;
  }
  json points = json::array();
  double max_mem = usable, max_mfu = 0;
  for (const auto& p : pts) {
    max_mem = std::max(max_mem, num(p, "peak_bytes"));
    max_mfu = std::max(max_mfu, num(p, "mfu"));
  }
  // The page plots memory up to 3x the usable memory; binned layouts beyond
  // that share one overflow column (x index kBinsX) that it counts, not draws.
  const double x_end = usable > 0 ? std::min(max_mem, 3 * usable) : max_mem;
  const double dx = std::max(x_end, 1.0) / kBinsX, dy = std::max(max_mfu, 1e-9) / kBinsY;
  std::map<std::tuple<int, int, int>, int64_t> cells;
  for (size_t i = 0; i < pts.size(); ++i) {
    if (exact[i]) {
      points.push_back(std::move(pts[i]));
      continue;
    }
    const int xi = std::min(kBinsX, int(num(pts[i], "peak_bytes") / dx));
    const int yi = std::min(kBinsY - 1, int(num(pts[i], "mfu") / dy));
    ++cells[{pts[i]["class"].get<int>(), xi, yi}];
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

  // The top layouts' step time by part, and the best one's memory by stage.
  json top = json::array();
  for (const auto& row : src["layouts"]) {
    if (top.size() >= kTopBreakdown || row.value("verdict", "") != "fits") break;
    json t{{"layout", row["layout"]}, {"rank", row.value("rank", int64_t{0})}};
    for (const char* k : {"compute_s", "recompute_s", "tp_comm_s", "pp_bubble_s", "pp_p2p_s", "dp_comm_s",
                          "optimizer_s", "step_s", "mfu", "tokens_per_s"})
      t[k] = row["prediction"].value(k, 0.0);
    t["peak_bytes"] = row.value("memory_peak_bytes", int64_t{0});
    if (top.empty()) d["best"] = {{"layout", row["layout"]}, {"stages", row.value("memory_stages", json::array())}};
    top.push_back(std::move(t));
  }
  d["top"] = std::move(top);
  return d;
}

json report_data_tuning(const json& src) {
  if (!src.is_object() || !src.contains("trials") || !src["trials"].is_array())
    throw InputError("tuning report: expected the tuning.json of weft train --auto (a \"trials\" list)");
  json d = src;
  d["kind"] = "tuning";
  d["title"] = fmt::format("weft tuning: {} on {} x {}", src.value("model", "?"), src.value("world", int64_t{0}),
                           src.value("device", "?"));
  // Trials run one after another: each starts where the previous ended.
  double t = 0;
  for (auto& trial : d["trials"]) {
    trial["start_s"] = t;
    t += num(trial, "seconds");
  }
  return d;
}

}  // namespace weft::tuner
