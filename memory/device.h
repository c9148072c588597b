// The few device-runtime services code written for both backends needs
// besides allocation: moving bytes between host and device, waiting for a
// stream, owning a stream, and asking the device how much memory is in use.
// On the CPU backend a copy is a memcpy and a wait does nothing. In a build
// without CUDA, anything asked of Backend::cuda throws weft::InternalError
// (callers reach it only after a device was found).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/kernel.h"

namespace weft::memory {

// Copies `bytes` from src to dst, ordered on the stream. On CUDA either side
// may be host or device memory (cudaMemcpyDefault); a copy into host memory
// is complete only after synchronize(), a copy from pageable host memory may
// reuse the source as soon as the call returns.
void copy(void* dst, const void* src, int64_t bytes, kernels::Stream stream);
// Copies `rows` rows of `width` bytes, row r from src + r * src_pitch to
// dst + r * dst_pitch, ordered on the stream (cudaMemcpy2DAsync on CUDA).
void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width, int64_t rows,
             kernels::Stream stream);

// Waits until everything queued on the stream has run.
void synchronize(kernels::Stream stream);

// A non-blocking CUDA stream of the current device, destroyed with the
// object; on the CPU backend the plain CPU stream.
class OwnedStream {
 public:
  explicit OwnedStream(kernels::Backend backend);
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  kernels::Stream get() const { return stream_; }

 private:
  kernels::Stream stream_;
};

// Host buffers the device copies from asynchronously: a copy from ordinary
// (pageable) host memory makes the driver stage it first, which can wait for
// the stream and so stall the host that should be queuing the next kernels.
// Pinned memory, in `slots` rotating buffers of `bytes`: take() hands out the
// next one after waiting, if need be, until the copy queued from it `slots`
// takes ago has run; queued() marks the copy just queued from it. On the CPU
// backend the buffers are plain memory and nothing waits.
class HostStaging {
 public:
  HostStaging(int64_t bytes, int slots, kernels::Backend backend);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  void* take();
  void queued(kernels::Stream stream);

 private:
  kernels::Backend backend_;
  int64_t bytes_;
  std::vector<void*> buffers_;
  std::vector<void*> events_;  // per slot: its last copy's completion (null: none yet)
  int next_ = 0, current_ = -1;
};

// Timing work on a stream: record_event() queues a timing event on the
// stream and returns it; seconds_between() waits for the later one and gives
// the time between them (0 if the device cannot say); release_event() frees
// one. On the CPU backend an event is the host clock at the call.
void* record_event(kernels::Stream stream);
double seconds_between(void* start, void* stop);
void release_event(void* event);

// The current device's memory as the driver sees it (cudaMemGetInfo): what
// every allocation of the process takes, the CUDA context, cuBLAS and NCCL
// workspaces included.
struct DeviceMemory {
  int64_t total = 0;
  int64_t free = 0;
  int64_t used() const { return total - free; }
};
DeviceMemory device_memory();

// This process's memory on the current device as the driver accounts it
// (NVML's count of the process, loaded at run time from the driver's
// libnvidia-ml.so.1): the CUDA context included, which device_memory() taken
// once the context exists cannot show. -1 where NVML cannot say: no driver
// library, or a PID namespace that hides this process from the driver.
int64_t device_process_bytes();

}  // namespace weft::memory
