// Progress for people: of a long pass over bytes (tokenizing a corpus), and
// of counted items (CountProgress, below).
//
// On a terminal: one line redrawn in place, a bar with percent, megabytes
// and throughput, at most ten times a second. Elsewhere (a log file, a
// pipe): a plain line at each tenth of the way, so a log stays short.
// Inputs below `min_bytes` print nothing: they finish before a bar helps.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace weft::cli {

enum class ProgressStyle { bar, lines, none };

// Whether progress on `stream` is drawn as a bar: a terminal, and not a rank
// started by mpirun (which hands ranks a pseudo-terminal even when its own
// output goes to a file).
bool draws_bars(std::FILE* stream);

class Progress {
 public:
  // The style for `stream` and a pass over `total` bytes.
  static ProgressStyle style_for(std::FILE* stream, int64_t total, int64_t min_bytes);

  Progress(std::FILE* stream, ProgressStyle style, const char* what)
      : stream_(stream), style_(style), what_(what) {}

  void update(int64_t done, int64_t total, double seconds);
  // Ends the bar's line; nothing for the other styles.
  void finish();

 private:
  std::FILE* stream_;
  ProgressStyle style_;
  const char* what_;
  double last_draw_ = -1;
  int last_tenth_ = 0;
  bool drawn_ = false;
};

// Progress over counted items (tuning trials, training steps) whose log lines
// go to the same terminal. On a TTY a bar with the count and an ETA stays on
// the bottom line and log lines written through log() scroll above it;
// elsewhere log() is the stream itself and there is no bar (plain lines).
class CountProgress {
 public:
  CountProgress(std::FILE* terminal, std::string what);
  ~CountProgress();
  CountProgress(const CountProgress&) = delete;
  CountProgress& operator=(const CountProgress&) = delete;

  // The stream to print log lines to.
  std::FILE* log() { return log_ ? log_ : terminal_; }
  // `done` of `total` items; the ETA is the mean time per item since the
  // first update times the items left.
  void update(int64_t done, int64_t total);
  // Takes the bar off the terminal for good.
  void finish();

 private:
  friend struct CountProgressCookie;
  void clear();
  void draw();
  std::FILE* terminal_;
  std::FILE* log_ = nullptr;  // writes through to terminal_ around the bar (TTY only)
  std::string what_;
  std::string bar_;           // the bar's current text; empty when none is shown
  int64_t first_done_ = -1;
  std::chrono::steady_clock::time_point first_;
};

}  // namespace weft::cli
