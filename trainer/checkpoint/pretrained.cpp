#include "trainer/checkpoint/pretrained.h"

#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/checkpoint/crc32c.h"
#include "trainer/checkpoint/llama4_form.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

bool is_float(DType d) {
  return d == DType::F32 || d == DType::BF16 || d == DType::F16 || d == DType::F64;
}

// What `dir` is; InputError saying what it lacks when it is neither kind.
PretrainedKind kind_of(const std::string& dir) {
  const fs::path p(dir);
  std::error_code ec;
  if (!fs::exists(p, ec))
    throw InputError(fmt::format("model folder '{}' does not exist", dir));
  if (!fs::is_directory(p, ec))
    throw InputError(fmt::format("'{}' is a file, not a model folder; pass the folder that holds {} and "
                                 "the safetensors (Hugging Face), or a weft checkpoint folder",
                                 dir, kHfConfigFile));
  if (fs::exists(p / kManifestFile)) return PretrainedKind::weft_checkpoint;
  if (fs::exists(p / kHfConfigFile)) return PretrainedKind::hugging_face;
  std::string hint;
  if (const auto latest = latest_checkpoint(dir))
    hint = fmt::format("; it holds weft checkpoints: pass one of them, e.g. '{}'", *latest);
  throw InputError(fmt::format("'{}' is not a checkpoint: neither a Hugging Face model folder (no {}) "
                               "nor a weft checkpoint folder (no {}){}",
                               dir, kHfConfigFile, kManifestFile, hint));
}

// A token id of config.json, or -1 when absent, null or a list.
int64_t token_id(const nlohmann::json& config, const char* key) {
  return config.contains(key) && config[key].is_number_integer() ? config[key].get<int64_t>() : -1;
}

// Tensors of a Hugging Face folder that hold no parameter and are skipped.
bool ignored_tensor(const std::string& name, const ModelSpec& m) {
  return name.ends_with(".rotary_emb.inv_freq") ||
         (m.tied_embeddings && name == hf_param_name(ParamKind::lm_head));
}

// Each parameter of the model from the folder's tensors, checked; throws a
// FileFormatError naming the folder, the file and the tensor. Llama 4's
// experts and q/k projections are converted into `converted`.
std::map<std::string, TensorRef, std::less<>> hf_params(const HfFolder& f,
                                                        std::vector<std::vector<std::byte>>& converted) {
  const auto fail = [&](const std::string& what) {
    return FileFormatError(fmt::format("Hugging Face folder '{}': {}", f.dir, what));
  };
  std::map<std::string, TensorRef, std::less<>> out;
  std::set<std::string, std::less<>> read;  // the stored tensors the parameters came from
  for (const auto& p : hf_param_table(f.model)) {
    if (const auto from = llama4_source(f.model, p)) {
      const auto it = f.tensors.find(from->tensor);
      if (it == f.tensors.end())
        throw fail(fmt::format("tensor '{}' is missing (in none of {})", from->tensor,
                               f.files.size() == 1 ? "its weight file" : "its weight files"));
      const TensorRef& t = it->second;
      const std::string& file = f.file_of.find(from->tensor)->second;
      if (t.shape != from->shape)
        throw fail(fmt::format("tensor '{}' in {} has shape {}, but {} describes a model whose '{}' is {}",
                               from->tensor, file, shape_text(t.shape), kHfConfigFile, from->tensor,
                               shape_text(from->shape)));
      if (!is_float(t.dtype))
        throw fail(fmt::format("tensor '{}' in {} has dtype {}; weights must be F32, BF16, F16 or F64",
                               from->tensor, file, to_string(t.dtype)));
      read.insert(from->tensor);
      converted.push_back(llama4_from_stored(f.model, p, t));
      out.emplace(p.name, TensorRef{p.name, t.dtype, p.shape, converted.back().data()});
      continue;
    }
    const auto it = f.tensors.find(p.name);
    if (it == f.tensors.end())
      throw fail(fmt::format("tensor '{}' is missing (in none of {})", p.name,
                             f.files.size() == 1 ? "its weight file" : "its weight files"));
    const TensorRef& t = it->second;
    const std::string& file = f.file_of.find(p.name)->second;
    if (t.shape != p.shape)
      throw fail(fmt::format("tensor '{}' in {} has shape {}, but {} describes a model whose '{}' is {}",
                             p.name, file, shape_text(t.shape), kHfConfigFile, p.name,
                             shape_text(p.shape)));
    if (!is_float(t.dtype))
      throw fail(fmt::format("tensor '{}' in {} has dtype {}; weights must be F32, BF16, F16 or F64",
                             p.name, file, to_string(t.dtype)));
    out.emplace(p.name, t);
    read.insert(p.name);
  }
  for (const auto& [name, t] : f.tensors)
    if (!read.contains(name) && !ignored_tensor(name, f.model))
      throw fail(fmt::format("tensor '{}' in {} is not a parameter of weft's Llama for this config "
                             "(biases and other architectures are not supported); refusing to drop it",
                             name, f.file_of.find(name)->second));
  return out;
}

}  // namespace

const TensorRef& Pretrained::param(std::string_view name) const {
  const auto it = params.find(name);
  WEFT_ASSERT(it != params.end());
  return it->second;
}

std::string Pretrained::describe() const {
  std::set<std::string> dtypes;
  for (const auto& [name, t] : params) dtypes.insert(to_string(t.dtype));
  if (kind == PretrainedKind::weft_checkpoint)
    return fmt::format("weft checkpoint '{}' (step {}, {})", dir, checkpoint->manifest.step,
                       fmt::join(dtypes, "+"));
  return fmt::format("Hugging Face folder '{}' ({} weight file{}, {})", dir, hf->files.size(),
                     hf->files.size() == 1 ? "" : "s", fmt::join(dtypes, "+"));
}

std::string pretrained_hash(const Pretrained& p) {
  uint32_t crc = 0;
  for (const auto& [name, t] : p.params) {  // a std::map: name order
    const std::string head = fmt::format("{}|{}|{}|", name, to_string(t.dtype), shape_text(t.shape));
    crc = crc32c_update(crc, head.data(), head.size());
    crc = crc32c_update(crc, t.data, size_t(t.bytes()));
  }
  return crc32c_text(crc);
}

ModelSpec pretrained_model(const std::string& dir) {
  if (kind_of(dir) == PretrainedKind::hugging_face) return hf_folder_model(dir);
  const std::string path = (fs::path(dir) / kManifestFile).string();
  return manifest_from_json(json_read_file(path, "checkpoint manifest"), path).model;
}

Pretrained pretrained_open(const std::string& dir, Verify verify) {
  Pretrained p;
  p.dir = dir;
  p.kind = kind_of(dir);
  if (p.kind == PretrainedKind::hugging_face) {
    p.hf = hf_folder_open(dir);
    p.model = p.hf->model;
    p.params = hf_params(*p.hf, p.converted);
    p.bos_token_id = token_id(p.hf->config, "bos_token_id");
    p.eos_token_id = token_id(p.hf->config, "eos_token_id");
    return p;
  }
  // load_checkpoint has checked every parameter's name, shape and dtype
  // against the manifest's model.
  p.checkpoint = load_checkpoint(dir, verify);
  const Checkpoint& ck = *p.checkpoint;
  p.model = ck.manifest.model;
  p.bos_token_id = ck.manifest.bos_token_id;
  p.eos_token_id = ck.manifest.eos_token_id;
  for (const auto& info : hf_param_table(p.model)) {
    const TensorRef* master = ck.optimizer.find(optim_state_name(OptimState::master, info.name));
    p.params.emplace(info.name, master && master->dtype == DType::F32 ? *master : ck.model.at(info.name));
  }
  return p;
}

void pretrained_check(const ModelSpec& pretrained, const ModelSpec& run, const std::string& dir) {
  // A larger vocabulary is padding; compare the rest as if it were equal.
  ModelSpec same_vocab = run;
  if (run.vocab > pretrained.vocab) same_vocab.vocab = pretrained.vocab;
  const auto diffs = model_differences(pretrained, same_vocab);
  if (diffs.empty()) return;
  throw InputError(fmt::format("'{}' holds a different model than this run: {}{}", dir,
                               fmt::join(diffs, "; "),
                               run.vocab < pretrained.vocab
                                   ? " (a run may pad the vocabulary with --vocab, not cut it)"
                                   : ""));
}

}  // namespace weft::checkpoint
