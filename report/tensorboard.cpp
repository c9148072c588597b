#include "report/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "report/tensorboard_event.pb.h"
#include "trainer/checkpoint/crc32c.h"
#include "tuner/tune.h"

namespace weft::report {

namespace fs = std::filesystem;
namespace pb = weft::tensorboard;

namespace {

// TFRecord's masked CRC32C: the checksum rotated right by 15 bits plus a
// constant, so that a CRC of data holding CRCs stays well distributed.
uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = checkpoint::crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("--tensorboard {}: cannot create the folder: {}", dir, ec.message()));
  // Seconds, host and process name the file as TensorBoard's writers do; the
  // counter tells apart two writers one process opens in the same second.
  static std::atomic<int> opened{0};
  path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.{}", int64_t(now_s()), host_name(),
                                       int64_t(getpid()), opened++))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw InputError(fmt::format("--tensorboard {}: cannot write {}", dir, path_));
  pb::Event e;
  e.set_wall_time(now_s());
  e.set_file_version("brain.Event:2");
  e.mutable_source_metadata()->set_writer("weft");
  write(e.SerializeAsString());
}

void TensorBoardWriter::write(const std::string& event) {
  std::string frame;
  frame.reserve(event.size() + 16);
  put_le(frame, event.size(), 8);
  const uint32_t len_crc = masked_crc(frame.data(), 8);
  put_le(frame, len_crc, 4);
  frame += event;
  put_le(frame, masked_crc(event.data(), event.size()), 4);
  out_.write(frame.data(), std::streamsize(frame.size()));
  out_.flush();
  if (!out_) throw Error(fmt::format("TensorBoard: writing {} failed", path_));
}

// One summary value's event: its tag, and the plugin's metadata on the
// tag's first value in the file (as TensorBoard's writers do; the reader
// keeps it for the rest). Returns the rank-0 tensor to fill.
pb::TensorProto* TensorBoardWriter::value_event(pb::Event& e, const std::string& tag, int64_t step,
                                                 const char* plugin, int data_class, int dtype) {
  e.set_wall_time(now_s());
  e.set_step(step);
  pb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  if (described_.insert(tag).second) {
    v->mutable_metadata()->mutable_plugin_data()->set_plugin_name(plugin);
    v->mutable_metadata()->set_data_class(pb::DataClass(data_class));
  }
  pb::TensorProto* t = v->mutable_tensor();
  t->set_dtype(pb::DataType(dtype));
  t->mutable_tensor_shape();  // rank 0
  return t;
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value) {
  pb::Event e;
  value_event(e, tag, step, "scalars", pb::DATA_CLASS_SCALAR, pb::DT_DOUBLE)->add_double_val(value);
  write(e.SerializeAsString());
}

void TensorBoardWriter::text(const std::string& tag, int64_t step, const std::string& text) {
  pb::Event e;
  value_event(e, tag, step, "text", pb::DATA_CLASS_TENSOR, pb::DT_STRING)->add_string_val(text);
  write(e.SerializeAsString());
}

void TensorBoardWriter::session_start(int64_t step) {
  pb::Event e;
  e.set_wall_time(now_s());
  e.set_step(step);
  e.mutable_session_log()->set_status(pb::SessionLog::START);
  write(e.SerializeAsString());
}

void TensorBoardWriter::flush() { out_.flush(); }

std::vector<std::pair<std::string, double>> TensorBoardSink::scalars_of(const nlohmann::json& r) {
  std::vector<std::pair<std::string, double>> out;
  const std::string kind = r.value("kind", "");
  if (kind != "train" && kind != "val" && kind != "checkpoint" && kind != "end") return out;
  // Depth-first, in the record's key order (nlohmann sorts keys).
  const auto walk = [&](const auto& self, const nlohmann::json& j, const std::string& prefix) -> void {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& key = it.key();
      if (prefix == kind && (key == "kind" || key == "step" || (kind == "end" && key == "last_step"))) continue;
      const std::string tag = prefix + "/" + key;
      const nlohmann::json& v = it.value();
      if (v.is_object())
        self(self, v, tag);
      else if (v.is_boolean())
        out.emplace_back(tag, v.get<bool>() ? 1.0 : 0.0);
      else if (v.is_number_integer() && !v.is_number_unsigned())
        out.emplace_back(tag, double(v.get<int64_t>()));
      else if (v.is_number_unsigned())
        out.emplace_back(tag, double(v.get<uint64_t>()));
      else if (v.is_number_float())
        out.emplace_back(tag, v.get<double>());
    }
  };
  walk(walk, r, kind);
  return out;
}

void TensorBoardSink::launch(int64_t resumed_after) {
  writer_ = std::make_unique<TensorBoardWriter>(dir_);
  first_step_ = resumed_after + 1;
  writer_->session_start(first_step_);
}

void TensorBoardSink::record(const nlohmann::json& r) {
  if (!writer_) launch(0);
  const std::string kind = r.value("kind", "");
  if (kind == "run") {
    writer_->text("run/header", first_step_, "```\n" + r.dump(1) + "\n```");
    return;
  }
  const char* step_key = kind == "end" ? "last_step" : "step";
  if (!r.contains(step_key) || !r[step_key].is_number_integer()) return;
  const int64_t step = r[step_key].get<int64_t>();
  for (const auto& [tag, value] : scalars_of(r)) writer_->scalar(tag, step, value);
}

void tensorboard_trials(const std::string& dir, const tuner::TuneResult& r) {
  TensorBoardWriter w(dir);
  w.session_start(1);
  for (const tuner::TrialRecord& t : r.trials) {
    const int64_t step = t.order;
    w.text("tune/trial", step,
           fmt::format("{}: {}{}{}", t.layout.to_string(), t.status, t.reason.empty() ? "" : ", ", t.reason));
    w.scalar("tune/predicted_step_s", step, t.predicted_s);
    w.scalar("tune/calibrated_step_s", step, t.calibrated_s);
    if (t.status != "ok") continue;
    w.scalar("tune/measured_step_s", step, t.measured_s);
    w.scalar("tune/tokens_per_s", step, t.tokens_per_s);
    w.scalar("tune/mfu", step, t.mfu);
    w.scalar("tune/predicted_peak_bytes", step, double(t.predicted_peak));
    w.scalar("tune/measured_peak_bytes", step, double(t.measured_peak));
  }
}

}  // namespace weft::report
