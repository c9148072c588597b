// The CUDA backend's side of the launch protocol and its infrastructure:
// bf16 runs only on CUDA streams, float only on the CPU (apart from the fp32
// elementwise ops on bf16 training's main gradients); invalid params and
// short workspaces are refused without launching; CUDA_CHECK throws a
// CudaError naming the call; the device allocator backs an arena with
// zero-filled device memory.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/elementwise/elementwise.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "memory/arena.h"
#include "memory/device.h"
#include "tests/gpu/gpu_test_util.h"

namespace weft::kernels::test {
namespace {

TEST(GpuProtocol, BackendRouting) {
  DeviceArray<bf16> x(64);
  const FillParams<bf16> fill{64, 1.0, x.data()};
  EXPECT_TRUE(supports(fill, Backend::cuda));
  EXPECT_FALSE(supports(fill, Backend::cpu));
  EXPECT_EQ(launch(fill, Workspace{}, Stream{}), Status::unsupported);

  std::vector<float> host(64);
  const AddParams<float> add_cpu{64, host.data(), host.data(), host.data()};
  EXPECT_FALSE(supports(add_cpu, Backend::cuda));
  EXPECT_EQ(launch(add_cpu, Workspace{}, make_cuda_stream(gpu_stream())), Status::unsupported);
  // The fp32 fill is one of the few float ops that also run on CUDA.
  DeviceArray<float> main_grad(64);
  EXPECT_TRUE(supports(FillParams<float>{64, 0.0, main_grad.data()}, Backend::cuda));
}

TEST(GpuProtocol, RefusalsDoNotLaunch) {
  DeviceArray<bf16> x(64);
  EXPECT_FALSE(supports(FillParams<bf16>{-1, 1.0, x.data()}, Backend::cuda));
  EXPECT_EQ(launch(FillParams<bf16>{-1, 1.0, x.data()}, Workspace{}, make_cuda_stream(gpu_stream())),
            Status::invalid_argument);
  // A sum of squares needs its partial sums' workspace.
  DeviceArray<double> sum(1);
  const SumSquaresParams<bf16> sq{40000, x.data(), sum.data()};
  ASSERT_GT(workspace_bytes(sq, Backend::cuda), 0);
  EXPECT_EQ(workspace_bytes(sq, Backend::cpu), 0);
  EXPECT_EQ(launch(sq, Workspace{}, make_cuda_stream(gpu_stream())), Status::invalid_argument);
  // Nothing ran: the output keeps its poison.
  EXPECT_EQ(x.download()[0].bits, 0xffff);
}

TEST(GpuProtocol, CudaCheckNamesTheCall) {
  try {
    CUDA_CHECK(cudaSetDevice(1 << 20));
    FAIL() << "cudaSetDevice accepted an absurd device";
  } catch (const gpu::CudaError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaSetDevice"), std::string::npos) << what;
    EXPECT_NE(what.find("test_gpu_protocol.cpp"), std::string::npos) << what;
  }
  (void)cudaGetLastError();
}

TEST(GpuProtocol, DeviceArena) {
  memory::Arena arena(memory::device_allocator());
  arena.reserve(int64_t{1} << 20);
  auto* p = arena.allocate_as<bf16>(memory::Category::activations, 1000, "test tensor");
  std::vector<bf16> host(1000, bf16{0xffff});
  CUDA_CHECK(cudaMemcpy(host.data(), p, host.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  for (bf16 v : host) ASSERT_EQ(v.bits, 0);
  ASSERT_EQ(run_cuda(FillParams<bf16>{1000, 2.0, p}), Status::ok);
  arena.release(p);
  auto* q = arena.allocate_as<bf16>(memory::Category::activations, 1000, "reused piece");
  CUDA_CHECK(cudaMemcpy(host.data(), q, host.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  for (bf16 v : host) ASSERT_EQ(v.bits, 0) << "a reused piece is zero-filled again";
  // More than the device holds is refused, not thrown from CUDA.
  memory::Arena huge(memory::device_allocator());
  EXPECT_THROW(huge.reserve(int64_t{1} << 50), memory::OutOfMemory);
}

// The driver's count of this process (NVML): the CUDA context already in
// it, and 256 MiB more once they are allocated. Where NVML cannot say (no
// driver library, a PID namespace) -1, and the trainer falls back to
// cudaMemGetInfo; the test says which.
TEST(GpuProtocol, DeviceProcessBytesCountTheContextAndAllocations) {
  const int64_t before = memory::device_process_bytes();
  if (before < 0) GTEST_SKIP() << "NVML gives no count for this process here";
  std::printf("[ process ] %.1f MiB on the device before the allocation (the CUDA context and earlier tests)\n",
              double(before) / double(1 << 20));
  EXPECT_GT(before, int64_t{1} << 20);  // a context is tens to hundreds of MiB
  void* p = nullptr;
  const int64_t bytes = int64_t{256} << 20;
  CUDA_CHECK(cudaMalloc(&p, size_t(bytes)));
  const int64_t after = memory::device_process_bytes();
  CUDA_CHECK(cudaFree(p));
  EXPECT_GE(after - before, bytes);
  EXPECT_LE(after - before, bytes + (int64_t{8} << 20));  // the driver's granularity
}

}  // namespace
}  // namespace weft::kernels::test
