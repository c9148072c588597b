// Byte builders for hand-made foreign token files (llm.c .bin, numpy .npy),
// so the readers are tested against the formats' definitions, not against
// weft's own writer.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../test_util.h"

namespace weft::test {

class Bytes {
 public:
  template <typename T>
  Bytes& put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s_.append(b, sizeof(T));
    return *this;
  }
  template <typename T>
  Bytes& put_all(const std::vector<T>& vs) {
    for (const T v : vs) put(v);
    return *this;
  }
  Bytes& text(const std::string& t) {
    s_ += t;
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

// An llm.c .bin: 256 int32 header words then the tokens.
template <typename T>
std::string llmc_bytes(int32_t magic, int32_t version, const std::vector<T>& tokens,
                       int64_t count_override = -1) {
  Bytes b;
  b.put<int32_t>(magic).put<int32_t>(version);
  b.put<int32_t>(
      static_cast<int32_t>(count_override >= 0 ? count_override : int64_t(tokens.size())));
  for (int i = 3; i < 256; ++i) b.put<int32_t>(0);
  b.put_all(tokens);
  return b.str();
}

// A numpy .npy, version 1.0, written the way numpy.save writes it: the dict,
// padded with spaces and a newline so the data starts at a multiple of 64.
inline std::string npy_bytes(const std::string& descr, const std::string& shape,
                             const std::string& payload, int major = 1,
                             const std::string& fortran = "False") {
  std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  const size_t preamble = major == 1 ? 10 : 12;
  size_t total = preamble + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  Bytes b;
  b.text("\x93NUMPY").put<uint8_t>(static_cast<uint8_t>(major)).put<uint8_t>(0);
  if (major == 1)
    b.put<uint16_t>(static_cast<uint16_t>(dict.size()));
  else
    b.put<uint32_t>(static_cast<uint32_t>(dict.size()));
  b.text(dict).text(payload);
  return b.str();
}

template <typename T>
std::string le_payload(const std::vector<T>& vs) {
  return Bytes().put_all(vs).str();
}

inline std::string file_bytes(const std::string& path) {
  return test::file_contents(path);
}

inline void file_put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace weft::test
