// Reads back what an HTML report embeds: the JSON of its weft-data block.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../unit/test_util.h"

namespace weft::test {

inline std::string read_text(const std::string& path) {
  return file_contents(path);
}

// The data block's JSON; null when the page has none.
inline nlohmann::json report_embedded(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"weft-data\">";
  const size_t a = html.find(open);
  if (a == std::string::npos) return nullptr;
  const size_t b = html.find("</script>", a);
  if (b == std::string::npos) return nullptr;
  return nlohmann::json::parse(html.substr(a + open.size(), b - a - open.size()));
}

// A tuning.json as weft now writes it after a resume: the first trial read
// from an earlier run's journal (no start time), the others with recorded
// starts from `first` on, `gap` seconds apart (refits, set-up).
inline nlohmann::json tuning_with_start_times(nlohmann::json src, double first, double gap) {
  src["trials"][0]["from_journal"] = true;
  double start = first;
  for (size_t i = 1; i < src["trials"].size(); ++i) {
    src["trials"][i]["start_s"] = start;
    start += src["trials"][i]["seconds"].get<double>() + gap;
  }
  return src;
}

// `src` with every number replaced by null, as weft writes a NaN and as a
// hand edit may leave one: a report must still open.
inline nlohmann::json with_nulls(nlohmann::json src) {
  if (src.is_number()) return nullptr;
  if (src.is_structured())
    for (auto& v : src) v = with_nulls(std::move(v));
  return src;
}

// The folder `from` (a run folder) copied to `to` with every number of its
// JSON and JSONL files replaced by null, keeping only the steps so that
// records still sort.
inline void copy_run_with_nulls(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  fs::copy(from, to, fs::copy_options::recursive);
  const auto nulled = [](nlohmann::json j) {
    const auto step = j.is_object() && j.contains("step") ? j["step"] : nlohmann::json();
    j = with_nulls(std::move(j));
    if (!step.is_null()) j["step"] = step;
    return j.dump();
  };
  for (const auto& e : fs::recursive_directory_iterator(to)) {
    const std::string path = e.path().string(), ext = e.path().extension().string();
    std::string out;
    if (ext == ".json") {
      out = nulled(nlohmann::json::parse(read_text(path))) + "\n";
    } else if (ext == ".jsonl") {
      std::istringstream in(read_text(path));
      for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line, nullptr, false);
        out += (j.is_discarded() ? line : nulled(j)) + "\n";  // a cut-off line stays as it was
      }
    } else {
      continue;
    }
    std::ofstream(path, std::ios::trunc) << out;
  }
}

}  // namespace weft::test
