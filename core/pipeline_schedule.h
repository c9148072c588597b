// The pipeline schedule as data: for each stage, the ordered list of forward,
// backward, send and receive operations of one optimizer step. An executor
// walks it; the memory model reads in-flight micro-batches from it.
//
// 1F1B (vpp = 1): stage s runs min(pp - s - 1, m) warm-up forwards, then
// alternates one forward and one backward, then drains the backwards, so it
// never holds more than min(pp - s, m) micro-batches' activations.
// Interleaved 1F1B (vpp > 1, m divisible by pp): each stage holds vpp model
// chunks; stage s holds chunk c = layers of virtual stage c * pp + s. The order
// of forwards walks chunks in groups of pp micro-batches, warm-up is
// (pp - s - 1) * 2 + (vpp - 1) * pp chunk-forwards, which divides the bubble by
// vpp at the cost of more activations in flight.
#pragma once

#include <cstdint>
#include <vector>

namespace weft {

enum class PipeOpKind { forward, backward, recv_forward, send_forward, recv_backward, send_backward };

struct PipeOp {
  PipeOpKind kind;
  int64_t micro_batch;  // 0 .. m-1
  int64_t chunk;        // model chunk on this stage, 0 .. vpp-1
  int64_t peer;         // the other stage of a send/recv; -1 for compute
};

// Ordered operations of `stage` (0 .. pp-1) for m micro-batches.
// Requires pp >= 1, vpp >= 1, m >= 1, and m % pp == 0 when vpp > 1.
std::vector<PipeOp> pipeline_schedule(int64_t pp, int64_t vpp, int64_t m, int64_t stage);

// The most chunk-micro-batches whose activations `stage` holds at once when it
// follows pipeline_schedule (a closed form, checked against the schedule by the
// tests). Each chunk-micro-batch holds the activations of L / (pp * vpp) layers.
int64_t pipeline_max_in_flight(int64_t pp, int64_t vpp, int64_t m, int64_t stage);

const char* to_string(PipeOpKind k);

}  // namespace weft
