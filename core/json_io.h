// JSON and file io shared by specs, recipes and reports.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace weft {

// Parses a JSON file; InputError naming the path (and `what` it should be)
// when it is missing, unreadable or malformed, with the parser's position.
nlohmann::json json_read_file(const std::string& path, const std::string& what);

// What a JSON exception says, for a message that names the file before it:
// "field 'cluster.device.name': type must be string, but is number" (the
// field's path comes with every exception, JSON_DIAGNOSTICS being on), or
// the text alone when it names no field; never the bare
// "[json.exception.type_error.302]" tag.
std::string json_error_text(const nlohmann::json::exception& e);

// The field path a JSON pointer names, with dots: "/cluster/device" ->
// "cluster.device", "/trials/3/step_s" -> "trials[3].step_s".
std::string json_field_path(const std::string& pointer);

// The whole number at j[key]: InputError naming `origin` and the key when it
// is missing or not an integer JSON value (a float such as 4e50 would
// otherwise be cast to int64, which is undefined).
int64_t json_integer(const nlohmann::json& j, const char* key, const std::string& origin);

// Writes `content` to `path` through a temporary file in the same folder and
// a rename, so readers never see a half-written file and an existing good
// file is replaced only by a complete one. Creates parent folders.
void file_write_atomic(const std::string& path, const std::string& content);

}  // namespace weft
