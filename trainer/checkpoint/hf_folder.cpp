#include "trainer/checkpoint/hf_folder.h"

#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/checkpoint/hf_names.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingleFile = "model.safetensors";

// The weight files of the folder, in name order: model.safetensors, or the
// shards the index names. Fills `placed` with the index's tensor -> shard.
std::vector<std::string> weight_files(const fs::path& dir,
                                      std::map<std::string, std::string>& placed) {
  if (fs::exists(dir / kSingleFile)) return {kSingleFile};
  const fs::path index = dir / kHfIndexFile;
  if (!fs::exists(index)) {
    std::string hint;
    if (fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json"))
      hint =
          "; it holds pytorch_model.bin, a Python pickle weft does not read: convert it with "
          "transformers, LlamaForCausalLM.from_pretrained(folder).save_pretrained(new_folder) "
          "writes safetensors";
    throw InputError(fmt::format("Hugging Face folder '{}' has {} but no {} or {}{}", dir.string(),
                                 kHfConfigFile, kSingleFile, kHfIndexFile, hint));
  }
  const auto fail = [&](const std::string& what) {
    return FileFormatError(fmt::format("'{}': {}", index.string(), what));
  };
  const nlohmann::json j = json_read_file(index.string(), "safetensors index");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw fail("no \"weight_map\" object of tensor name -> shard file");
  std::set<std::string> files;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw fail(fmt::format("weight_map entry '{}' is {}, not a file name", tensor, file.dump()));
    const std::string name = file.get<std::string>();
    // Shards are plain file names beside the index: a path could reach outside.
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw fail(fmt::format("weight_map places '{}' in '{}', which is not a file name in the folder",
                             tensor, name));
    if (!fs::is_regular_file(dir / name))
      throw fail(fmt::format("weight_map places '{}' in shard '{}', which is missing", tensor, name));
    placed[tensor] = name;
    files.insert(name);
  }
  if (files.empty()) throw fail("weight_map is empty");
  return {files.begin(), files.end()};
}

}  // namespace

ModelSpec hf_folder_model(const std::string& dir, nlohmann::json* config) {
  const std::string path = (fs::path(dir) / kHfConfigFile).string();
  nlohmann::json j = json_read_file(path, "Hugging Face model config");
  ModelSpec m = model_from_hf_config_json(j, path);
  if (config) *config = std::move(j);
  return m;
}

HfFolder hf_folder_open(const std::string& dir) {
  HfFolder f;
  f.dir = dir;
  f.model = hf_folder_model(dir, &f.config);
  f.model.require_computed("load the weights of");
  std::map<std::string, std::string> placed;
  const auto names = weight_files(dir, placed);
  for (const auto& name : names) {
    SafetensorsFile& file = f.files.emplace_back((fs::path(dir) / name).string());
    for (const auto& t : file.tensors()) {
      const auto [it, fresh] = f.file_of.emplace(t.name, name);
      if (!fresh)
        throw FileFormatError(fmt::format("Hugging Face folder '{}': tensor '{}' is stored twice, in "
                                          "'{}' and '{}'",
                                          dir, t.name, it->second, name));
      f.tensors.emplace(t.name, t);
    }
  }
  for (const auto& [tensor, shard] : placed) {
    const auto it = f.file_of.find(tensor);
    if (it == f.file_of.end() || it->second != shard)
      throw FileFormatError(fmt::format("Hugging Face folder '{}': {} places tensor '{}' in '{}', "
                                        "which does not hold it",
                                        dir, kHfIndexFile, tensor, shard));
  }
  return f;
}

}  // namespace weft::checkpoint
