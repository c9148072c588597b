#include "trainer/checkpoint/manifest.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::checkpoint {

const FileRecord* Manifest::file(const std::string& name) const {
  for (const auto& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

nlohmann::json manifest_to_json(const Manifest& m) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : m.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"checksum", f.checksum}});
  const auto& o = m.optimizer;
  return nlohmann::json{
      {"format", "weft-checkpoint"},
      {"format_version", m.format_version},
      {"weft_version", m.weft_version},
      {"step", m.step},
      {"data_position", m.data_position},
      {"rng_state", m.rng_state},
      {"optimizer",
       {{"kind", o.kind},
        {"lr", o.lr},
        {"beta1", o.beta1},
        {"beta2", o.beta2},
        {"eps", o.eps},
        {"weight_decay", o.weight_decay},
        {"grad_clip", o.grad_clip},
        {"step", o.step}}},
      {"layout", m.layout},
      {"model", m.model},
      {"run", m.run},
      {"bos_token_id", m.bos_token_id},
      {"eos_token_id", m.eos_token_id},
      {"files", files},
  };
}

namespace {

// Field readers that name the manifest and the field path on failure.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw FileFormatError(fmt::format("{}: field '{}' {}", origin_, field, what));
  }
  const nlohmann::json& get(const nlohmann::json& j, const std::string& field,
                            const char* key) const {
    if (!j.is_object() || !j.contains(key)) fail(field, "is missing");
    return j[key];
  }
  int64_t integer(const nlohmann::json& j, const std::string& field, const char* key) const {
    const auto& v = get(j, field, key);
    if (!v.is_number_integer()) fail(field, fmt::format("must be an integer, got {}", v.dump()));
    return v.get<int64_t>();
  }
  int64_t count(const nlohmann::json& j, const std::string& field, const char* key) const {
    const int64_t v = integer(j, field, key);
    if (v < 0) fail(field, fmt::format("must not be negative, got {}", v));
    return v;
  }
  double number(const nlohmann::json& j, const std::string& field, const char* key) const {
    const auto& v = get(j, field, key);
    if (!v.is_number()) fail(field, fmt::format("must be a number, got {}", v.dump()));
    return v.get<double>();
  }
  std::string string(const nlohmann::json& j, const std::string& field, const char* key) const {
    const auto& v = get(j, field, key);
    if (!v.is_string()) fail(field, fmt::format("must be a string, got {}", v.dump()));
    return v.get<std::string>();
  }

 private:
  std::string origin_;
};

}  // namespace

Manifest manifest_from_json(const nlohmann::json& j, const std::string& origin) {
  const Reader r(origin);
  if (!j.is_object()) throw FileFormatError(fmt::format("{}: not a JSON object", origin));
  if (!j.contains("format") || j["format"] != "weft-checkpoint")
    throw FileFormatError(
        fmt::format("{}: not a weft checkpoint manifest (field 'format' is not "
                    "\"weft-checkpoint\")",
                    origin));
  Manifest m;
  m.format_version = r.integer(j, "format_version", "format_version");
  m.weft_version = r.string(j, "weft_version", "weft_version");
  if (m.format_version < 1 || m.format_version > kCheckpointFormatVersion)
    throw FileFormatError(fmt::format(
        "{}: checkpoint format version {} (written by weft {}) is "
        "not one this weft {} reads (1 to {})",
        origin, m.format_version, m.weft_version, WEFT_VERSION, kCheckpointFormatVersion));
  m.step = r.count(j, "step", "step");
  m.data_position = r.count(j, "data_position", "data_position");
  const auto& rng = r.get(j, "rng_state", "rng_state");
  if (!rng.is_array()) r.fail("rng_state", "must be an array of unsigned integers");
  for (const auto& v : rng) {
    if (!v.is_number_unsigned())
      r.fail("rng_state", fmt::format("holds {}, not an unsigned integer", v.dump()));
    m.rng_state.push_back(v.get<uint64_t>());
  }

  const auto& o = r.get(j, "optimizer", "optimizer");
  m.optimizer.kind = r.string(o, "optimizer.kind", "kind");
  m.optimizer.lr = r.number(o, "optimizer.lr", "lr");
  m.optimizer.beta1 = r.number(o, "optimizer.beta1", "beta1");
  m.optimizer.beta2 = r.number(o, "optimizer.beta2", "beta2");
  m.optimizer.eps = r.number(o, "optimizer.eps", "eps");
  m.optimizer.weight_decay = r.number(o, "optimizer.weight_decay", "weight_decay");
  m.optimizer.grad_clip = r.number(o, "optimizer.grad_clip", "grad_clip");
  m.optimizer.step = r.count(o, "optimizer.step", "step");
  // Ranges, so that a resume never trains on with a value no run could have
  // saved (NaN, a beta of 1, a negative decay).
  const auto& opt = m.optimizer;
  const std::pair<const char*, bool> ranges[] = {
      {"optimizer.lr", std::isfinite(opt.lr) && opt.lr >= 0},
      {"optimizer.beta1", opt.beta1 >= 0 && opt.beta1 < 1},
      {"optimizer.beta2", opt.beta2 >= 0 && opt.beta2 < 1},
      {"optimizer.eps", std::isfinite(opt.eps) && opt.eps > 0},
      {"optimizer.weight_decay", std::isfinite(opt.weight_decay) && opt.weight_decay >= 0},
      {"optimizer.grad_clip", std::isfinite(opt.grad_clip) && opt.grad_clip >= 0}};
  const double values[] = {opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, opt.grad_clip};
  for (size_t i = 0; i < std::size(ranges); ++i)
    if (!ranges[i].second)
      r.fail(ranges[i].first, fmt::format("is {}, outside its range (lr, decay and clip finite and >= 0, betas in "
                                          "[0, 1), eps > 0)",
                                          values[i]));

  // Layout and ModelSpec throw InputError for their own fields; in a manifest
  // that is a damaged file, so the message keeps theirs and names the file.
  try {
    m.layout = r.get(j, "layout", "layout").get<Layout>();
  } catch (const FileFormatError&) {
    throw;
  } catch (const InputError& e) {
    r.fail("layout", fmt::format("is invalid: {}", e.what()));
  }
  const auto& model = r.get(j, "model", "model");
  try {
    m.model = model.get<ModelSpec>();
  } catch (const InputError& e) {
    r.fail("model", fmt::format("is invalid: {}", e.what()));
  }
  const std::string hash = r.string(model, "model.hash", "hash");
  if (hash != m.model.hash())
    r.fail("model.hash", fmt::format("is {} but the model fields hash to {} (edited or damaged)",
                                     hash, m.model.hash()));

  m.run = r.get(j, "run", "run");
  if (!m.run.is_object()) r.fail("run", "must be an object");
  m.bos_token_id = r.integer(j, "bos_token_id", "bos_token_id");
  m.eos_token_id = r.integer(j, "eos_token_id", "eos_token_id");

  const auto& files = r.get(j, "files", "files");
  if (!files.is_array()) r.fail("files", "must be an array");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string field = fmt::format("files[{}]", i);
    FileRecord f;
    f.name = r.string(files[i], field + ".name", "name");
    f.bytes = r.count(files[i], field + ".bytes", "bytes");
    f.checksum = r.string(files[i], field + ".checksum", "checksum");
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." || f.name == "..")
      r.fail(field + ".name", fmt::format("'{}' is not a plain file name", f.name));
    m.files.push_back(std::move(f));
  }
  return m;
}

}  // namespace weft::checkpoint
