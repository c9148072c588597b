#include "trainer/run_folder.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"

namespace weft::trainer {

namespace fs = std::filesystem;

namespace {

fs::path checkpoint_root(const std::string& out_dir, const std::string& ckpt_dir) {
  return ckpt_dir.empty() ? fs::path(out_dir) / "checkpoints" : fs::path(ckpt_dir);
}

// The step_N folders (and their leftovers) under a checkpoint root.
std::vector<std::string> checkpoint_names(const fs::path& root) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return names;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind("step_", 0) == 0) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// "<path>.prev-20261124-235501", or with "-2", "-3"... when taken.
fs::path aside_name(const fs::path& p) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  const std::string base = fs::path(p).lexically_normal().string();
  const std::string trimmed = base.size() > 1 && base.back() == '/' ? base.substr(0, base.size() - 1) : base;
  fs::path candidate = trimmed + ".prev-" + stamp;
  for (int i = 2; fs::exists(candidate); ++i) candidate = fmt::format("{}.prev-{}-{}", trimmed, stamp, i);
  return candidate;
}

void move_aside(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec)
    throw InputError(fmt::format("--overwrite: cannot move {} aside to {}: {}; move it yourself or choose "
                                 "another --out",
                                 from.string(), to.string(), ec.message()));
}

}  // namespace

std::vector<std::string> run_folder_contents(const std::string& out_dir, const std::string& ckpt_dir) {
  std::vector<std::string> what;
  std::error_code ec;
  const fs::path metrics = fs::path(out_dir) / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0) {
    std::ifstream in(metrics);
    int64_t records = 0;
    for (std::string line; std::getline(in, line);) records += line.empty() ? 0 : 1;
    what.push_back(fmt::format("metrics.jsonl with {} records", records));
  }
  const auto names = checkpoint_names(checkpoint_root(out_dir, ckpt_dir));
  if (!names.empty()) {
    std::string list = names.front();
    if (names.size() > 1) list += fmt::format("{} .. {}", names.size() > 2 ? ", ..." : ",", names.back());
    what.push_back(fmt::format("{} checkpoint{} ({}) in {}", names.size(), names.size() == 1 ? "" : "s", list,
                               checkpoint_root(out_dir, ckpt_dir).string()));
  }
  return what;
}

std::string run_folder_prepare(const std::string& out_dir, const std::string& ckpt_dir, RunFolderMode mode,
                               bool act) {
  if (mode == RunFolderMode::resume) return "";
  const auto what = run_folder_contents(out_dir, ckpt_dir);
  if (what.empty()) return "";
  if (mode == RunFolderMode::fresh)
    throw InputError(fmt::format(
        "run folder {} already holds a run ({}); continue it with --resume, start elsewhere with a new "
        "--out, or pass --overwrite to move it aside (nothing is deleted)",
        out_dir, fmt::join(what, "; ")));
  if (!act) return "";
  std::string said;
  const fs::path out(out_dir);
  const fs::path root = checkpoint_root(out_dir, ckpt_dir);
  // By path components, not text: runs/ab is not inside runs/a.
  const fs::path rel = fs::absolute(root).lexically_normal().lexically_relative(fs::absolute(out).lexically_normal());
  const bool inside = !rel.empty() && *rel.begin() != "..";
  if (!inside && !checkpoint_names(root).empty()) {
    const auto to = aside_name(root);
    move_aside(root, to);
    said += fmt::format("moved the earlier checkpoints in {} aside to {}\n", root.string(), to.string());
  }
  std::error_code ec;
  if (fs::exists(out, ec)) {
    const auto to = aside_name(out);
    move_aside(out, to);
    said += fmt::format("moved the earlier run in {} aside to {}\n", out.string(), to.string());
  }
  return said;
}

std::optional<SupersededMetrics> metrics_supersede_after(const std::string& metrics_path, int64_t done) {
  std::ifstream in(metrics_path);
  if (!in) return std::nullopt;
  SupersededMetrics sup;
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    // The step a record belongs to: a step record's, a launch header's first
    // step, an end record's last; a line that is not a JSON object stays.
    int64_t step = 0;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) {
      for (const char* key : {"step", "first_step", "last_step"}) {
        const auto it = j.find(key);
        if (it != j.end() && it->is_number_integer()) {
          step = it->get<int64_t>();
          break;
        }
      }
    }
    if (step > done) {
      if (!j.contains("first_step") && !j.contains("last_step")) {
        sup.first_step = sup.records ? std::min(sup.first_step, step) : step;
        sup.last_step = std::max(sup.last_step, step);
      }
      ++sup.records;
      continue;
    }
    kept += line;
    kept += '\n';
  }
  if (sup.records == 0) return std::nullopt;
  in.close();
  sup.kept = aside_name(metrics_path).string();
  fs::copy_file(metrics_path, sup.kept);
  file_write_atomic(metrics_path, kept);
  return sup;
}

}  // namespace weft::trainer
