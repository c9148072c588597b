#include "tuner/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"

namespace weft::tuner {

namespace {

using nlohmann::json;

// A value as a user reads it in a message: strings bare, the rest as JSON.
std::string show(const json* v) {
  if (!v) return "(absent)";
  if (v->is_string() && !v->get_ref<const std::string&>().empty()) return v->get<std::string>();
  return v->dump();
}

// Appends "key old, this run has new" for every leaf where `was` and `now`
// differ, naming nested keys with dots (model.hash).
void header_diff(const json* was, const json* now, const std::string& key, std::vector<std::string>& out) {
  if (was && now && was->is_object() && now->is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : was->items()) keys.insert(k);
    for (const auto& [k, v] : now->items()) keys.insert(k);
    for (const auto& k : keys) {
      const json* a = was->contains(k) ? &was->at(k) : nullptr;
      const json* b = now->contains(k) ? &now->at(k) : nullptr;
      header_diff(a, b, key.empty() ? k : key + "." + k, out);
    }
    return;
  }
  if (!was || !now || *was != *now) out.push_back(fmt::format("{} {}, this run has {}", key, show(was), show(now)));
}

// Makes a new file's name durable: fsync on the file covers its contents only.
void sync_parent(const std::filesystem::path& file) {
  const auto dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // durability of the name is best effort; the contents are synced
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

Journal Journal::open(const std::string& path, const nlohmann::json& header) {
  namespace fs = std::filesystem;
  WEFT_ASSERT(header.is_object() && !header.contains("kind"));
  json header_line = header;
  header_line["kind"] = "header";

  Journal j;
  j.path_ = path;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw InputError(fmt::format("cannot open journal {}: {}", path, ec.message()));
  if (!fs::exists(status) || fs::file_size(path, ec) == 0) {
    // Through a temporary file and a rename, so a journal never exists without its header.
    file_write_atomic(path, header_line.dump() + "\n");
    sync_parent(path);
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(fmt::format("cannot open journal {}: {}", path, std::strerror(errno)));
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    auto bad = [&](int64_t line, const std::string& what) {
      return FileFormatError(fmt::format(
          "journal {} line {}: {}; fix or delete that line, or move the file away to tune afresh", path,
          line, what));
    };
    int64_t line_no = 0;
    for (size_t begin = 0; begin < text.size();) {
      ++line_no;
      const size_t end = text.find('\n', begin);
      if (end == std::string::npos)
        throw bad(line_no, "cut off (no newline at its end; the process died while writing it)");
      const std::string line = text.substr(begin, end - begin);
      begin = end + 1;
      json e;
      try {
        e = json::parse(line);
      } catch (const json::exception& err) {  // parse_error, or out_of_range for 1e999
        throw bad(line_no, fmt::format("not JSON ({})", err.what()));
      }
      if (!e.is_object() || !e.contains("kind") || !e["kind"].is_string())
        throw bad(line_no, "no \"kind\"");
      const std::string kind = e["kind"].get<std::string>();
      if (kind == "header") {
        if (line_no != 1) throw bad(line_no, "a second header");
        json was = e;
        was.erase("kind");
        std::vector<std::string> diffs;
        header_diff(&was, &header, "", diffs);
        if (!diffs.empty()) {
          std::string list;
          for (const auto& d : diffs) list += (list.empty() ? "" : "; ") + d;
          throw InputError(fmt::format(
              "journal {} was written for {}; move it away or use another run folder to tune afresh", path,
              list));
        }
        continue;
      }
      if (line_no == 1) throw bad(line_no, fmt::format("kind \"{}\" where the header should be", kind));
      if (kind == "start") {
        if (!e.contains("layout") || !e["layout"].is_string())
          throw bad(line_no, "a start without a string \"layout\"");
        j.note_start(e["layout"].get<std::string>());
      } else if (kind == "result") {
        if (!e.contains("result") || !e["result"].is_object() || !e["result"].contains("layout") ||
            !e["result"]["layout"].is_string())
          throw bad(line_no, "a result without an object \"result\" holding a string \"layout\"");
        j.note_result(e["result"]);
      } else if (kind == "abandon") {
        if (!e.contains("layout") || !e["layout"].is_string())
          throw bad(line_no, "an abandon without a string \"layout\"");
        j.running_.erase(e["layout"].get<std::string>());
      } else {
        throw bad(line_no,
                  fmt::format("unknown kind \"{}\" (expected header, start, result or abandon)", kind));
      }
    }
  }
  j.fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (j.fd_ < 0) throw InputError(fmt::format("cannot open journal {} for writing: {}", path, std::strerror(errno)));
  return j;
}

Journal::Journal(Journal&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      results_(std::move(o.results_)),
      latest_(std::move(o.latest_)),
      started_(std::move(o.started_)),
      running_(std::move(o.running_)) {}

Journal& Journal::operator=(Journal&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    results_ = std::move(o.results_);
    latest_ = std::move(o.latest_);
    started_ = std::move(o.started_);
    running_ = std::move(o.running_);
  }
  return *this;
}

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

void Journal::append(const nlohmann::json& entry) {
  WEFT_ASSERT(fd_ >= 0);
  // Invalid UTF-8 (say, in a device's error text) is replaced rather than losing the entry.
  const std::string line = entry.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  struct stat st {};
  const bool sized = ::fstat(fd_, &st) == 0;
  ssize_t n;
  do n = ::write(fd_, line.data(), line.size());
  while (n < 0 && errno == EINTR);
  if (n != ssize_t(line.size())) {
    const int err = n < 0 ? errno : ENOSPC;
    // A part of a line would make the journal unreadable until fixed by hand; cut it back off.
    if (n > 0 && sized) (void)::ftruncate(fd_, st.st_size);
    throw InputError(fmt::format("cannot append to journal {}: {}", path_, std::strerror(err)));
  }
  if (::fsync(fd_) != 0)
    throw InputError(fmt::format("cannot sync journal {}: {}", path_, std::strerror(errno)));
}

void Journal::note_start(const std::string& layout) {
  if (std::find(started_.begin(), started_.end(), layout) == started_.end()) started_.push_back(layout);
  running_.insert(layout);
}

void Journal::note_result(const nlohmann::json& result) {
  const std::string layout = result["layout"].get<std::string>();
  latest_[layout] = results_.size();
  results_.push_back(result);
  running_.erase(layout);
}

void Journal::abandon(const std::string& layout) {
  append(json{{"kind", "abandon"}, {"layout", layout}});
  running_.erase(layout);
}

void Journal::start(const std::string& layout) {
  append(json{{"kind", "start"}, {"layout", layout}});
  note_start(layout);
}

void Journal::finish(const nlohmann::json& result) {
  WEFT_ASSERT(result.is_object() && result.contains("layout") && result["layout"].is_string());
  append(json{{"kind", "result"}, {"result", result}});
  note_result(result);
}

std::vector<std::string> Journal::unfinished() const {
  std::vector<std::string> out;
  for (const auto& l : started_)
    if (running_.count(l)) out.push_back(l);
  return out;
}

const nlohmann::json* Journal::result(const std::string& layout) const {
  const auto it = latest_.find(layout);
  return it == latest_.end() ? nullptr : &results_[it->second];
}

}  // namespace weft::tuner
