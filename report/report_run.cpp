// A run folder as report data, and `weft report`'s choice of report kind.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "core/layout.h"
#include "memory/shapes.h"
#include "report/html_report.h"
#include "report/report_fields.h"

namespace weft::report {

using namespace weft::tuner;  // the spaces, trials and contexts a report describes

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const char* const kValid =
    "valid: a run folder (with metrics.jsonl), a tuning.json (weft train --auto) or a dry-run JSON report "
    "(weft tune --dry-run --format json)";

// A record's kind: its "kind", or for files written before records had one,
// what its fields say (a record with "loss" is a train step, with "val_loss" a
// validation).
std::string kind_of(const json& r) {
  if (r.contains("kind") && r["kind"].is_string()) return r["kind"].get<std::string>();
  if (r.contains("loss")) return "train";
  if (r.contains("val_loss")) return "val";
  return "";
}

// Records keyed by step: a resumed run may log a step again, and the later
// record is the one the run continued from.
json by_step(const std::map<int64_t, json>& m) {
  json a = json::array();
  for (const auto& [step, r] : m) a.push_back(r);
  return a;
}

}  // namespace

json report_data_run(const std::string& dir) {
  const fs::path root(dir);
  json d{{"kind", "run"}, {"dir", dir}};
  std::map<int64_t, json> train, val;
  json headers = json::array(), ends = json::array(), resumes = json::array();
  int64_t unreadable = 0;
  bool want_resume_step = false;
  std::ifstream in(root / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json r;
    try {
      r = json::parse(line);
    } catch (const json::parse_error&) {
      ++unreadable;  // e.g. the last line of a run killed mid-write
      continue;
    }
    if (!r.is_object()) {
      ++unreadable;
      continue;
    }
    const std::string kind = kind_of(r);
    if (kind == "run") {
      want_resume_step = !headers.empty() || !train.empty();
      headers.push_back(r);
    } else if (kind == "end") {
      ends.push_back(r);
    } else if ((kind == "train" || kind == "val") && r.contains("step") && r["step"].is_number()) {
      const int64_t step = r["step"].get<int64_t>();
      if (kind == "train" && want_resume_step) {
        resumes.push_back(step);
        want_resume_step = false;
      }
      (kind == "train" ? train : val)[step] = r;
    }
  }
  json t = by_step(train);
  d["train_records"] = t.size();
  // An MoE run's expert loads: each record's since the one before, summed
  // over the run (records of a layer set other than the newest's are not
  // added: a different model), and under a capacity each layer's dropped
  // choices.
  json load;
  for (const auto& r : t) {
    if (!r.contains("expert_load") || !r["expert_load"].is_object()) continue;
    const json& e = r["expert_load"];
    if (!e.contains("layers") || !e.contains("counts") || !e["counts"].is_array()) continue;
    if (load.is_null() || load["layers"] != e["layers"] || load["counts"].size() != e["counts"].size()) {
      load = e;
      continue;
    }
    for (size_t i = 0; i < e["counts"].size(); ++i) {
      json& row = load["counts"][i];
      const json& add = e["counts"][i];
      if (!row.is_array() || !add.is_array() || row.size() != add.size()) continue;
      for (size_t j = 0; j < row.size(); ++j)
        if (row[j].is_number_integer() && add[j].is_number_integer())
          row[j] = row[j].get<int64_t>() + add[j].get<int64_t>();
    }
    if (e.contains("dropped") && e["dropped"].is_array() && load.contains("dropped") && load["dropped"].is_array() &&
        load["dropped"].size() == e["dropped"].size())
      for (size_t i = 0; i < e["dropped"].size(); ++i)
        if (load["dropped"][i].is_number_integer() && e["dropped"][i].is_number_integer())
          load["dropped"][i] = load["dropped"][i].get<int64_t>() + e["dropped"][i].get<int64_t>();
  }
  if (!load.is_null()) d["expert_load"] = std::move(load);
  if (t.size() > kReportTrainRecords) {
    // Every k-th record and the last: the curve's shape at a page's width.
    const size_t k = (t.size() + kReportTrainRecords - 1) / kReportTrainRecords;
    json kept = json::array();
    for (size_t i = 0; i < t.size(); ++i)
      if (i % k == 0 || i + 1 == t.size()) kept.push_back(t[i]);
    t = std::move(kept);
    d["train_stride"] = k;
  }
  d["train"] = std::move(t);
  d["val"] = by_step(val);
  d["headers"] = std::move(headers);
  d["ends"] = std::move(ends);
  d["resumes"] = std::move(resumes);
  d["unreadable_lines"] = unreadable;

  json cats = json::array();
  for (auto cat : memory::kAllCategories) cats.push_back(memory::to_string(cat));
  d["categories"] = cats;
  std::vector<std::pair<int64_t, json>> ranks;
  std::error_code ec;
  if (fs::is_directory(root / "memory", ec))
    for (const auto& e : fs::directory_iterator(root / "memory", ec)) {
      const std::string name = e.path().filename().string();
      if (!name.starts_with("rank") || e.path().extension() != ".json") continue;
      try {
        json m = json_read_file(e.path().string(), "memory record");
        ranks.emplace_back(field_whole(m, "rank"), std::move(m));
      } catch (const InputError&) {
        ++d["unreadable_lines"].get_ref<json::number_integer_t&>();
      }
    }
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  d["memory"] = json::array();
  for (auto& [r, m] : ranks) d["memory"].push_back(std::move(m));

  if (fs::exists(root / "tuning.json"))
    d["tuning"] = report_data_tuning(json_read_file((root / "tuning.json").string(), "tuning report"));
  if (fs::exists(root / "recipe.json")) {
    const json rc = json_read_file((root / "recipe.json").string(), "recipe");
    if (rc.is_object()) d["recipe"] = {{"layout", field_of(rc, "layout")}, {"source", field_of(rc, "source")}};
  }
  // The newest header names the model (a string, or a spec with a name).
  std::string model, layout, compute;
  if (!d["headers"].empty()) {
    const json& h = d["headers"].back();
    if (h.contains("run") && h["run"].is_object()) compute = field_text(h["run"], "precision");
    if (h.contains("model") && h["model"].is_string()) model = h["model"].get<std::string>();
    else if (h.contains("model") && h["model"].is_object()) model = field_text(h["model"], "name");
    if (h.contains("layout") && h["layout"].is_string()) layout = h["layout"].get<std::string>();
    if (h.contains("params") && h["params"].is_object()) d["params"] = h["params"];
    if (h.contains("run") && h["run"].is_object() && h["run"].contains("lora")) d["lora"] = h["run"]["lora"];
  }
  if (layout.empty() && !d["memory"].empty()) layout = field_text(d["memory"][0], "layout");
  d["layout"] = layout;
  // The GEMM precision the layout trains with: its FP8 recipe, else the
  // run's compute precision (fp32 on the CPU).
  if (!layout.empty()) try {
      const Layout l = Layout::parse(layout);
      d["gemm_precision"] = l.fp8 == Fp8Recipe::off && !compute.empty() ? compute : gemm_precision_text(l);
    } catch (const InputError&) {
      // A layout text of another version: the page shows the text alone.
    }
  const std::string name = fs::path(dir).lexically_normal().filename().string();
  d["title"] = fmt::format("weft run: {}{}", name.empty() ? dir : name, model.empty() ? "" : " (" + model + ")");
  return d;
}

namespace {

std::string report_html_for_checked(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (!fs::exists(fs::path(path) / "metrics.jsonl") && !fs::exists(fs::path(path) / "tuning.json"))
      throw InputError(fmt::format("'{}' is a folder without metrics.jsonl or tuning.json; {}", path, kValid));
    return report_html(report_data_run(path));
  }
  if (!fs::exists(path, ec)) throw InputError(fmt::format("'{}' does not exist; {}", path, kValid));
  json j;
  try {
    j = json_read_file(path, "report input");
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}; {}", e.what(), kValid));
  }
  if (j.is_object() && j.contains("trials") && j["trials"].is_array()) return report_html(report_data_tuning(j));
  if (j.is_object() && j.contains("layouts") && j["layouts"].is_array()) return report_html(report_data_dry_run(j));
  throw InputError(fmt::format("'{}' is JSON of an unknown kind (no \"trials\" or \"layouts\" list); {}", path, kValid));
}

}  // namespace

std::string report_html_for(const std::string& path) {
  // A value of a type the page cannot use anywhere: the file and the field.
  try {
    return report_html_for_checked(path);
  } catch (const json::exception& e) {
    throw FileFormatError(fmt::format("'{}': {}", path, json_error_text(e)));
  }
}

std::string report_write_run(const std::string& run_dir) {
  const std::string out = (fs::path(run_dir) / "report.html").string();
  file_write_atomic(out, report_html(report_data_run(run_dir)));
  return out;
}

}  // namespace weft::report
