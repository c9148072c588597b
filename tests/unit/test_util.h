// Small helpers shared by the unit tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace weft::test {

// A fresh folder under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("weft-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& content) const {
    const auto p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << content;
    return p.string();
  }
  std::string path(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

// A whole file's bytes, read in one call ("" when it cannot be opened). The
// tests' own code builds at -O0 (cmake/WeftTesting.cmake), where reading
// through std::istreambuf_iterator manages about 10 MB/s: a minute for a
// pair of checkpoints.
inline std::string file_contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  std::string bytes(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<size_t>(in.gcount()));
  return bytes;
}

// Runs `stmt`, expecting an exception of type E whose message contains every
// one of the given fragments.
#define WEFT_EXPECT_THROW_MSG(stmt, E, ...)                                   \
  do {                                                                        \
    try {                                                                     \
      stmt;                                                                   \
      ADD_FAILURE() << "expected " #E " from " #stmt;                         \
    } catch (const E& e) {                                                    \
      const std::string msg = e.what();                                       \
      const std::vector<std::string> weft_frags_{__VA_ARGS__};                 \
      for (const std::string& frag : weft_frags_)                             \
        EXPECT_NE(msg.find(frag), std::string::npos)                          \
            << "message '" << msg << "' lacks '" << frag << "'";              \
    }                                                                         \
  } while (0)

}  // namespace weft::test
