// Stop requests from SIGINT and SIGTERM.
//
// Long work (tuning, training, validation, data preparation, evaluation)
// runs inside a StopScope: there a signal only raises a flag, and the work
// checks it at its next safe point (a step, a validation sample, a document),
// writes what must not be lost (a checkpoint, the journal, a report) and
// returns; the command then exits 130 (SIGINT) or 143 (SIGTERM). Outside
// any scope the signal's default action ends the process at once, as before:
// there is nothing half-done to save. A second signal inside a scope ends
// the process at once too, for a user who will not wait, when it comes at
// least a second after the first: two signals within a second (a double
// key press, or GNU timeout signalling the process and then its group) are
// one request.
#pragma once

#include <atomic>

#include "core/error.h"

namespace weft {

// Installs the handlers (idempotent). The cli's main calls it once.
void stop_handlers_install();

// True once a signal arrived inside a StopScope.
bool stop_requested();

// The flag itself, for code that takes a `const std::atomic<bool>*`.
const std::atomic<bool>& stop_flag();

// 130 after SIGINT, 143 after SIGTERM (128 + the signal), 0 with no request.
int stop_exit_code();

// The signal's name ("SIGINT") for messages; "" with no request.
const char* stop_signal_name();

// Tests raise a request without a signal; also clears it (false).
void stop_request_for_test(int signal);
void stop_clear_for_test();

// While one lives, signals are requests (see above). Nests.
class StopScope {
 public:
  StopScope();
  ~StopScope();
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;
};

// Thrown by work that was stopped and has nothing partial to hand back; the
// cli turns it into the signal's exit code. Not an InputError: the input
// was fine.
class StopRequested : public Error {
 public:
  StopRequested();
};

// Throws StopRequested when a stop was requested.
void stop_check();

}  // namespace weft
