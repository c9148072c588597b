#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::data {

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw InputError(fmt::format("{} '{}' does not exist", what, path));
    throw InputError(fmt::format("cannot open {} '{}': {}", what, path, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("{} '{}' is not a regular file", what, path));
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    throw InputError(fmt::format("{} '{}' is empty", what, path));
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  // The mapping keeps the file alive; the descriptor is no longer needed.
  ::close(fd);
  if (p == MAP_FAILED)
    throw InputError(fmt::format("cannot map {} '{}': {}", what, path, std::strerror(err)));
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

}  // namespace weft::data
