// Measuring this machine for the cost model (`weft calibrate`): the model's
// GEMMs at each tensor-parallel shard and micro-batch, its attention by T and
// D, the memory-bound kernel families at the model's sizes, and the
// collectives and point-to-point transfers over each group size, by message
// size. Every rank of the world measures at once, as every rank computes at
// once in training (ranks sharing cores slow each other; a profile measured
// alone would not know it), and each time is the slowest rank's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device_spec.h"
#include "core/layout.h"
#include "core/measured_rates.h"
#include "core/model_spec.h"
#include "core/run_spec.h"
#include "trainer/parallel/process_groups.h"

namespace weft::calibration {

struct DeviceCalibration {
  ModelSpec model;   // the shapes: C, F, H, H_kv, D, V
  RunSpec run;       // T and the compute precision
  std::vector<int64_t> tps = {1};  // tensor-parallel degrees whose shards to time
  std::vector<int64_t> mbs = {1};  // micro-batch sizes
  std::vector<AttentionKind> attention = {AttentionKind::flash, AttentionKind::materialized};
  double min_seconds = 0.05;  // each measurement repeats until it took this long (and 3 times at least)
  // Bytes of buffer copies each measurement cycles through, so that every
  // call finds its operands where training leaves them; 0: the step's
  // working set at that shard (the memory model's), at least a few caches.
  int64_t flush_bytes = 0;
  // Collectives over the group sizes that divide the world (2 .. world), of
  // 2^10 .. 2^max_log2_bytes bytes in steps of 4x.
  int max_log2_bytes = 24;
  std::function<void(const std::string&)> progress;  // a line per phase (rank 0 prints)
};

// The groups of a layout over the world (MPI on the CPU, NCCL on GPUs):
// calibration takes tp groups of n consecutive ranks and pp pairs from them.
using GroupsFor = std::function<parallel::ProcessGroups(const Layout&)>;

// Every rank calls it; `world` is the host world group the ranks agree over
// (its size is the world), `device` this rank's device (the CPU, or the
// current GPU: kernels in bf16 on a stream of it).
MeasuredRates measure_device(const DeviceCalibration& c, const DeviceSpec& device, parallel::Comm& world,
                             const GroupsFor& groups_for);

}  // namespace weft::calibration
