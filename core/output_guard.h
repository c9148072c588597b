// The rule before a command writes a file the user named: no command
// destroys a user's file. An existing file is replaced only when it is an
// earlier output of the same kind (recognised by its opening bytes), never
// when it is one of the command's own inputs; a folder, a device or any other
// non-file is never written over. A refusal is an InputError that names the
// path, what is there, and how to proceed, thrown before anything is written
// or moved.
#pragma once

#include <string>
#include <vector>

namespace weft {

enum class OutputKind {
  html_report,     // weft report, tune --dry-run --format html
  dry_run_report,  // tune --dry-run --out, in any --format
  sbatch_script,   // recipe sbatch --script
  recipe,          // tune --dry-run --save-recipe
  device_profile,  // calibrate --out
};

// `option` names the flag for messages ("--out"); `inputs` are the paths the
// same command reads (files or folders: a file inside an input folder is an
// input too; paths that do not exist are passed over). An empty `out` is
// refused.
void output_check(const std::string& out, OutputKind kind, const std::vector<std::string>& inputs,
                  const std::string& option);

// Whether `head` (a file's first bytes) opens an output of `kind`.
bool output_is_kind(const std::string& head, OutputKind kind);

}  // namespace weft
