// blas_core: see blas_core.h. The correction uses OpenBLAS's own runtime
// dispatch: gotoblas_dynamic_quit() forgets the kernel table and
// gotoblas_dynamic_init() chooses again, reading OPENBLAS_CORETYPE as it
// does when the library loads. Both are exported by builds with
// DYNAMIC_ARCH (Debian's); they are declared weak, so a BLAS without them
// links and runs as it chose.
#include "kernels/gemm/blas_core.h"

#include <cblas.h>

#include <cstdlib>
#include <initializer_list>
#include <strings.h>

#include <fmt/format.h>

extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace weft::kernels {
namespace {

// The widest vector unit a kernel set of OpenBLAS 0.3 uses, or -1 for a
// name this does not know.
int kernel_vector(const std::string& core) {
  auto in = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (strcasecmp(core.c_str(), n) == 0) return true;
    return false;
  };
  if (in({"SkylakeX", "Cooperlake", "SapphireRapids"})) return int(CpuVector::avx512);
  if (in({"Haswell", "Zen", "Excavator"})) return int(CpuVector::avx2);
  if (in({"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"})) return int(CpuVector::avx);
  if (in({"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Nano", "Katmai", "Coppermine",
          "Northwood", "Banias", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat"}))
    return int(CpuVector::sse);
  return -1;
}

#if defined(__x86_64__)
CpuVector cpu_vector() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd"))
    return CpuVector::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuVector::avx2;
  if (__builtin_cpu_supports("avx")) return CpuVector::avx;
  return CpuVector::sse;
}
#endif

std::string corename() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

BlasCore choose() {
  BlasCore c;
  c.detected = c.running = corename();
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return c;
  const CpuVector have = cpu_vector();
  const std::string better = blas_core_correction(c.detected, have, __builtin_cpu_supports("avx512bf16"));
  if (better.empty()) return c;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  c.running = corename();
  c.note = fmt::format("OpenBLAS chose its {} kernels on a CPU with {}; running its {} kernels", c.detected,
                       have == CpuVector::avx512 ? "AVX-512"
                       : have == CpuVector::avx2 ? "AVX2 and FMA"
                                                 : "AVX",
                       c.running);
#endif
  return c;
}

}  // namespace

// Cooperlake is SkylakeX's set plus bf16 dot products, which only bf16 BLAS
// calls use (weft makes none).
std::string blas_core_correction(const std::string& detected, CpuVector have, bool bf16) {
  const int used = kernel_vector(detected);
  if (used < 0 || int(have) <= used) return "";
  switch (have) {
    case CpuVector::avx512: return bf16 ? "Cooperlake" : "SkylakeX";
    case CpuVector::avx2: return "Haswell";
    case CpuVector::avx: return "Sandybridge";
    case CpuVector::sse: break;
  }
  return "";
}

const BlasCore& blas_core() {
  static const BlasCore core = choose();
  return core;
}

}  // namespace weft::kernels
