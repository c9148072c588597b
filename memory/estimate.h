// The memory model: bytes per category on every pipeline stage of a layout,
// the worst stage, and whether it fits the device with a stated margin.
// Built by summing memory::stage_shapes, the same table the trainer allocates.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/shapes.h"

namespace weft::memory {

struct MemoryOptions {
  // Fraction of device memory kept free for allocator fragmentation and
  // transient library allocations; a layout fits when its worst stage needs at
  // most (1 - margin) of the device.
  double margin = 0.05;
  // Evaluate every stage (reports) or only those that bound all others (the
  // tuner's fast path): the first and last (an even split's middle stage
  // holds no embedding/head and fewer micro-batches in flight than stage 0),
  // and stage 1 where only the first and last virtual stage are uneven.
  bool all_stages = false;
};

struct StageMemory {
  int64_t stage = 0;
  int64_t layers = 0;
  int64_t in_flight_chunks = 0;
  std::array<int64_t, kCategories> bytes{};
  int64_t total = 0;
};

struct MemoryEstimate {
  std::vector<StageMemory> stages;  // stage 0 first
  int64_t worst = 0;                // index into stages
  int64_t capacity = 0;             // device memory
  int64_t usable = 0;               // capacity minus margin
  double margin = 0;
  bool fits = false;
  Category binding = Category::activations;  // largest category of the worst stage
  std::string reason;               // empty when it fits

  const StageMemory& worst_stage() const { return stages[size_t(worst)]; }
  int64_t peak() const { return worst_stage().total; }
};

MemoryEstimate estimate(const ModelSpec& m, const RunSpec& run, const Layout& l,
                        const DeviceSpec& device, const MemoryOptions& opt = {});

// Refuses a chosen layout (InputError) whose worst stage the memory model
// predicts needs more than the whole device has (`device.memory_bytes`: a
// GPU's memory, or this rank's share of the machine's memory on the CPU),
// naming the predicted and the available bytes and the layout; called before
// anything large is allocated. The margin is not applied: a run predicted
// inside it may still fit, one predicted past the device cannot.
// `capacity_note` says where the device's memory figure came from when the
// caller capped it (e.g. "--memory-limit 2GiB"); empty: the device's own.
void require_fits(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                  const std::string& capacity_note = "");

// Pinned host memory that the MPI device communicator stages one rank's
// messages through, on `stage`, where ranks share a GPU (device.shared_by >
// 1, a GPU run over several ranks): host memory, not the device's, so apart
// from the categories. Its buffers are reused and grow to the largest
// message they carry, and an operation's buffer can be held while a pending
// send or receive holds another: twice the stage's largest message. The
// messages: the gradients' reduction over dp x cp (every parameter of the
// stage in the gradient type), ZeRO-1 and -2's gather of the weights (in the
// compute type), a tensor-parallel sum of activations (B T C), and the
// table's communication buffers. 0 where the GPU is not shared.
int64_t host_staging_bytes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                           int64_t stage);

}  // namespace weft::memory
