#include "core/output_guard.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"

namespace weft {

namespace fs = std::filesystem;

namespace {

const char* kind_text(OutputKind k) {
  switch (k) {
    case OutputKind::html_report: return "weft HTML report";
    case OutputKind::dry_run_report: return "weft dry-run report";
    case OutputKind::sbatch_script: return "batch script of weft recipe sbatch";
    case OutputKind::recipe: return "weft recipe";
    case OutputKind::device_profile: return "weft device profile";
  }
  return "weft output";
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Whether `inner` is `outer` or lies inside it (both made absolute and
// normal, links resolved where they exist).
bool within(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(inner, ec);
  if (ec) return false;
  const fs::path b = fs::weakly_canonical(outer, ec);
  if (ec) return false;
  auto i = a.begin(), j = b.begin();
  for (; j != b.end(); ++i, ++j) {
    if (j->empty()) continue;  // a trailing separator
    if (i == a.end() || *i != *j) return false;
  }
  return true;
}

}  // namespace

bool output_is_kind(const std::string& head, OutputKind kind) {
  // Every page report_html writes: its error box comes right after the title.
  const bool html = starts_with(head, "<!doctype html>") && head.find("id=\"weft-errors\"") != std::string::npos;
  switch (kind) {
    case OutputKind::html_report: return html;
    case OutputKind::dry_run_report:
      return html || starts_with(head, "model   ") || starts_with(head, "rank,layout,verdict,") ||
             starts_with(head, "# weft dry-run") ||
             (starts_with(head, "{\n \"cluster\": {") && head.find("\"cost_constants\"") != std::string::npos);
    case OutputKind::sbatch_script: return starts_with(head, "#!/bin/bash\n# Written by `weft recipe sbatch`");
    case OutputKind::recipe:
      return starts_with(head, "{") && head.find("\"format\": \"weft-recipe\"") != std::string::npos;
    case OutputKind::device_profile:
      return starts_with(head, "{") && head.find("\"format\": \"weft-device-profile\"") != std::string::npos;
  }
  return false;
}

void output_check(const std::string& out, OutputKind kind, const std::vector<std::string>& inputs,
                  const std::string& option) {
  if (out.empty()) throw InputError(fmt::format("{} is empty; give the file to write", option));
  for (const std::string& in : inputs) {
    std::error_code gone;
    if (in.empty() || !fs::exists(in, gone)) continue;  // nothing there to lose
    if (within(out, in))
      throw InputError(fmt::format("{} {} is {} this command reads; write the {} elsewhere", option, out,
                                   fs::path(in) == fs::path(out) ? "the input" : fmt::format("inside {}, which", in),
                                   kind_text(kind)));
  }
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw InputError(fmt::format("{} {}: cannot tell what is there ({}); choose another path", option, out,
                                 ec.message()));
  if (!fs::exists(st)) {
    const fs::path parent = fs::path(out).parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec))
      throw InputError(fmt::format("{} {}: the folder {} does not exist; create it first or choose another path",
                                   option, out, parent.string()));
    return;
  }
  if (!fs::is_regular_file(st))
    throw InputError(fmt::format("{} {} exists and is {}, not a file; choose a file path", option, out,
                                 fs::is_directory(st) ? "a folder" : "something other than a file"));
  std::ifstream f(out, std::ios::binary);
  std::string head(64 << 10, '\0');
  f.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(f.gcount()));
  if (!output_is_kind(head, kind))
    throw InputError(fmt::format("{} {} exists and is not a {} written earlier, so it is left as it is; choose a "
                                 "new path, or move the file away first",
                                 option, out, kind_text(kind)));
}

}  // namespace weft
