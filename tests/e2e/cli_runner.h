// Runs the weft executable as a user would and captures its exit code and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace weft::test {

struct CliResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// Runs a shell command line; stderr is captured only if the line redirects it.
inline CliResult run_shell(const std::string& cmd) {
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline CliResult run_weft(const std::string& args) { return run_shell(std::string(WEFT_BIN) + " " + args + " 2>&1"); }

}  // namespace weft::test
