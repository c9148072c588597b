#include "trainer/checkpoint/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw InputError(fmt::format("cannot create '{}': {}", path, std::strerror(errno)));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t n) {
  // One write() moves at most ~2 GiB on Linux; smaller pieces also keep a
  // short write cheap to resume.
  constexpr size_t kMaxChunk = size_t{1} << 30;
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min(n, kMaxChunk));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw InputError(fmt::format("cannot write '{}': {}", path_, std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void FileWriter::sync_close() {
  const bool synced = ::fsync(fd_) == 0;
  const int sync_err = errno;
  const bool closed = ::close(fd_) == 0;
  const int close_err = errno;
  fd_ = -1;
  if (!synced)
    throw InputError(fmt::format("cannot sync '{}': {}", path_, std::strerror(sync_err)));
  if (!closed)
    throw InputError(fmt::format("cannot close '{}': {}", path_, std::strerror(close_err)));
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw InputError(fmt::format("cannot open folder '{}': {}", dir, std::strerror(errno)));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw InputError(fmt::format("cannot sync folder '{}': {}", dir, std::strerror(err)));
}

std::string dir_path_clean(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.has_relative_path() && p.filename().empty()) p = p.parent_path();
  return p.string();
}

void dir_create(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("cannot create folder '{}': {}", dir, ec.message()));
}

std::string temp_dir_name(const std::string& dir) {
  return fmt::format("{}.tmp-{}", dir_path_clean(dir), ::getpid());
}

void commit_dir(const std::string& tmp, const std::string& dir, const StageHook& hook) {
  const fs::path target = dir_path_clean(dir);
  const std::string parent = target.has_parent_path() ? target.parent_path().string() : ".";
  fsync_dir(tmp);
  if (!fs::exists(target)) {
    if (std::rename(tmp.c_str(), target.c_str()) != 0)
      throw InputError(fmt::format("cannot rename '{}' to '{}': {}", tmp, target.string(),
                                   std::strerror(errno)));
    fsync_dir(parent);
    if (hook) hook("swapped");
    return;
  }
  // Swap: afterwards `tmp` names the old folder.
  std::string old = tmp;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      throw InputError(fmt::format("cannot swap '{}' into '{}': {}", tmp, target.string(),
                                   std::strerror(errno)));
    old = fmt::format("{}.old-{}", target.string(), ::getpid());
    std::error_code ec;
    fs::remove_all(old, ec);
    if (std::rename(target.c_str(), old.c_str()) != 0)
      throw InputError(
          fmt::format("cannot move '{}' aside: {}", target.string(), std::strerror(errno)));
    fsync_dir(parent);
    if (hook) hook("moved_aside");
    if (std::rename(tmp.c_str(), target.c_str()) != 0)
      throw InputError(
          fmt::format("cannot rename '{}' to '{}': {} (the previous contents are in "
                      "'{}')",
                      tmp, target.string(), std::strerror(errno), old));
  }
  fsync_dir(parent);
  if (hook) hook("swapped");
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec)
    throw InputError(fmt::format("saved '{}' but cannot remove the previous contents at '{}': {}",
                                 target.string(), old, ec.message()));
}

}  // namespace weft::checkpoint

namespace weft::checkpoint {

namespace {

// Whether `inner` is `outer` or lies inside it (absolute, normal, links
// resolved where they exist).
bool path_within(const fs::path& inner, const fs::path& outer) {
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(inner, ec);
  if (ec) return false;
  const fs::path b = fs::weakly_canonical(outer, ec);
  if (ec) return false;
  auto i = a.begin();
  for (auto j = b.begin(); j != b.end(); ++j, ++i) {
    if (j->empty()) continue;
    if (i == a.end() || *i != *j) return false;
  }
  return true;
}

std::string marker_kind(const fs::path& marker) {
  try {
    const auto j = json_read_file(marker.string(), "export marker");
    if (j.is_object() && j.value("format", std::string()) == "weft-export") return j.value("kind", std::string());
  } catch (const std::exception&) {
  }
  return {};
}

}  // namespace

void export_target_check(const std::string& out_dir, const char* kind, const std::vector<std::string>& files,
                         const std::vector<std::string>& inputs) {
  const fs::path out = dir_path_clean(out_dir);
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    if (path_within(out, in) || path_within(in, out))
      throw InputError(fmt::format("export folder '{}' {} '{}', which this export reads; choose another folder",
                                   out.string(), path_within(out, in) ? "is or lies inside" : "holds", in));
  }
  if (!fs::exists(out)) return;
  if (!fs::is_directory(out))
    throw InputError(fmt::format("export folder '{}' exists and is not a folder; choose another path", out.string()));
  bool empty = true, marked = false;
  for (const auto& e : fs::directory_iterator(out)) {
    empty = false;
    const std::string name = e.path().filename().string();
    if (name == kExportMarkerFile) {
      marked = marker_kind(e.path()) == kind;
      continue;
    }
    if (std::find(files.begin(), files.end(), name) == files.end())
      throw InputError(fmt::format("export folder '{}' exists and holds '{}'; choose a new or empty folder (only an "
                                   "earlier export of weft's is replaced)",
                                   out.string(), name));
  }
  if (!empty && !marked)
    throw InputError(fmt::format("export folder '{}' holds {} but no {} of an earlier {} export of weft's, so it may be "
                                 "a model of your own and is left as it is; choose a new or empty folder, or move it "
                                 "away first",
                                 out.string(), fmt::join(files, " or "), kExportMarkerFile, kind));
}

void export_marker_write(const std::string& dir, const char* kind, const std::string& source) {
  const nlohmann::json j = {{"format", "weft-export"}, {"kind", kind}, {"source", source}};
  file_write_atomic((fs::path(dir) / kExportMarkerFile).string(), j.dump(2) + "\n");
}

}  // namespace weft::checkpoint
