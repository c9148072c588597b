// A shared library opened on first use instead of at process start.
//
// cuBLAS and cuBLASLt run static initialisers that map and touch about 150
// MiB each time they load: 80 ms a process on a 2-core machine, paid by
// every `weft` command (a dry-run, `--version`, a CPU run) though only GPU
// GEMMs call them. kernels/gemm/cublas_lazy.cpp therefore defines the entry
// points weft calls, each opening the library through a LazyLibrary the
// first time it runs, and the binaries do not link the libraries at all.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace weft::kernels {

class LazyLibrary {
 public:
  // `what`: the library's name in messages ("cuBLASLt"); `files`: the file
  // names or paths dlopen tries, in order (a soname first, so that
  // LD_LIBRARY_PATH and the binary's run path choose, then a path found at
  // build time); `hint`: where a user finds the library, for the error.
  LazyLibrary(std::string what, std::vector<std::string> files, std::string hint);

  // The address of `name`, opening the library on the first call of any
  // thread. Throws weft::Error naming the library, every file tried with
  // dlopen's reason, and the hint; or, for a symbol it lacks, the symbol.
  void* symbol(const char* name);

  // Whether the library is open (never opens it).
  bool loaded() const;

 private:
  void open();

  std::string what_, hint_;
  std::vector<std::string> files_;
  std::once_flag once_;
  std::atomic<void*> handle_{nullptr};
  std::string failure_;
};

// Whether this process has opened cuBLAS or cuBLASLt (a CPU build: never).
bool cublas_loaded();

}  // namespace weft::kernels
