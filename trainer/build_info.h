// What a binary knows of the sources it was built from.
#pragma once

namespace weft {

// The commit of the build (12 hex digits, "-dirty" when tracked files
// differed from it), stamped at every build rather than at configure time,
// or "unknown" outside a git checkout. Recorded in each run's header.
const char* build_commit();

}  // namespace weft
