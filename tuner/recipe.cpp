#include "tuner/recipe.h"

#include <cmath>
#include <cstdlib>
#include <iterator>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"

namespace weft::tuner {

Recipe recipe_for(const ModelSpec& m, const ClusterSpec& c, const RunSpec& run, const Layout& layout,
                  std::string source) {
  Recipe r;
  r.weft_version = WEFT_VERSION;
  r.model = m;
  r.device = c.device.name;
  r.device_memory = c.device.memory_bytes;
  r.world = c.gpus;
  r.gpus_per_node = c.gpus_per_node;
  r.ranks_per_device = c.device.shared_by;
  r.run = run;
  r.layout = layout;
  r.source = std::move(source);
  return r;
}

nlohmann::json recipe_to_json(const Recipe& r) {
  return nlohmann::json{{"format", "weft-recipe"},
                        {"format_version", r.format_version},
                        {"weft_version", r.weft_version},
                        {"model", r.model},
                        {"cluster", {{"device", r.device},
                                     {"device_memory_bytes", r.device_memory},
                                     {"world", r.world},
                                     {"gpus_per_node", r.gpus_per_node},
                                     {"ranks_per_device", r.ranks_per_device}}},
                        {"run", r.run},
                        {"layout", r.layout.to_string()},
                        {"source", r.source},
                        {"machine", r.machine},
                        {"predicted", r.predicted},
                        {"measured", r.measured},
                        {"tuning", r.tuning}};
}

Recipe recipe_from_json(const nlohmann::json& j, const std::string& origin) {
  auto bad = [&](const std::string& what) {
    return FileFormatError(fmt::format("recipe '{}': {}", origin, what));
  };
  if (!j.is_object() || !j.contains("format") || j["format"] != "weft-recipe")
    throw bad("not a weft recipe (no \"format\": \"weft-recipe\")");
  Recipe r;
  try {
    r.format_version = json_integer(j, "format_version", "recipe");
    if (r.format_version > kRecipeFormatVersion)
      throw bad(fmt::format("format version {} is newer than this weft reads ({})", r.format_version,
                            kRecipeFormatVersion));
    r.weft_version = j.at("weft_version").get<std::string>();
    r.model = j.at("model").get<ModelSpec>();
    if (const auto& m = j.at("model"); m.contains("hash") && m["hash"].get<std::string>() != r.model.hash())
      throw bad(fmt::format("model hash {} does not match the model's fields (hash {}): the file was edited or "
                            "damaged",
                            m["hash"].get<std::string>(), r.model.hash()));
    const auto& c = j.at("cluster");
    r.device = c.at("device").get<std::string>();
    r.device_memory = json_integer(c, "device_memory_bytes", "cluster");
    r.world = json_integer(c, "world", "cluster");
    r.gpus_per_node = json_integer(c, "gpus_per_node", "cluster");
    r.ranks_per_device = c.contains("ranks_per_device") ? json_integer(c, "ranks_per_device", "cluster") : 1;
    r.run = j.at("run").get<RunSpec>();
    r.layout = Layout::parse(j.at("layout").get<std::string>());
    r.source = j.value("source", std::string("dry-run"));
    r.machine = j.value("machine", std::string());
    r.predicted = j.value("predicted", nlohmann::json::object());
    r.measured = j.value("measured", nlohmann::json::object());
    r.tuning = j.value("tuning", nlohmann::json::object());
    // The figures are shown and compared: each must be an object of finite,
    // non-negative numbers (or text). A null is a figure weft could not
    // tell (it writes NaN as null) and reads as not recorded.
    for (const auto& [name, section] : {std::pair<const char*, nlohmann::json*>{"predicted", &r.predicted},
                                        {"measured", &r.measured}}) {
      if (!section->is_object())
        throw bad(fmt::format("field '{}' must be an object of figures, got {}", name, section->dump()));
      for (auto it = section->begin(); it != section->end();) {
        const auto& v = it.value();
        if (v.is_number() && !(v.get<double>() >= 0 && std::isfinite(v.get<double>())))
          throw bad(fmt::format("field '{}.{}' must be a finite number >= 0, got {}", name, it.key(), v.dump()));
        if (!v.is_null() && !v.is_number() && !v.is_string())
          throw bad(fmt::format("field '{}.{}' must be a number, text or null, got {}", name, it.key(), v.dump()));
        it = v.is_null() ? section->erase(it) : std::next(it);
      }
    }
    if (!r.tuning.is_object()) throw bad(fmt::format("field 'tuning' must be an object, got {}", r.tuning.dump()));
    for (const auto& [name, v] : {std::pair<const char*, int64_t>{"cluster.device_memory_bytes", r.device_memory},
                                  {"cluster.world", r.world},
                                  {"cluster.gpus_per_node", r.gpus_per_node},
                                  {"cluster.ranks_per_device", r.ranks_per_device}})
      if (v <= 0) throw bad(fmt::format("field '{}' must be positive, got {}", name, v));
  } catch (const nlohmann::json::exception& e) {
    throw bad(json_error_text(e));
  } catch (const FileFormatError&) {
    throw;
  } catch (const InputError& e) {
    throw bad(e.what());
  }
  return r;
}

void recipe_save(const std::string& path, const Recipe& r) {
  file_write_atomic(path, recipe_to_json(r).dump(2) + "\n");
}

Recipe recipe_load(const std::string& path) { return recipe_from_json(json_read_file(path, "recipe"), path); }

std::vector<std::string> recipe_mismatches(const Recipe& r, const ModelSpec& m, const ClusterSpec& c,
                                           const RunSpec& run) {
  std::vector<std::string> d;
  auto cmp = [&](const char* field, const auto& recipe, const auto& ours) {
    if (!(recipe == ours)) d.push_back(fmt::format("{}: recipe {}, this run {}", field, recipe, ours));
  };
  cmp("model hash", r.model.hash(), m.hash());
  cmp("device", r.device, c.device.name);
  cmp("world size", r.world, c.gpus);
  cmp("ranks per GPU", r.ranks_per_device, c.device.shared_by);
  cmp("seq", r.run.seq, run.seq);
  cmp("global batch", r.run.global_batch, run.global_batch);
  cmp("precision", std::string(to_string(r.run.precision)), std::string(to_string(run.precision)));
  // LoRA changes what a layout holds and computes: a full fine-tuning
  // layout is no answer for a LoRA run, nor one of another rank or targets.
  const auto lora = [](const LoraSpec& l) {
    return l.enabled() ? fmt::format("r {} alpha {:g} dropout {:g} on {}", l.rank, l.alpha, l.dropout, l.targets_text())
                       : std::string("off");
  };
  cmp("LoRA", lora(r.run.lora), lora(run.lora));
  cmp("weft version", r.weft_version, std::string(WEFT_VERSION));
  return d;
}

std::vector<std::string> recipe_diff(const Recipe& a, const Recipe& b) {
  std::vector<std::string> d;
  const auto ja = recipe_to_json(a), jb = recipe_to_json(b);
  const auto flat_a = ja.flatten(), flat_b = jb.flatten();
  for (const auto& [k, v] : flat_a.items())
    if (!flat_b.contains(k)) d.push_back(fmt::format("{}: {} vs (absent)", k, v.dump()));
    else if (flat_b[k] != v) d.push_back(fmt::format("{}: {} vs {}", k, v.dump(), flat_b[k].dump()));
  for (const auto& [k, v] : flat_b.items())
    if (!flat_a.contains(k)) d.push_back(fmt::format("{}: (absent) vs {}", k, v.dump()));
  return d;
}

std::string recipe_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/weft/recipes";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/weft/recipes";
  throw InputError("neither XDG_CACHE_HOME nor HOME is set; cannot locate the recipe cache");
}

}  // namespace weft::tuner
