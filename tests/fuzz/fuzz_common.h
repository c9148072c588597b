// Shared by the libFuzzer targets of tests/fuzz: every target hands the
// fuzzer's bytes to one of weft's parsers of user input. Rejecting bad input
// with weft::InputError (or a subclass) is the correct outcome; any other
// exception (a json type error, std::out_of_range, bad_alloc, InternalError)
// means the parser let a malformed file reach code that assumed it was good,
// so the target aborts and the fuzzer reports the input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "core/error.h"

namespace weft::fuzz {

// Runs `parse`; InputError returns normally, anything else aborts.
template <typename F>
void fuzz_parse(F&& parse) {
  try {
    parse();
  } catch (const InputError&) {
    // A clear refusal of bad input: what the parser should do.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: finding: uncaught %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: finding: uncaught non-std exception\n");
    std::abort();
  }
}

// A folder of this process's own under $TMPDIR (or /tmp), made once. Parsers
// that take paths read the input from files in it.
inline const std::filesystem::path& fuzz_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                              ("weft-fuzz." + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `bytes` to `name` in fuzz_dir() and returns its path.
inline std::string fuzz_file(const std::string& name, std::string_view bytes) {
  const std::string path = (fuzz_dir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

inline std::string_view fuzz_bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace weft::fuzz
