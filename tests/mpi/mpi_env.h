// What the tests that launch mpirun themselves share: the environment OpenMPI
// wants when run as root on a machine with fewer cores than ranks.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace weft::test {

// The pids of the weft ranks of a run launched with `--out OUT` (mpirun's own
// process, whose command line names the folder too, is left out).
inline std::vector<int> weft_ranks(const std::string& out) {
  FILE* p = ::popen(("pgrep -f -- '--out " + out + "'").c_str(), "r");
  std::vector<int> ranks;
  if (!p) return ranks;
  for (int x; std::fscanf(p, "%d", &x) == 1;) {
    std::ifstream comm("/proc/" + std::to_string(x) + "/comm");
    std::string name;
    comm >> name;
    if (name == "weft") ranks.push_back(x);
  }
  ::pclose(p);
  return ranks;
}

struct MpiLaunchEnv : ::testing::Environment {
  void SetUp() override {
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    ::setenv("OMP_WAIT_POLICY", "passive", 1);  // ranks share the cores
  }
};

}  // namespace weft::test
