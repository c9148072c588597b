// Helpers of the `weft train` end-to-end tests: a small prepared corpus, the
// small run's flags, a child weft that signals reach, and the losses of a
// metrics file.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../unit/test_util.h"
#include "cli_runner.h"

// WEFT_TEST_ASAN: built with AddressSanitizer (GCC's macro or clang's
// feature test), whose quarantine and redzones change what memory tests see.
#if defined(__SANITIZE_ADDRESS__)
#define WEFT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define WEFT_TEST_ASAN 1
#endif
#endif

namespace weft::test {

// A small prepared corpus (byte tokens) shared by the tests.
inline std::string corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "The quick brown fox " + std::to_string(i * 7919 % 1000) + " jumps over the lazy dog.\n%\n";
  const auto in = dir.file("corpus.txt", text);
  const auto r = run_weft("data prepare --input " + in + " --out " + dir.path("data") + " --val-fraction 0.1");
  EXPECT_EQ(r.code, 0) << r.out;
  return dir.path("data");
}

inline const std::string kSmall = " --model tiny --seq 32 --global-batch 4 --mb 2 --threads 1 --log-every 1 --eval-samples 4";

// Starts weft with `args` (split at spaces) as a child process with stdout
// discarded: weft itself, not a shell, so that a signal reaches it.
inline pid_t spawn_weft(const std::string& args) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::freopen("/dev/null", "w", stdout);
  std::vector<std::string> words = {WEFT_BIN};
  std::istringstream in(args);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  ::execv(WEFT_BIN, argv.data());
  ::_exit(127);
}

inline std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// A whole file as text.
inline std::string slurp(const std::string& path) {
  return file_contents(path);
}

}  // namespace weft::test
