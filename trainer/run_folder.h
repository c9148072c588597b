// Run folders: one run per folder, and no run ever loses another's work.
//
// A folder "holds a run" once training has written to it: metrics.jsonl, or
// a checkpoint in its checkpoint folder. (A tuning journal alone does not
// count: re-running the same command is how tuning resumes.) A new run into
// such a folder is refused, naming the folder, what it holds and the three
// ways on: --resume continues it, a new --out starts elsewhere, and
// --overwrite moves the earlier run aside to "<out>.prev-<UTC time>" (and a
// checkpoint folder outside <out> beside it the same way), never deleting it.
#pragma once

#include <cstdint>
#include <optional>

#include <string>
#include <vector>

namespace weft::trainer {

enum class RunFolderMode {
  fresh,      // refuse a folder that holds a run
  resume,     // continue the run in the folder (or start one there)
  overwrite,  // move an earlier run aside first
};

// What `out_dir` (with its checkpoint folder `ckpt_dir`; empty: <out>/checkpoints)
// holds of an earlier run, as short phrases ("metrics.jsonl with 40 records",
// "checkpoints step_000020, step_000040"); empty when nothing.
std::vector<std::string> run_folder_contents(const std::string& out_dir, const std::string& ckpt_dir);

// Makes the folder ready for a run in `mode`: InputError for fresh mode on a
// folder that holds a run; in overwrite mode, the moves (done only where
// `act` is true: world rank 0, so ranks on a shared file system move once).
// Returns a line for the log ("moved the earlier run ... aside to ..."), or "".
std::string run_folder_prepare(const std::string& out_dir, const std::string& ckpt_dir, RunFolderMode mode,
                               bool act);

// Records of metrics.jsonl that a run resumed at step `done` would say
// again: the steps after `done` of an earlier launch that went further
// (its later checkpoints damaged, or passed over with --resume-from).
struct SupersededMetrics {
  int64_t first_step = 0, last_step = 0;  // the steps whose records left the file
  int64_t records = 0;
  std::string kept;  // the file as it was, kept whole beside it
};

// Before a run resumed at step `done` appends to `metrics_path`: when the
// file holds records past `done`, it is copied whole to
// "<metrics_path>.prev-<UTC time>" and then replaced (atomically) by its
// records up to `done`, so that no step is recorded twice and no record is
// lost. nullopt when there is nothing past `done` (the file is untouched).
std::optional<SupersededMetrics> metrics_supersede_after(const std::string& metrics_path, int64_t done);

}  // namespace weft::trainer
