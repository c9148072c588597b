// Reads back what an HTML report embeds: the JSON of its weft-data block.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

namespace weft::test {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
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

}  // namespace weft::test
