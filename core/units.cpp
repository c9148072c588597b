#include "core/units.h"

#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"

namespace weft {

std::string format_bytes(double bytes) {
  const double a = std::fabs(bytes);
  if (a >= double(GiB)) return fmt::format("{:.2f} GiB", bytes / double(GiB));
  if (a >= double(MiB)) return fmt::format("{:.1f} MiB", bytes / double(MiB));
  if (a >= double(KiB)) return fmt::format("{:.1f} KiB", bytes / double(KiB));
  return fmt::format("{:.0f} B", bytes);
}

std::string format_seconds(double s) {
  const double a = std::fabs(s);
  if (a >= 1.0) return fmt::format("{:.3g} s", s);
  if (a >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} us", s * 1e6);
}

double parse_duration(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end ? std::string(end) : "";
  double scale = -1;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "ms") scale = 1e-3;
  else if (unit == "m" || unit == "min") scale = 60;
  else if (unit == "h") scale = 3600;
  if (end == text.c_str() || scale < 0 || !(v > 0) || !std::isfinite(v))
    throw InputError(fmt::format("duration '{}' is not valid; use e.g. 90s, 10m, 1h", text));
  return v * scale;
}

int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  if (unit.size() == 3 && unit.substr(1) == "iB") unit = unit.substr(0, 1);
  if (unit == "B") unit.clear();
  double scale = -1;
  if (unit.empty()) scale = 1;
  else if (unit == "K") scale = double(KiB);
  else if (unit == "M") scale = double(MiB);
  else if (unit == "G") scale = double(GiB);
  else if (unit == "T") scale = double(GiB) * 1024;
  const double bytes = v * scale;
  if (end == text.c_str() || scale < 0 || !(bytes >= 1) || !(bytes <= std::ldexp(1.0, 62)))
    throw InputError(fmt::format("size '{}' is not valid; use e.g. 2GiB, 512MiB or a number of bytes", text));
  return int64_t(bytes);
}

}  // namespace weft
