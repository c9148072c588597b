#include "kernels/kernel.h"

#include <fmt/format.h>

#include "core/error.h"

namespace weft::kernels {

const char* to_string(Status s) {
  switch (s) {
    case Status::ok:
      return "ok";
    case Status::unsupported:
      return "unsupported";
    case Status::invalid_argument:
      return "invalid_argument";
  }
  return "unknown";
}

void status_check(Status s, const char* op) {
  if (s != Status::ok)
    throw InternalError(fmt::format("kernel {} refused its params: {}", op, to_string(s)));
}

}  // namespace weft::kernels
