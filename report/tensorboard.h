// TensorBoard event files: a run's metrics and a tuning's trials, for people
// who watch runs in TensorBoard.
//
// The files are what TensorBoard reads: TFRecord framing (a length, the
// masked CRC32C of the length, the serialized Event, its masked CRC32C), the
// first Event holding the file version, then one Event per summary. Every
// scalar is a rank-0 DT_DOUBLE tensor with the "scalars" plugin's metadata,
// so a logged double reads back bit for bit (TensorBoard's own scalar
// summaries are float32). The messages come from report/tensorboard_event.proto
// through protobuf.
//
// A run's folder gets one file per launch. Each launch starts with a session
// start at its first step, which makes TensorBoard drop the events of
// earlier files at that step and later: what a resumed launch supersedes,
// as metrics.jsonl does.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "trainer/loop.h"

namespace weft::tuner {
struct TuneResult;
}
namespace weft::tensorboard {
class Event;
class TensorProto;
}

namespace weft::report {

class TensorBoardWriter {
 public:
  // Creates `dir` (with its parents) and a new event file in it,
  // events.out.tfevents.<seconds>.<host>.<pid>.<n>; InputError naming the
  // folder when either cannot be made.
  explicit TensorBoardWriter(const std::string& dir);
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void scalar(const std::string& tag, int64_t step, double value);
  void text(const std::string& tag, int64_t step, const std::string& text);
  // TensorBoard drops the events of earlier files at `step` and after.
  void session_start(int64_t step);
  // Writes what is buffered to the file (each call above flushes already).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  tensorboard::TensorProto* value_event(tensorboard::Event& e, const std::string& tag, int64_t step,
                                        const char* plugin, int data_class, int dtype);
  std::ofstream out_;
  std::string path_;
  std::set<std::string> described_;  // tags whose metadata this file holds
};

// The metrics.jsonl records as scalars, at the record's step: every number
// and boolean of a train, val, checkpoint or end record (nested objects
// flattened with '/'), tagged <kind>/<field>, e.g. train/loss, val/val_loss,
// train/fp8/overflow, checkpoint/stall_s, end/tokens_per_s (an end record's
// step is its last_step). The run header becomes the text run/header.
class TensorBoardSink : public trainer::MetricsSink {
 public:
  explicit TensorBoardSink(std::string dir) : dir_(std::move(dir)) {}
  void launch(int64_t resumed_after) override;
  void record(const nlohmann::json& r) override;
  // The tags and values a record turns into, in the order written (for the
  // tests and for tensorboard_trials).
  static std::vector<std::pair<std::string, double>> scalars_of(const nlohmann::json& r);

 private:
  std::string dir_;
  std::unique_ptr<TensorBoardWriter> writer_;
  int64_t first_step_ = 1;
};

// A tuning's trials under `dir` (a run's tensorboard folder's tune/, a run
// of its own in TensorBoard), at step = the trial's place in the profiling
// order: tune/predicted_step_s, tune/calibrated_step_s and, for trials that
// ran, tune/measured_step_s, tune/tokens_per_s, tune/mfu,
// tune/predicted_peak_bytes and tune/measured_peak_bytes; the text
// tune/trial says the layout, its status and why.
void tensorboard_trials(const std::string& dir, const tuner::TuneResult& r);

}  // namespace weft::report
