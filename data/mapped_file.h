// A read-only memory map of a whole file. Token files are read through it so
// that opening a multi-gigabyte corpus costs nothing until pages are touched,
// and every rank of a node shares the same page cache.
#pragma once

#include <cstdint>
#include <string>

namespace weft::data {

class MappedFile {
 public:
  // Maps `path`. InputError when it is missing, not a regular file, empty or
  // unreadable; `what` names the file's role in the message ("data file").
  explicit MappedFile(const std::string& path, const std::string& what = "data file");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }  // bytes

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace weft::data
