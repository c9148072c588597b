// Human-readable sizes and times for reports.
#pragma once

#include <cstdint>
#include <string>

namespace weft {

constexpr int64_t KiB = int64_t{1} << 10;
constexpr int64_t MiB = int64_t{1} << 20;
constexpr int64_t GiB = int64_t{1} << 30;

// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(double bytes);
// "1.23 s", "45.6 ms", "7.8 us".
std::string format_seconds(double seconds);
// Parses "10m", "90s", "1h", "250ms" or plain seconds; InputError otherwise.
double parse_duration(const std::string& text);

}  // namespace weft
