#include "data/data_spec.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::data {

namespace {

constexpr const char* kBlendForm = "a blend alternates weights and paths: --data 0.7 A 0.3 B";

// The whole item as a number, or nothing.
std::optional<double> number_parse(const std::string& s) {
  double v = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

std::string DataSpec::describe() const {
  std::vector<std::string> items;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (blend()) items.push_back(fmt::format("{}", weights[i]));
    items.push_back(paths[i]);
  }
  return fmt::format("{}", fmt::join(items, " "));
}

DataSpec data_spec_parse(const std::vector<std::string>& items) {
  DataSpec spec;
  if (items.empty()) return spec;
  if (!number_parse(items[0])) {
    for (size_t i = 0; i < items.size(); ++i) {
      std::error_code ec;
      if (i > 0 && number_parse(items[i]) && !std::filesystem::exists(items[i], ec))
        throw InputError(fmt::format(
            "--data item {} '{}' is a number after the path '{}', and no such file exists; {}",
            i + 1, items[i], items[0], kBlendForm));
      spec.paths.push_back(items[i]);
    }
    return spec;
  }
  if (items.size() % 2 != 0)
    throw InputError(fmt::format("--data blend '{}' ends with the weight '{}' and no path; {}",
                                 fmt::join(items, " "), items.back(), kBlendForm));
  double sum = 0;
  for (size_t i = 0; i < items.size(); i += 2) {
    const auto w = number_parse(items[i]);
    if (!w)
      throw InputError(fmt::format("--data blend weight '{}' (item {}) is not a number; {}",
                                   items[i], i + 1, kBlendForm));
    if (!std::isfinite(*w) || *w < 0)
      throw InputError(fmt::format(
          "--data blend weight {} (item {}, for '{}') must be a finite number >= 0", items[i],
          i + 1, items[i + 1]));
    spec.weights.push_back(*w);
    spec.paths.push_back(items[i + 1]);
    sum += *w;
  }
  if (!(sum > 0))
    throw InputError(fmt::format(
        "--data blend '{}' has weights summing to 0; give at least one part a weight above 0",
        fmt::join(items, " ")));
  return spec;
}

}  // namespace weft::data
