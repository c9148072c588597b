#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace weft::cli {

namespace {

constexpr int kBarWidth = 30;
constexpr double kRedrawSeconds = 0.1;

}  // namespace

bool draws_bars(std::FILE* stream) {
  // Open MPI's mpirun (which sets OMPI_COMM_WORLD_SIZE in its ranks) gives
  // every rank a pseudo-terminal whatever its own output is, so there a
  // terminal proves nothing: a redirected log would fill with redrawn bars,
  // one set per rank. Plain lines there.
  return std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && ::isatty(fileno(stream));
}

ProgressStyle Progress::style_for(std::FILE* stream, int64_t total, int64_t min_bytes) {
  if (total < min_bytes) return ProgressStyle::none;
  return draws_bars(stream) ? ProgressStyle::bar : ProgressStyle::lines;
}

void Progress::update(int64_t done, int64_t total, double seconds) {
  if (style_ == ProgressStyle::none || total <= 0) return;
  const double frac = std::clamp(double(done) / double(total), 0.0, 1.0);
  const double mb = double(done) / 1e6, total_mb = double(total) / 1e6;
  const double rate = seconds > 0 ? mb / seconds : 0;
  if (style_ == ProgressStyle::lines) {
    const int tenth = static_cast<int>(frac * 10);
    if (tenth <= last_tenth_) return;
    last_tenth_ = tenth;
    fmt::print(stream_, "  {} {:3.0f}%  {:.1f} of {:.1f} MB  {:.1f} MB/s\n", what_, frac * 100, mb,
               total_mb, rate);
    std::fflush(stream_);
    return;
  }
  if (done < total && last_draw_ >= 0 && seconds - last_draw_ < kRedrawSeconds) return;
  last_draw_ = seconds;
  const int filled = static_cast<int>(frac * kBarWidth);
  const std::string bar = std::string(filled, '#') + std::string(kBarWidth - filled, '.');
  const std::string eta =
      rate > 0 && done < total ? fmt::format("  ETA {:.0f} s", (total_mb - mb) / rate) : "";
  fmt::print(stream_, "\r  {} [{}] {:3.0f}%  {:.1f}/{:.1f} MB  {:.1f} MB/s{}\x1b[K", what_, bar,
             frac * 100, mb, total_mb, rate, eta);
  std::fflush(stream_);
  drawn_ = true;
}

void Progress::finish() {
  if (style_ == ProgressStyle::bar && drawn_) {
    fmt::print(stream_, "\n");
    std::fflush(stream_);
  }
}

}  // namespace weft::cli

namespace weft::cli {

// The log stream of a CountProgress: each write lifts the bar off the line,
// writes the text, and puts the bar back once the text ends a line.
struct CountProgressCookie {
  static ssize_t write(void* self, const char* buf, size_t n) {
    auto* p = static_cast<CountProgress*>(self);
    p->clear();
    std::fwrite(buf, 1, n, p->terminal_);
    if (n > 0 && buf[n - 1] == '\n') p->draw();
    std::fflush(p->terminal_);
    return ssize_t(n);
  }
};

CountProgress::CountProgress(std::FILE* terminal, std::string what) : terminal_(terminal), what_(std::move(what)) {
  if (!draws_bars(terminal)) return;
  cookie_io_functions_t io{nullptr, &CountProgressCookie::write, nullptr, nullptr};
  log_ = ::fopencookie(this, "w", io);
  // Line buffered: the bar comes back after whole lines, not halves.
  if (log_) std::setvbuf(log_, nullptr, _IOLBF, 1 << 14);
}

CountProgress::~CountProgress() {
  finish();
  if (log_) std::fclose(log_);
}

void CountProgress::clear() {
  if (bar_.empty()) return;
  fmt::print(terminal_, "\r\x1b[K");
}

void CountProgress::draw() {
  if (bar_.empty()) return;
  fmt::print(terminal_, "\r{}\x1b[K", bar_);
}

void CountProgress::update(int64_t done, int64_t total) {
  if (!log_ || total <= 0) return;
  std::fflush(log_);
  const auto now = std::chrono::steady_clock::now();
  if (first_done_ < 0) {
    first_done_ = done;
    first_ = now;
  }
  const double frac = std::clamp(double(done) / double(total), 0.0, 1.0);
  const int filled = static_cast<int>(frac * kBarWidth);
  const double seconds = std::chrono::duration<double>(now - first_).count();
  std::string eta;
  if (done > first_done_ && done < total) {
    const double left = seconds / double(done - first_done_) * double(total - done);
    eta = left >= 90 ? fmt::format("  ETA {:.0f} min", left / 60) : fmt::format("  ETA {:.0f} s", left);
  }
  bar_ = fmt::format("  {} [{}{}] {}/{} {:3.0f}%{}", what_, std::string(filled, '#'),
                     std::string(kBarWidth - filled, '.'), done, total, 100 * frac, eta);
  draw();
  std::fflush(terminal_);
}

void CountProgress::finish() {
  if (log_) std::fflush(log_);
  clear();
  bar_.clear();
  std::fflush(terminal_);
}

}  // namespace weft::cli
