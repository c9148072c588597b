#include "core/json_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"

namespace weft {

nlohmann::json json_read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in)
    throw InputError(fmt::format("cannot open {} '{}': {}", what, path, std::strerror(errno)));
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw FileFormatError(fmt::format("{} '{}' is empty", what, path));
  // The last object key read, to name the field of a number the parser
  // cannot hold (it stops without a position).
  std::string key;
  const auto track = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key) key = parsed.get<std::string>();
    return true;
  };
  try {
    return nlohmann::json::parse(text, track);
  } catch (const nlohmann::json::parse_error& e) {
    throw FileFormatError(fmt::format("{} '{}' is not valid JSON (byte {}): {}", what, path,
                                      e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {
    // A number beyond double's range, such as 1e999 (out_of_range.406).
    throw FileFormatError(fmt::format("{} '{}'{}: {}; only finite numbers are valid", what, path,
                                      key.empty() ? "" : fmt::format(", field '{}'", key),
                                      e.what()));
  }
}

std::string json_field_path(const std::string& pointer) {
  std::string out;
  size_t at = pointer.empty() || pointer[0] != '/' ? 0 : 1;
  while (at <= pointer.size() && !pointer.empty()) {
    size_t end = pointer.find('/', at);
    if (end == std::string::npos) end = pointer.size();
    std::string token = pointer.substr(at, end - at);
    // RFC 6901 escapes: ~1 is '/', ~0 is '~'.
    for (size_t i = 0; (i = token.find('~', i)) != std::string::npos; ++i)
      if (i + 1 < token.size()) token.replace(i, 2, token[i + 1] == '1' ? "/" : "~");
    const bool index = !token.empty() && token.find_first_not_of("0123456789") == std::string::npos;
    if (index && !out.empty()) out += "[" + token + "]";
    else out += (out.empty() ? "" : ".") + token;
    if (end == pointer.size()) break;
    at = end + 1;
  }
  return out;
}

std::string json_error_text(const nlohmann::json::exception& e) {
  std::string text = e.what();
  // "[json.exception.type_error.302] (/cluster/device) type must be ..."
  if (text.rfind("[json.exception.", 0) == 0) {
    const auto close = text.find("] ");
    if (close != std::string::npos) text = text.substr(close + 2);
  }
  if (text.rfind("(/", 0) == 0 || text.rfind("() ", 0) == 0) {
    const auto close = text.find(") ");
    if (close != std::string::npos) {
      const std::string path = json_field_path(text.substr(1, close - 1));
      text = text.substr(close + 2);
      if (!path.empty()) return fmt::format("field '{}': {}", path, text);
    }
  }
  return text;
}

int64_t json_integer(const nlohmann::json& j, const char* key, const std::string& origin) {
  if (!j.is_object() || !j.contains(key))
    throw InputError(fmt::format("{}: field '{}' is missing", origin, key));
  const auto& v = j[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw InputError(fmt::format("{}: field '{}' must be a whole number within 64 bits, got {}", origin, key,
                                 v.dump()));
  return v.get<int64_t>();
}

void file_write_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const fs::path tmp = target.string() + fmt::format(".tmp.{}", ::getpid());
  {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f)
      throw InputError(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno)));
    const size_t n = std::fwrite(content.data(), 1, content.size(), f);
    const bool ok = n == content.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    const int err = errno;
    std::fclose(f);
    if (!ok) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw InputError(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(err)));
    }
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw InputError(fmt::format("cannot rename into '{}': {}", path, ec.message()));
  }
}

}  // namespace weft
