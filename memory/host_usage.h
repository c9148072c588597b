// The process's own count of its host memory, from the kernel: resident set
// size now and its high-water mark (/proc/self/status VmRSS and VmHWM). This
// is the CPU trainer's measurement of its memory that does not come from the
// arena the memory model sized, so the two can be compared honestly.
#pragma once

#include <cstdint>

namespace weft::memory {

struct HostUsage {
  int64_t rss = 0;   // resident bytes now
  int64_t peak = 0;  // resident high-water mark since start or the last reset
};

// Zeros when /proc is not there (not Linux): callers then report nothing.
HostUsage host_usage();

// Restarts the high-water mark at the current resident size (Linux 4.0+:
// /proc/self/clear_refs "5"); false when that is not possible, in which case
// the peak still counts from process start.
bool host_peak_reset();

// Returns the memory the allocator holds free to the system (glibc's
// malloc_trim), so that a later allocation that reuses it shows as growth.
void host_trim();

}  // namespace weft::memory
