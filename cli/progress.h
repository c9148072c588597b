// Progress of a long pass over bytes (tokenizing a corpus), for people.
//
// On a terminal: one line redrawn in place, a bar with percent, megabytes
// and throughput, at most ten times a second. Elsewhere (a log file, a
// pipe): a plain line at each tenth of the way, so a log stays short.
// Inputs below `min_bytes` print nothing: they finish before a bar helps.
#pragma once

#include <cstdint>
#include <cstdio>

namespace weft::cli {

enum class ProgressStyle { bar, lines, none };

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

}  // namespace weft::cli
