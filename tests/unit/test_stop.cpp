// Stop requests from signals (core/stop.h), in a child process each: inside a
// StopScope a signal only raises the flag; a second one ends the process at
// once only when it comes a second or more after the first, so that two
// signals sent together still let the run save its checkpoint.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "core/stop.h"

namespace weft {
namespace {

// Two signals back to back are one request: the process lives on, stopping.
TEST(StopDeathTest, TwoSignalsTogetherAreOneRequest) {
  EXPECT_EXIT(
      {
        stop_handlers_install();
        StopScope scope;
        ::kill(::getpid(), SIGINT);
        ::kill(::getpid(), SIGINT);
        ::kill(::getpid(), SIGTERM);
        std::_Exit(stop_requested() && stop_exit_code() == 130 ? 7 : 1);
      },
      testing::ExitedWithCode(7), "stopping at the next safe point");
}

// A second signal a second after the first ends the process at once.
TEST(StopDeathTest, ASecondSignalLaterStopsAtOnce) {
  EXPECT_EXIT(
      {
        stop_handlers_install();
        StopScope scope;
        ::kill(::getpid(), SIGINT);
        std::this_thread::sleep_for(std::chrono::milliseconds(1100));
        ::kill(::getpid(), SIGINT);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::_Exit(3);
      },
      testing::KilledBySignal(SIGINT), "");
}

// Outside any scope a signal keeps its default action.
TEST(StopDeathTest, OutsideAScopeASignalEndsTheProcess) {
  EXPECT_EXIT(
      {
        stop_handlers_install();
        ::kill(::getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::_Exit(3);
      },
      testing::KilledBySignal(SIGTERM), "");
}

}  // namespace
}  // namespace weft
