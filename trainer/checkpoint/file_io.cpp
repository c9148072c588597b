#include "trainer/checkpoint/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"

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
