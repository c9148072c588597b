// The choice of a GPU run's communicator from which GPU each rank holds, with
// no MPI and no GPU: NCCL for a GPU per rank, the MPI device communicator
// where ranks share one, and the requests each case refuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "trainer/parallel/device_comm.h"

namespace weft::parallel {
namespace {

// Rank r holds GPU gpus[r] (a 16-byte UUID, here a letter repeated).
std::vector<std::string> held(const std::string& gpus) {
  std::vector<std::string> out;
  for (char g : gpus) out.emplace_back(16, g);
  return out;
}

TEST(DeviceComm, AutoTakesNcclWhenEveryRankHasAGpuOfItsOwn) {
  const auto c = device_comm_decide("auto", held("abcdefgh"), true);
  EXPECT_EQ(c.kind, DeviceCommKind::nccl);
  EXPECT_EQ(c.ranks_per_device, 1);
  EXPECT_NE(c.why.find("8 ranks has a GPU of its own"), std::string::npos) << c.why;
}

TEST(DeviceComm, AutoTakesMpiWhereRanksShareAGpuAndSaysWhich) {
  const auto one = device_comm_decide("auto", held("aa"), true);
  EXPECT_EQ(one.kind, DeviceCommKind::mpi);
  EXPECT_EQ(one.ranks_per_device, 2);
  EXPECT_NE(one.why.find("ranks 0 and 1 share one GPU"), std::string::npos) << one.why;
  EXPECT_NE(one.why.find("not speed"), std::string::npos) << one.why;
  // Four ranks on two GPUs, taken in turn: 2 a GPU.
  const auto two = device_comm_decide("auto", held("abab"), true);
  EXPECT_EQ(two.kind, DeviceCommKind::mpi);
  EXPECT_EQ(two.ranks_per_device, 2);
  EXPECT_NE(two.why.find("ranks 0 and 2 share one GPU (2 GPUs for 4 ranks)"), std::string::npos) << two.why;
  // The most ranks on any GPU count, wherever they are.
  EXPECT_EQ(device_comm_decide("auto", held("abcbdb"), true).ranks_per_device, 3);
  EXPECT_NE(device_comm_decide("auto", held("aaaaaaaa"), true).why.find("ranks 0, 1, 2, ... (8 ranks)"),
            std::string::npos);
}

TEST(DeviceComm, WithoutNcclEveryMultiRankGpuRunGoesOverMpi) {
  const auto c = device_comm_decide("auto", held("ab"), false);
  EXPECT_EQ(c.kind, DeviceCommKind::mpi);
  EXPECT_NE(c.why.find("no NCCL"), std::string::npos) << c.why;
  try {
    device_comm_decide("nccl", held("ab"), false);
    FAIL() << "nccl accepted in a build without it";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("this build has no NCCL"), std::string::npos) << e.what();
  }
}

TEST(DeviceComm, NcclOnASharedGpuIsRefusedWithTheRanksAndTheWayOut) {
  try {
    device_comm_decide("nccl", held("abb"), true);
    FAIL() << "nccl accepted on a shared GPU";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ranks 1 and 2 share one GPU"), std::string::npos) << what;
    EXPECT_NE(what.find("--comm mpi or auto"), std::string::npos) << what;
  }
  EXPECT_EQ(device_comm_decide("nccl", held("abc"), true).kind, DeviceCommKind::nccl);
}

TEST(DeviceComm, MpiIsTakenWhenAskedForEvenWithAGpuEach) {
  const auto c = device_comm_decide("mpi", held("ab"), true);
  EXPECT_EQ(c.kind, DeviceCommKind::mpi);
  EXPECT_EQ(c.ranks_per_device, 1);
  EXPECT_NE(c.why.find("asked for (--comm mpi)"), std::string::npos) << c.why;
}

TEST(DeviceComm, OtherRequestsAreRefusedNamingTheValidOnes) {
  for (const char* bad : {"", "NCCL", "gloo", "auto "}) {
    try {
      device_comm_check_request(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("nccl"), std::string::npos) << what;
      EXPECT_NE(what.find("auto"), std::string::npos) << what;
    }
  }
  EXPECT_THROW(device_comm_decide("ring", held("a"), true), InputError);
}

}  // namespace
}  // namespace weft::parallel
