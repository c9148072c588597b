// Durable file and folder writes shared by the safetensors writer, checkpoint
// saving and export: full writes with fsync, and committing a folder built
// under a temporary name so that a crash at any moment leaves either the old
// or the new folder complete under the final name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <string_view>

namespace weft::checkpoint {

// A file opened for writing; closes (without syncing) when destroyed.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);  // creates or truncates
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  // Writes every byte (retrying short writes); InputError naming the file.
  void write(const void* data, size_t n);
  // fsync and close; InputError when either fails.
  void sync_close();

 private:
  std::string path_;
  int fd_ = -1;
};

// fsync of a folder, so that the names created, renamed or removed in it are
// durable. InputError naming the folder when it fails.
void fsync_dir(const std::string& dir);

// Called after each stage of a save or export with the stage's name; tests
// use it to make the save fail or the process die at that moment.
using StageHook = std::function<void(std::string_view stage)>;

// Moves the finished folder `tmp` to `dir` and fsyncs the parent. When `dir`
// exists the two are swapped atomically (renameat2 RENAME_EXCHANGE) and the
// old contents removed afterwards; where the file system cannot swap, the old
// folder is first renamed to "<dir>.old-<pid>", which latest_checkpoint still
// finds if the process dies before the new one is in place. Calls `hook` with
// "swapped" once the new folder is in place and before the old one is removed.
void commit_dir(const std::string& tmp, const std::string& dir, const StageHook& hook);

// `dir` without "." / ".." parts and without a trailing separator, so that
// suffixes attach to the folder's own name ("ck/" -> "ck").
std::string dir_path_clean(const std::string& dir);

// Creates `dir` and its parents; InputError naming it when that fails.
void dir_create(const std::string& dir);

// "<dir>.tmp-<pid>": where a folder is built before commit_dir.
std::string temp_dir_name(const std::string& dir);

// The file an export writes into its folder to say what it is: an export
// replaces only a folder that holds it (with the same `kind`), so a user's
// own model folder, or an export of another kind, is never written over.
inline constexpr const char* kExportMarkerFile = "weft_export.json";

// Where an export of `kind` ("hf", "peft") may write `out`: a new or empty
// folder, or an earlier export of the same kind holding only `files` and the
// marker; never one of `inputs` (the checkpoint, the base model), a folder
// inside one, or a folder holding one. InputError naming the folder and what
// is in the way, before anything is written.
void export_target_check(const std::string& out, const char* kind, const std::vector<std::string>& files,
                         const std::vector<std::string>& inputs);
// Writes the marker of an export of `kind` from `source` into `dir`.
void export_marker_write(const std::string& dir, const char* kind, const std::string& source);

}  // namespace weft::checkpoint
