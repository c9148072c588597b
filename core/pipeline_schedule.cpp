#include "core/pipeline_schedule.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace weft {

const char* to_string(PipeOpKind k) {
  switch (k) {
    case PipeOpKind::forward: return "F";
    case PipeOpKind::backward: return "B";
    case PipeOpKind::recv_forward: return "recv_fwd";
    case PipeOpKind::send_forward: return "send_fwd";
    case PipeOpKind::recv_backward: return "recv_bwd";
    case PipeOpKind::send_backward: return "send_bwd";
  }
  return "?";
}

namespace {

struct Slot {
  int64_t micro_batch;
  int64_t chunk;
};

// The k-th forward (or backward) chunk-micro-batch of a stage, Megatron's order.
Slot forward_slot(int64_t k, int64_t pp, int64_t vpp) {
  if (vpp == 1) return {k, 0};
  const int64_t group = k / (pp * vpp);
  return {group * pp + k % pp, (k / pp) % vpp};
}
Slot backward_slot(int64_t k, int64_t pp, int64_t vpp) {
  Slot s = forward_slot(k, pp, vpp);
  s.chunk = vpp - 1 - s.chunk;
  return s;
}

int64_t warmup_count(int64_t pp, int64_t vpp, int64_t m, int64_t stage) {
  const int64_t total = m * vpp;
  const int64_t w = vpp == 1 ? pp - stage - 1 : (pp - stage - 1) * 2 + (vpp - 1) * pp;
  return std::min(w, total);
}

}  // namespace

int64_t pipeline_max_in_flight(int64_t pp, int64_t vpp, int64_t m, int64_t stage) {
  const int64_t total = m * vpp;
  return std::min(warmup_count(pp, vpp, m, stage) + 1, total);
}

std::vector<PipeOp> pipeline_schedule(int64_t pp, int64_t vpp, int64_t m, int64_t stage) {
  WEFT_ASSERT(pp >= 1 && vpp >= 1 && m >= 1 && stage >= 0 && stage < pp);
  WEFT_ASSERT(vpp == 1 || m % pp == 0);
  const int64_t total = m * vpp;
  // Up to six operations per micro-batch chunk; past 2^24 chunks the list
  // alone takes gigabytes, for a step no one would run.
  if (total > (int64_t{1} << 24))
    throw InputError(fmt::format("{} micro-batches per step{} make a pipeline schedule past weft's limit of 2^24; "
                                 "use a larger micro-batch or a smaller global batch",
                                 m, vpp > 1 ? fmt::format(" x {} virtual stages", vpp) : ""));
  const int64_t warmup = warmup_count(pp, vpp, m, stage);
  std::vector<PipeOp> ops;
  ops.reserve(size_t(total) * 6);

  // A chunk's input comes from the previous virtual stage: stage - 1 of the
  // same chunk, or the last stage's previous chunk when this is stage 0.
  auto forward = [&](int64_t k) {
    const Slot s = forward_slot(k, pp, vpp);
    const bool first_virtual = stage == 0 && s.chunk == 0;
    const bool last_virtual = stage == pp - 1 && s.chunk == vpp - 1;
    if (!first_virtual)
      ops.push_back({PipeOpKind::recv_forward, s.micro_batch, s.chunk, (stage + pp - 1) % pp});
    ops.push_back({PipeOpKind::forward, s.micro_batch, s.chunk, -1});
    if (!last_virtual)
      ops.push_back({PipeOpKind::send_forward, s.micro_batch, s.chunk, (stage + 1) % pp});
  };
  auto backward = [&](int64_t k) {
    const Slot s = backward_slot(k, pp, vpp);
    const bool first_virtual = stage == 0 && s.chunk == 0;
    const bool last_virtual = stage == pp - 1 && s.chunk == vpp - 1;
    if (!last_virtual)
      ops.push_back({PipeOpKind::recv_backward, s.micro_batch, s.chunk, (stage + 1) % pp});
    ops.push_back({PipeOpKind::backward, s.micro_batch, s.chunk, -1});
    if (!first_virtual)
      ops.push_back({PipeOpKind::send_backward, s.micro_batch, s.chunk, (stage + pp - 1) % pp});
  };

  int64_t next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) forward(next_f);
  while (next_f < total) {
    forward(next_f++);
    backward(next_b++);
  }
  while (next_b < total) backward(next_b++);
  return ops;
}

}  // namespace weft
