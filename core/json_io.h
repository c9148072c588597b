// JSON and file io shared by specs, recipes and reports.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace weft {

// Parses a JSON file; InputError naming the path (and `what` it should be)
// when it is missing, unreadable or malformed, with the parser's position.
nlohmann::json json_read_file(const std::string& path, const std::string& what);

// Writes `content` to `path` through a temporary file in the same folder and
// a rename, so readers never see a half-written file and an existing good
// file is replaced only by a complete one. Creates parent folders.
void file_write_atomic(const std::string& path, const std::string& content);

}  // namespace weft
