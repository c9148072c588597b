#include "core/stop.h"

#include <unistd.h>

#include <csignal>
#include <string>

namespace weft {

namespace {

std::atomic<bool> g_requested{false};
std::atomic<int> g_signal{0};
std::atomic<int> g_scopes{0};

extern "C" void on_stop_signal(int sig) {
  // Only async-signal-safe calls here: atomics, signal() and raise().
  if (g_scopes.load() == 0 || g_requested.load()) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_signal.store(sig);
  g_requested.store(true);
  static const char msg[] = "\nweft: stopping at the next safe point (signal again to stop at once)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
}

}  // namespace

void stop_handlers_install() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    // Not SA_RESTART: a blocking read or wait returns EINTR and the caller
    // gets to look at the flag.
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    return true;
  }();
  (void)installed;
}

bool stop_requested() { return g_requested.load(std::memory_order_relaxed); }

const std::atomic<bool>& stop_flag() { return g_requested; }

int stop_exit_code() { return g_requested.load() ? 128 + g_signal.load() : 0; }

const char* stop_signal_name() {
  if (!g_requested.load()) return "";
  return g_signal.load() == SIGTERM ? "SIGTERM" : g_signal.load() == SIGINT ? "SIGINT" : "a signal";
}

void stop_request_for_test(int signal) {
  g_signal.store(signal);
  g_requested.store(true);
}

void stop_clear_for_test() {
  g_requested.store(false);
  g_signal.store(0);
}

StopScope::StopScope() { g_scopes.fetch_add(1); }
StopScope::~StopScope() { g_scopes.fetch_sub(1); }

StopRequested::StopRequested()
    : Error(std::string("stopped by ") + stop_signal_name()) {}

void stop_check() {
  if (stop_requested()) throw StopRequested();
}

}  // namespace weft
