// Error types shared by every layer.
//
// User input (CLI values, presets, config and data files, layouts) is rejected
// with an InputError whose message names the value and what would be valid;
// the CLI turns it into a one-line message and exit code 2. Library code never
// calls exit(). Internal invariants use WEFT_ASSERT, which throws InternalError
// with the file and line, since a broken invariant is a bug and not user input.
#pragma once

#include <stdexcept>
#include <string>

namespace weft {

// Base of all errors weft throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad user input: a value, file or combination the user can fix.
class InputError : public Error {
 public:
  using Error::Error;
};

// A layout that cannot run this model/run/world; the message lists every
// violated rule with the values involved.
class LayoutError : public InputError {
 public:
  using InputError::InputError;
};

// A file whose header, size or contents are not what weft expects.
class FileFormatError : public InputError {
 public:
  using InputError::InputError;
};

// A broken internal invariant (a bug in weft).
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_internal(const char* expr, const char* file, int line);

}  // namespace weft

#define WEFT_ASSERT(expr) \
  ((expr) ? (void)0 : ::weft::throw_internal(#expr, __FILE__, __LINE__))
