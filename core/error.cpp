#include "core/error.h"

#include <fmt/format.h>

namespace weft {

void throw_internal(const char* expr, const char* file, int line) {
  throw InternalError(fmt::format("internal error: {} failed at {}:{}", expr, file, line));
}

}  // namespace weft
