#include "core/stop.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <ctime>
#include <cstdlib>
#include <string>

namespace weft {

namespace {

std::atomic<bool> g_requested{false};
std::atomic<int> g_signal{0};
std::atomic<int> g_scopes{0};
// When the first stop request came (CLOCK_MONOTONIC, ns): a second signal
// ends the process at once only this long after it, so that the two a
// launcher sends together (GNU timeout signals the process and its group)
// or a double key press still get their checkpoint.
std::atomic<int64_t> g_first_ns{0};
constexpr int64_t kSecondSignalAfterNs = 1'000'000'000;

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Set once at install, read by the handlers.
pthread_t g_main_thread;
// A rank of Open MPI's mpirun whose output is the pseudo-terminal mpirun
// gives it. On Ctrl-C mpirun starts aborting the job, signals the ranks from
// their parent process (mpirun, or the node's orted) and stops reading those
// terminals, so a rank that writes a log line then blocks for good (until
// mpirun's SIGKILL) and never reaches its checkpoint.
bool g_mpirun_terminal = false;

// The main thread's nudge: interrupts a write blocked on the terminal, which
// SA_RESTART then re-issues on the same descriptor, by now /dev/null.
extern "C" void on_nudge(int) {}

extern "C" void on_stop_signal(int sig, siginfo_t* info, void*) {
  // Only async-signal-safe calls here: atomics, signal(), raise(), write(),
  // clock_gettime(), getppid(), open(), dup2(), close() and pthread_kill().
  if (g_scopes.load() == 0 || (g_requested.load() && monotonic_ns() - g_first_ns.load() >= kSecondSignalAfterNs)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  if (g_requested.load()) return;  // a second signal right after the first: the same request
  g_first_ns.store(monotonic_ns());
  g_signal.store(sig);
  g_requested.store(true);
  if (g_mpirun_terminal && info && info->si_code == SI_USER && info->si_pid == ::getppid()) {
    // mpirun is aborting: nothing written from here on reaches anyone, so
    // output goes to /dev/null and no write can block the way to the
    // checkpoint; a write already blocked is re-issued there. (A signal
    // sent to the rank by anyone else leaves the output as it is.)
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::close(null);
    }
    if (!pthread_equal(pthread_self(), g_main_thread)) pthread_kill(g_main_thread, SIGURG);
    return;
  }
  static const char msg[] =
      "\nweft: stopping at the next safe point (a signal again, a second or more from now, stops at once)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
}

}  // namespace

void stop_handlers_install() {
  static const bool installed = [] {
    g_main_thread = pthread_self();
    g_mpirun_terminal = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr && ::isatty(STDOUT_FILENO);
    struct sigaction sa {};
    sa.sa_sigaction = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    // Not SA_RESTART: a blocking read or wait returns EINTR and the caller
    // gets to look at the flag. Under mpirun's terminals SA_RESTART, so a
    // write blocked on one is re-issued to /dev/null (see on_stop_signal)
    // rather than failing; weft's waits there poll the flag anyway.
    sa.sa_flags = SA_SIGINFO | (g_mpirun_terminal ? SA_RESTART : 0);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    if (g_mpirun_terminal) {
      struct sigaction nudge {};
      nudge.sa_handler = on_nudge;
      sigemptyset(&nudge.sa_mask);
      nudge.sa_flags = SA_RESTART;
      sigaction(SIGURG, &nudge, nullptr);
    }
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
