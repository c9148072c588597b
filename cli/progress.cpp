#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace weft::cli {

namespace {

constexpr int kBarWidth = 30;
constexpr double kRedrawSeconds = 0.1;

}  // namespace

ProgressStyle Progress::style_for(std::FILE* stream, int64_t total, int64_t min_bytes) {
  if (total < min_bytes) return ProgressStyle::none;
  return ::isatty(fileno(stream)) ? ProgressStyle::bar : ProgressStyle::lines;
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
