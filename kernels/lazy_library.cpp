#include "kernels/lazy_library.h"

#include <dlfcn.h>

#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::kernels {

LazyLibrary::LazyLibrary(std::string what, std::vector<std::string> files, std::string hint)
    : what_(std::move(what)), hint_(std::move(hint)), files_(std::move(files)) {}

void LazyLibrary::open() {
  std::string tried;
  for (const std::string& file : files_) {
    if (file.empty()) continue;
    // RTLD_LOCAL: its symbols stay out of the global scope, where weft's own
    // entry points of the same names are.
    if (void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      handle_ = h;
      return;
    }
    const char* why = dlerror();
    tried += fmt::format("\n  {}: {}", file, why ? why : "not found");
  }
  failure_ = fmt::format("{} could not be loaded; tried:{}\n{}", what_, tried, hint_);
}

void* LazyLibrary::symbol(const char* name) {
  std::call_once(once_, [this] { open(); });
  void* const handle = handle_.load();
  if (!handle) throw Error(failure_);
  dlerror();
  void* p = dlsym(handle, name);
  if (!p) {
    const char* why = dlerror();
    throw Error(fmt::format("{} has no symbol {} ({}): a build of weft for a newer {} is running on an older one",
                            what_, name, why ? why : "null", what_));
  }
  return p;
}

bool LazyLibrary::loaded() const { return handle_.load() != nullptr; }

}  // namespace weft::kernels
