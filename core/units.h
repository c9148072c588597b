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
// Parses "2GiB", "512MiB", "1.5G", "800M", "64KiB" or plain bytes (binary
// units: K, M, G, T with or without "iB"); InputError naming the text for
// anything else, or for a size that is not positive or past 2^62 bytes.
int64_t parse_bytes(const std::string& text);

}  // namespace weft
