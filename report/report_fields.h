// Reading the JSON a report is built from: a field of the wrong type counts
// as absent, so that a report shows what it can. weft writes null where a
// number was NaN (a validation skipped by a stop, a diverged loss), and a
// file may have been edited by hand; neither may keep a page from opening.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace weft::report {

// The field `key` of `j` when `j` is an object holding it, else null.
inline const nlohmann::json& field_of(const nlohmann::json& j, const char* key) {
  static const nlohmann::json absent;
  if (!j.is_object()) return absent;
  const auto it = j.find(key);
  return it == j.end() ? absent : *it;
}

inline double field_number(const nlohmann::json& j, const char* key, double fallback = 0) {
  const auto& v = field_of(j, key);
  return v.is_number() ? v.get<double>() : fallback;
}

inline int64_t field_whole(const nlohmann::json& j, const char* key, int64_t fallback = 0) {
  const auto& v = field_of(j, key);
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    return v.get<int64_t>();
  // A whole number written as a float (1e9) still reads; anything else is absent.
  if (v.is_number_float() && v.get<double>() >= -9e18 && v.get<double>() <= 9e18) return int64_t(v.get<double>());
  return fallback;
}

inline std::string field_text(const nlohmann::json& j, const char* key, const std::string& fallback = "") {
  const auto& v = field_of(j, key);
  return v.is_string() ? v.get<std::string>() : fallback;
}

// The same at a path of keys ("/cluster/device/name").
inline const nlohmann::json& field_at(const nlohmann::json& j, const nlohmann::json::json_pointer& p) {
  static const nlohmann::json absent;
  return j.contains(p) ? j.at(p) : absent;
}

}  // namespace weft::report
