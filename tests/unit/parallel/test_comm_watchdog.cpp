// CommWatchdog without MPI: the timeout fires with a message naming the call
// and group that hung, progress keeps it quiet, disarming stops it. The
// process-exiting path is checked under mpirun in tests/mpi.
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"
#include "trainer/parallel/comm_watchdog.h"
#include "trainer/parallel/process_groups.h"

namespace weft::parallel {
namespace {

using namespace std::chrono_literals;

// A group of two whose recv blocks until release(), like a peer that died.
class HangingComm final : public Comm {
 public:
  int64_t size() const override { return 2; }
  int64_t rank() const override { return 0; }
  std::string name() const override { return "hanging"; }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void all_gather(const void*, void*, int64_t, DType) override {}
  void reduce_scatter(const void*, void*, int64_t, DType) override {}
  void all_gather_v(const void*, void*, std::span<const int64_t>, DType) override {}
  void reduce_scatter_v(const void*, void*, std::span<const int64_t>, DType) override {}
  void broadcast(void*, int64_t, DType, int64_t) override {}
  void send(const void*, int64_t, DType, int64_t, int64_t) override {}
  void recv(void*, int64_t, DType, int64_t, int64_t) override { released_.get_future().wait(); }
  std::unique_ptr<CommRequest> isend(const void*, int64_t, DType, int64_t, int64_t) override {
    return nullptr;
  }
  std::unique_ptr<CommRequest> irecv(void*, int64_t, DType, int64_t, int64_t) override {
    return nullptr;
  }
  void barrier() override {}
  void release() { released_.set_value(); }

 private:
  std::promise<void> released_;
};

struct Fired {
  std::mutex mu;
  std::vector<std::string> messages;
  CommWatchdog::OnTimeout callback() {
    return [this](const std::string& m) {
      std::lock_guard lk(mu);
      messages.push_back(m);
    };
  }
  size_t count() {
    std::lock_guard lk(mu);
    return messages.size();
  }
};

TEST(CommWatchdog, FiresOnAHungCallAndNamesIt) {
  ProcessGroups g = single_process_groups();
  auto hanging = std::make_unique<HangingComm>();
  HangingComm* h = hanging.get();
  g.pp = h;
  g.owned.push_back(std::move(hanging));

  std::promise<std::string> fired;
  CommWatchdog w(0.2, [&](const std::string& m) {
    fired.set_value(m);
    h->release();
  });
  w.watch(g);
  const auto start = std::chrono::steady_clock::now();
  {
    CommWatchdog::Scope armed(w, "step 3");
    float x = 0;
    g.tp->all_reduce(&x, 1);
    g.pp->recv(&x, 1, 1, 0);  // returns once the watchdog has fired
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string m = fired.get_future().get();
  EXPECT_EQ(m, "rank 0: no progress in 0.2 s in recv on the pp group; another rank may have died");
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 10.0);
  EXPECT_FALSE(w.armed());
}

TEST(CommWatchdog, MessageAfterACallNamesTheLastOne) {
  ProcessGroups g = single_process_groups();
  CommWatchdog w(5.0, [](const std::string&) {});
  w.watch(g);
  w.arm("step 7");
  EXPECT_NE(w.timeout_message().find("in step 7 (no communication call running"), std::string::npos)
      << w.timeout_message();
  double x = 1;
  g.dp->all_reduce(&x, 1, ReduceOp::max);
  EXPECT_NE(w.timeout_message().find(
                "rank 0: no progress in 5 s in step 7 after all_reduce on the dp group"),
            std::string::npos)
      << w.timeout_message();
  w.call_begin("all_gather", "tp");
  EXPECT_EQ(w.timeout_message(),
            "rank 0: no progress in 5 s in all_gather on the tp group; another rank may have died");
  w.call_end();
  w.disarm();
}

// A wait for the GPU is named while it lasts, a host call inside it more
// precisely, and its time is not communication time.
TEST(CommWatchdog, WaitingNamesTheWaitAndCountsNoCommunication) {
  ProcessGroups g = single_process_groups();
  CommWatchdog w(5.0, [](const std::string&) {});
  w.watch(g);
  w.arm("step 2");
  {
    CommWatchdog::Waiting waiting(&w, "a wait for the GPU");
    EXPECT_EQ(w.timeout_message(), "rank 0: no progress in 5 s in a wait for the GPU; another rank may have died");
    w.call_begin("all_reduce", "dp");
    EXPECT_EQ(w.timeout_message(),
              "rank 0: no progress in 5 s in all_reduce on the dp group; another rank may have died");
    w.call_end();
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(w.timeout_message(), "rank 0: no progress in 5 s in a wait for the GPU; another rank may have died");
  }
  EXPECT_NE(w.timeout_message().find("in step 2 after all_reduce on the dp group"), std::string::npos)
      << w.timeout_message();
  EXPECT_LT(w.comm_seconds(), 0.04);
  { CommWatchdog::Waiting nothing(nullptr, "ignored"); }
  w.disarm();
}

TEST(CommWatchdog, CallsKeepItQuiet) {
  ProcessGroups g = single_process_groups();
  Fired fired;
  CommWatchdog w(1.0, fired.callback());
  w.watch(g);
  {
    CommWatchdog::Scope armed(w);
    for (int i = 0; i < 75; ++i) {  // 1.5 s in all, 20 ms of silence at a time
      std::this_thread::sleep_for(20ms);
      int32_t v = i;
      g.world->all_reduce(&v, 1);
    }
  }
  EXPECT_EQ(fired.count(), 0u);
}

TEST(CommWatchdog, DisarmedNeverFires) {
  Fired fired;
  CommWatchdog w(0.2, fired.callback());
  w.arm();
  w.disarm();
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(fired.count(), 0u);
  // Re-arming starts a fresh deadline.
  w.arm();
  for (int i = 0; i < 500 && fired.count() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(fired.count(), 1u);
}

TEST(CommWatchdog, SharedCommunicatorsShareOneWrapper) {
  ProcessGroups g;
  g.owned.push_back(single_rank_comm());
  g.world = g.tp = g.pp = g.dp = g.owned[0].get();
  CommWatchdog w(5.0, [](const std::string&) {});
  w.watch(g);
  EXPECT_NE(g.world, g.owned[0].get());
  EXPECT_EQ(g.world, g.tp);
  EXPECT_EQ(g.tp, g.dp);
  EXPECT_EQ(g.owned.size(), 2u);
}

TEST(CommWatchdog, RejectsANonPositiveTimeout) {
  WEFT_EXPECT_THROW_MSG(CommWatchdog(0.0), InputError, "positive", "0 s");
  WEFT_EXPECT_THROW_MSG(CommWatchdog(-1.0), InputError, "-1 s");
}

TEST(SingleRankComm, UnevenAndNonBlockingVariants) {
  auto c = single_rank_comm();
  const std::vector<int64_t> counts{3};
  const float in[3] = {1, 2, 3};
  float out[3] = {};
  c->all_gather_v(in, out, counts);
  EXPECT_EQ(out[2], 3.0f);
  float out2[3] = {};
  c->reduce_scatter_v(in, out2, counts);
  EXPECT_EQ(out2[1], 2.0f);
  EXPECT_THROW(c->isend(in, 3, 0, 0), InternalError);
  EXPECT_THROW(c->irecv(out, 3, 0, 0), InternalError);
  EXPECT_STREQ(to_string(DType::i64), "i64");
}

TEST(CallCheck, ReportsRankCallFileAndLine) {
  const auto describe = [](int status) {
    return status == 0 ? std::string() : std::string("boom");
  };
  set_process_rank(5);
  WEFT_CALL_CHECK("FAKE", describe, 0);
  try {
    WEFT_CALL_CHECK("FAKE", describe, 1 + 2);
    ADD_FAILURE() << "expected a CommError";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 5: FAKE call 1 + 2 failed at "), std::string::npos) << m;
    EXPECT_NE(m.find("test_comm_watchdog.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find(": boom"), std::string::npos) << m;
  }
  set_process_rank(-1);
}

}  // namespace
}  // namespace weft::parallel
