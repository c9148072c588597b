// What the tests that launch mpirun themselves share: the environment OpenMPI
// wants when run as root on a machine with fewer cores than ranks.
#pragma once

#include <cstdlib>

#include <gtest/gtest.h>

namespace weft::test {

struct MpiLaunchEnv : ::testing::Environment {
  void SetUp() override {
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    ::setenv("OMP_WAIT_POLICY", "passive", 1);  // ranks share the cores
  }
};

}  // namespace weft::test
