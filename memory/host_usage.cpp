#include "memory/host_usage.h"

#include <fstream>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <string>

namespace weft::memory {

HostUsage host_usage() {
  HostUsage u;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    // "VmHWM:     123456 kB"
    const auto field = [&](const char* key, int64_t& out) {
      if (line.rfind(key, 0) == 0) out = std::stoll(line.substr(std::string(key).size())) * 1024;
    };
    field("VmHWM:", u.peak);
    field("VmRSS:", u.rss);
  }
  return u;
}

void host_trim() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

bool host_peak_reset() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return bool(out);
}

}  // namespace weft::memory
