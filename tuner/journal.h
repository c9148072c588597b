// The tuning journal: a JSONL file that records each profiling trial as it
// starts and when it finishes, so that a re-run resumes tuning where it
// stopped and skips a trial that killed the process (started, never finished).
//
//   {"kind":"header", ...what the trials depend on: model hash, world, ...}
//   {"kind":"start","layout":"tp2-pp1-dp4-mb1"}
//   {"kind":"result","result":{"layout":"tp2-pp1-dp4-mb1","step_s":0.41,...}}
//   {"kind":"abandon","layout":"tp2-pp1-dp4-mb1"}   (stopped by a signal: no
//                                                   result, and not a crash)
//
// Every entry is appended with one write() of the whole line and fsync'ed
// before the call returns, so a crash leaves each line either whole or, for
// the last line only, cut off; open() reports a cut-off line instead of
// guessing. Only rank 0 writes a journal.
#pragma once

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

namespace weft::tuner {

class Journal {
 public:
  // Opens the journal at `path`, or creates it (and its folder) with the
  // header line {"kind":"header", ...header}; `header` is an object without a
  // "kind" key. An existing journal whose header differs from `header` is an
  // InputError naming every differing key with both values. A malformed line
  // (not JSON, no "kind", an unknown kind, a cut-off last line) is a
  // FileFormatError naming the file and the line. A journal that fails to
  // open is left exactly as it was.
  static Journal open(const std::string& path, const nlohmann::json& header);

  Journal(Journal&& other) noexcept;
  Journal& operator=(Journal&& other) noexcept;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  ~Journal();

  // Records that the trial of `layout` starts; on disk before returning.
  void start(const std::string& layout);
  // Records a trial's result, an object with a string "layout"; on disk
  // before returning.
  void finish(const nlohmann::json& result);
  // Records that the started trial of `layout` was stopped on request (a
  // signal): a re-run profiles it again instead of taking it for a crash.
  void abandon(const std::string& layout);

  // Completed results in the order they were recorded, each the object given
  // to finish().
  const std::vector<nlohmann::json>& results() const { return results_; }
  // Layouts whose last trial started and never finished: the process died
  // during them. In the order they first started.
  std::vector<std::string> unfinished() const;
  // The latest result for `layout`, or nullptr; valid until the next finish().
  const nlohmann::json* result(const std::string& layout) const;
  const std::string& path() const { return path_; }

 private:
  Journal() = default;
  void append(const nlohmann::json& entry);  // one line: write, then fsync
  void note_start(const std::string& layout);
  void note_result(const nlohmann::json& result);

  std::string path_;
  int fd_ = -1;  // opened for appending
  std::vector<nlohmann::json> results_;
  std::unordered_map<std::string, size_t> latest_;  // layout -> index in results_
  std::vector<std::string> started_;                // each layout once, in order
  std::unordered_set<std::string> running_;         // started, not finished since
};

}  // namespace weft::tuner
