// Host helpers of the CUDA backend (launch geometry) and the one kernel
// shared by families: the validity check of token ids.
//
// The id check is a grid-stride pass that keeps the smallest offending
// position with atomicMin on one 64-bit slot, so the first offender is
// reported whatever the block order; a valid batch costs one read of the ids
// (4 bytes a token) and one 8-byte copy back.
#include <climits>

#include "kernels/cuda_common.cuh"

namespace weft::kernels::gpu {

int sm_count() {
  int device = 0, count = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

int64_t grid_blocks(int64_t items, int threads) {
  const int64_t wanted = (items + threads - 1) / threads;
  const int64_t resident = int64_t(sm_count()) * (kMaxThreadsPerSm / threads);
  const int64_t blocks = wanted < resident ? wanted : resident;
  return blocks < 1 ? 1 : blocks;
}

namespace {

constexpr int kIdThreads = 256;

__global__ void __launch_bounds__(kIdThreads)
    first_invalid_kernel(const int32_t* ids,  // (n)
                         int64_t n, int64_t V, int64_t ignore,
                         unsigned long long* first) {  // one value: the smallest bad position
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t id = ids[i];
    if (id != ignore && (id < 0 || id >= V)) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // later positions of this thread cannot be smaller
    }
  }
}

}  // namespace

InvalidId first_invalid_id(const int32_t* ids, int64_t n, int64_t V, int64_t ignore, void* scratch,
                           cudaStream_t stream) {
  if (n == 0) return {};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return {};
  auto* first = static_cast<unsigned long long*>(scratch);
  // All ones: larger than any position, so atomicMin keeps the first offender.
  CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof *first, stream));
  first_invalid_kernel<<<grid_blocks(n, kIdThreads), kIdThreads, 0, stream>>>(ids, n, V, ignore,
                                                                                first);
  WEFT_LAUNCH_CHECK(stream, "first_invalid_kernel");
  unsigned long long position = 0;
  CUDA_CHECK(cudaMemcpyAsync(&position, first, sizeof position, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (position == ULLONG_MAX) return {};
  InvalidId bad{static_cast<int64_t>(position), 0};
  CUDA_CHECK(cudaMemcpy(&bad.id, ids + bad.position, sizeof bad.id, cudaMemcpyDeviceToHost));
  return bad;
}

}  // namespace weft::kernels::gpu
