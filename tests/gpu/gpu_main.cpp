// main of the GPU tests: exits 77 (ctest: skipped) when there is no CUDA
// device, before GoogleTest runs anything.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device (%s), skipping\n", argv[0],
                status != cudaSuccess ? cudaGetErrorString(status) : "none found");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
