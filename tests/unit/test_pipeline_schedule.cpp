// Property tests of the pipeline schedule over a grid of (pp, vpp, m).
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "core/pipeline_schedule.h"
#include "test_util.h"

namespace weft {
namespace {

struct Case {
  int64_t pp, vpp, m;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t pp : {1, 2, 3, 4, 8})
    for (int64_t vpp : {1, 2, 3, 4})
      for (int64_t m : {1, 2, 3, 4, 5, 8, 12, 16}) {
        if (vpp > 1 && (pp == 1 || m % pp != 0)) continue;
        out.push_back({pp, vpp, m});
      }
  return out;
}

std::string name(const Case& c) { return fmt::format("pp={} vpp={} m={}", c.pp, c.vpp, c.m); }

TEST(PipelineSchedule, EveryChunkRunsForwardThenBackwardOnce) {
  for (const auto& c : cases()) {
    for (int64_t s = 0; s < c.pp; ++s) {
      std::set<std::pair<int64_t, int64_t>> fwd, bwd;
      for (const auto& op : pipeline_schedule(c.pp, c.vpp, c.m, s)) {
        const auto key = std::make_pair(op.micro_batch, op.chunk);
        if (op.kind == PipeOpKind::forward) {
          EXPECT_TRUE(fwd.insert(key).second) << name(c);
        } else if (op.kind == PipeOpKind::backward) {
          EXPECT_TRUE(fwd.count(key)) << name(c) << " backward before forward";
          EXPECT_TRUE(bwd.insert(key).second) << name(c);
        }
      }
      EXPECT_EQ(int64_t(fwd.size()), c.m * c.vpp) << name(c);
      EXPECT_EQ(int64_t(bwd.size()), c.m * c.vpp) << name(c);
    }
  }
}

TEST(PipelineSchedule, InFlightNeverExceedsTheMemoryModel) {
  for (const auto& c : cases()) {
    for (int64_t s = 0; s < c.pp; ++s) {
      int64_t live = 0, peak = 0;
      for (const auto& op : pipeline_schedule(c.pp, c.vpp, c.m, s)) {
        if (op.kind == PipeOpKind::forward) peak = std::max(peak, ++live);
        if (op.kind == PipeOpKind::backward) --live;
      }
      EXPECT_EQ(live, 0);
      EXPECT_EQ(peak, pipeline_max_in_flight(c.pp, c.vpp, c.m, s)) << name(c) << " stage " << s;
      if (c.vpp == 1) {
        EXPECT_EQ(peak, std::min(c.pp - s, c.m)) << name(c);
      }
    }
  }
}

// Sends on one stage match receives on the neighbour, in the same order per
// (direction, channel), and also per ordered pair of stages with forward and
// backward messages together: NCCL matches a pair's messages by their order
// alone (no tags), and with two stages (or the interleaved wrap-around) one
// pair carries both kinds.
TEST(PipelineSchedule, SendsMatchReceives) {
  for (const auto& c : cases()) {
    std::map<std::pair<int64_t, int64_t>, std::vector<std::tuple<int64_t, int64_t, bool>>> sent_pair, recvd_pair;
    std::map<std::tuple<int64_t, int64_t, bool>, std::vector<std::pair<int64_t, int64_t>>> sent, recvd;
    for (int64_t s = 0; s < c.pp; ++s)
      for (const auto& op : pipeline_schedule(c.pp, c.vpp, c.m, s)) {
        const bool fwd = op.kind == PipeOpKind::send_forward || op.kind == PipeOpKind::recv_forward;
        if (op.kind == PipeOpKind::send_forward || op.kind == PipeOpKind::send_backward) {
          EXPECT_EQ(op.peer, fwd ? (s + 1) % c.pp : (s + c.pp - 1) % c.pp) << name(c);
          // The receiver sees the data under its own chunk index.
          const int64_t chunk = fwd ? (s == c.pp - 1 ? op.chunk + 1 : op.chunk)
                                    : (s == 0 ? op.chunk - 1 : op.chunk);
          sent[{s, op.peer, fwd}].push_back({op.micro_batch, chunk});
          sent_pair[{s, op.peer}].push_back({op.micro_batch, chunk, fwd});
        } else if (op.kind == PipeOpKind::recv_forward || op.kind == PipeOpKind::recv_backward) {
          recvd[{op.peer, s, fwd}].push_back({op.micro_batch, op.chunk});
          recvd_pair[{op.peer, s}].push_back({op.micro_batch, op.chunk, fwd});
        }
      }
    EXPECT_EQ(sent, recvd) << name(c);
    EXPECT_EQ(sent_pair, recvd_pair) << name(c);
  }
}

// Walks all stages together with buffered sends and blocking receives: every
// stage must reach its end (no deadlock) and compute only on data it has.
TEST(PipelineSchedule, ExecutesWithoutDeadlock) {
  for (const auto& c : cases()) {
    std::vector<std::vector<PipeOp>> ops(size_t(c.pp));
    std::vector<size_t> pc(size_t(c.pp), 0);
    for (int64_t s = 0; s < c.pp; ++s) ops[size_t(s)] = pipeline_schedule(c.pp, c.vpp, c.m, s);
    std::map<std::tuple<int64_t, int64_t, bool>, std::deque<int64_t>> channel;
    bool progress = true;
    while (progress) {
      progress = false;
      for (int64_t s = 0; s < c.pp; ++s) {
        auto& i = pc[size_t(s)];
        while (i < ops[size_t(s)].size()) {
          const auto& op = ops[size_t(s)][i];
          const bool fwd = op.kind == PipeOpKind::send_forward || op.kind == PipeOpKind::recv_forward;
          if (op.kind == PipeOpKind::send_forward || op.kind == PipeOpKind::send_backward) {
            channel[{s, op.peer, fwd}].push_back(op.micro_batch);
          } else if (op.kind == PipeOpKind::recv_forward || op.kind == PipeOpKind::recv_backward) {
            auto& q = channel[{op.peer, s, fwd}];
            if (q.empty()) break;
            EXPECT_EQ(q.front(), op.micro_batch) << name(c);
            q.pop_front();
          }
          ++i;
          progress = true;
        }
      }
    }
    for (int64_t s = 0; s < c.pp; ++s)
      EXPECT_EQ(pc[size_t(s)], ops[size_t(s)].size()) << name(c) << " stage " << s << " deadlocked";
  }
}

TEST(PipelineSchedule, InterleavingShrinksWarmupPerChunk) {
  // With vpp chunks, stage 0 holds more chunk-micro-batches but each is
  // 1/vpp of the stage: (pp*(vpp+1) - 1) / vpp stage-micro-batches in flight.
  const int64_t pp = 4, m = 16;
  EXPECT_EQ(pipeline_max_in_flight(pp, 1, m, 0), 4);
  EXPECT_EQ(pipeline_max_in_flight(pp, 2, m, 0), 11);
  EXPECT_EQ(pipeline_max_in_flight(pp, 1, 2, 0), 2);
}

}  // namespace
}  // namespace weft
