// Which of OpenBLAS's kernel sets the CPU GEMMs run, corrected where its
// CPU detection falls short.
//
// Debian's OpenBLAS is built for every x86 core and picks one when it loads.
// Release 0.3.21 does not know recent Xeons (Sapphire Rapids, which a
// virtual machine reports only as "Intel Xeon Processor"), and falls back to
// its Prescott kernels: SSE3, no FMA. On such a two-core machine the tiny
// model trained at 4,600 tokens/s with them and 15,400 with the AVX-512
// kernels the CPU has (benchmarks/blas_cores.sh measures it). The first call
// therefore compares the kernels OpenBLAS chose with the vector units the CPU
// reports and, where they fall short, reloads the kernel table for the best
// set the CPU can run. OPENBLAS_CORETYPE, when set, is the user's choice and
// is left alone, as is any other BLAS.
#pragma once

#include <string>

namespace weft::kernels {

struct BlasCore {
  std::string running;   // the kernel set the GEMMs run, e.g. "Cooperlake"
  std::string detected;  // the set OpenBLAS chose by itself
  std::string note;      // why they differ; empty when they do not
};

// Chosen once per process (thread-safe) and then fixed. Call it before any
// other thread may read the environment (trainer::set_threads does): a
// correction sets OPENBLAS_CORETYPE, which OpenBLAS reads back, and ranks and
// child processes inherit.
const BlasCore& blas_core();

// The widest vector unit of a CPU, each adding to the one before.
enum class CpuVector { sse = 0, avx = 1, avx2 = 2, avx512 = 3 };

// The decision itself, pure: the kernel set to run instead of `detected` on
// a CPU with `have` (and bf16 dot products where `bf16`), or "" to keep it.
// Only a set this knows (OpenBLAS 0.3's x86 names, any case) is replaced,
// and only by a wider one: a name from a later release is left alone.
std::string blas_core_correction(const std::string& detected, CpuVector have, bool bf16);

}  // namespace weft::kernels
