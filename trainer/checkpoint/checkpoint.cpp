#include "trainer/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "memory/shapes.h"
#include "trainer/checkpoint/crc32c.h"

namespace weft::checkpoint {

namespace fs = std::filesystem;

namespace {

bool is_float(DType d) {
  return d == DType::F32 || d == DType::BF16 || d == DType::F16 || d == DType::F64;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

LoraSpec checkpoint_lora(const Manifest& man) {
  if (!man.run.is_object() || !man.run.contains("lora")) return {};
  try {
    return man.run.at("lora").get<LoraSpec>();
  } catch (const std::exception& e) {
    throw FileFormatError(fmt::format("manifest field run.lora: {}", e.what()));
  }
}

std::vector<ParamInfo> checkpoint_param_table(const Manifest& man) {
  const LoraSpec lora = checkpoint_lora(man);
  return lora.enabled() ? lora_param_table(man.model, lora) : hf_param_table(man.model);
}

namespace {

// Checks a set of model tensors against the model's table and returns them in
// table order. `fail` builds the exception for one fault.
template <typename Fail>
std::vector<TensorRef> model_tensors_checked(const std::vector<TensorRef>& tensors,
                                             const Manifest& man, Fail fail) {
  const ModelSpec& m = man.model;
  std::map<std::string, const TensorRef*> by_name;
  for (const auto& t : tensors)
    if (!by_name.emplace(t.name, &t).second)
      throw fail(fmt::format("tensor '{}' appears twice", t.name));
  std::vector<TensorRef> ordered;
  for (const auto& p : checkpoint_param_table(man)) {
    const auto it = by_name.find(p.name);
    if (it == by_name.end()) throw fail(fmt::format("model tensor '{}' is missing", p.name));
    const TensorRef& t = *it->second;
    if (t.shape != p.shape)
      throw fail(fmt::format("model tensor '{}' has shape {}, the model needs {}", p.name,
                             shape_text(t.shape), shape_text(p.shape)));
    if (!is_float(t.dtype))
      throw fail(fmt::format("model tensor '{}' has dtype {}, not a floating-point type", p.name,
                             to_string(t.dtype)));
    ordered.push_back(t);
    by_name.erase(it);
  }
  if (!by_name.empty())
    throw fail(fmt::format("tensor '{}' is not a parameter of this model{}", by_name.begin()->first,
                           m.tied_embeddings && by_name.contains("lm_head.weight")
                               ? " (its embeddings are tied: no lm_head.weight)"
                               : ""));
  return ordered;
}

// Checks optimizer tensor names and shapes against the model's table.
template <typename Fail>
void optimizer_tensors_check(const std::vector<TensorRef>& tensors, const Manifest& man, Fail fail) {
  const ModelSpec& m = man.model;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : checkpoint_param_table(man)) shapes.emplace(p.name, p.shape);
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    OptimState state;
    std::string param;
    if (!seen.insert(t.name).second) throw fail(fmt::format("tensor '{}' appears twice", t.name));
    if (t.name == kFp8HistoryTensor) {
      const std::vector<int64_t> want = {m.layers, memory::fp8_delayed_slots_per_block(m), kFp8DelayedHistory};
      if (t.shape != want || t.dtype != DType::F32)
        throw fail(fmt::format("tensor '{}' has shape {} and dtype {}; delayed FP8 scaling's history is {} F32",
                               t.name, shape_text(t.shape), to_string(t.dtype), shape_text(want)));
      continue;
    }
    if (!optim_state_parse(t.name, state, param))
      throw fail(
          fmt::format("optimizer tensor '{}' does not start with exp_avg., exp_avg_sq. or "
                      "master.",
                      t.name));
    const auto it = shapes.find(param);
    if (it == shapes.end())
      throw fail(fmt::format("optimizer tensor '{}' is for '{}', not a parameter of this model",
                             t.name, param));
    if (t.shape != it->second)
      throw fail(fmt::format("optimizer tensor '{}' has shape {}, the parameter has {}", t.name,
                             shape_text(t.shape), shape_text(it->second)));
    if (!is_float(t.dtype))
      throw fail(fmt::format("optimizer tensor '{}' has dtype {}, not a floating-point type",
                             t.name, to_string(t.dtype)));
  }
}

// CRC32C of a whole file, read through a private mapping.
uint32_t file_crc32c(const std::string& path, int64_t bytes) {
  if (bytes == 0) return crc32c(nullptr, 0);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw FileFormatError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
  void* map = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED)
    throw FileFormatError(fmt::format("cannot map '{}': {}", path, std::strerror(err)));
  ::madvise(map, static_cast<size_t>(bytes), MADV_SEQUENTIAL);
  const uint32_t crc = crc32c(map, static_cast<size_t>(bytes));
  ::munmap(map, static_cast<size_t>(bytes));
  return crc;
}

// A folder save_checkpoint may replace: a checkpoint (it has a manifest) or
// an empty folder. Anything else is refused rather than deleted.
void check_replaceable(const fs::path& dir) {
  if (!fs::exists(dir)) return;
  if (!fs::is_directory(dir))
    throw InputError(fmt::format("checkpoint path '{}' exists and is not a folder", dir.string()));
  if (fs::exists(dir / kManifestFile) || fs::is_empty(dir)) return;
  throw InputError(
      fmt::format("'{}' exists and is not a checkpoint folder (no {}); refusing to "
                  "replace it",
                  dir.string(), kManifestFile));
}

}  // namespace

Manifest save_checkpoint(const std::string& dir, const std::vector<TensorRef>& model_tensors,
                         const std::vector<TensorRef>& optimizer_tensors, const Manifest& manifest,
                         const SaveOptions& options) {
  const fs::path target = dir_path_clean(dir);
  const auto fail = [&](const std::string& what) {
    return InputError(fmt::format("cannot save checkpoint '{}': {}", target.string(), what));
  };
  manifest.model.validate();
  const std::vector<TensorRef> model = model_tensors_checked(model_tensors, manifest, fail);
  optimizer_tensors_check(optimizer_tensors, manifest, fail);
  check_replaceable(target);
  const auto stage = [&](std::string_view name) {
    if (options.on_stage) options.on_stage(name);
  };

  Manifest out = manifest;
  out.format_version = kCheckpointFormatVersion;
  out.weft_version = WEFT_VERSION;
  out.files.clear();

  const std::string tmp = temp_dir_name(target.string());
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a leftover of an earlier process with our pid
  dir_create(tmp);
  try {
    const auto write = [&](const char* name, const std::vector<TensorRef>& tensors) {
      const FileDigest d =
          safetensors_write((fs::path(tmp) / name).string(), tensors, {{"format", "pt"}});
      out.files.push_back({name, d.bytes, crc32c_text(d.crc32c)});
    };
    write(kModelFile, model);
    stage("model");
    write(kOptimizerFile, optimizer_tensors);
    stage("optimizer");
    file_write_atomic((fs::path(tmp) / kManifestFile).string(),
                      manifest_to_json(out).dump(2) + "\n");
    stage("manifest");
    fsync_dir(tmp);
    stage("synced");
    commit_dir(tmp, target.string(), options.on_stage);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return out;
}

Checkpoint load_checkpoint(const std::string& dir, Verify verify) {
  const fs::path root(dir);
  if (!fs::is_directory(root))
    throw InputError(fmt::format("checkpoint '{}' does not exist or is not a folder", dir));
  const auto fail = [&](const std::string& what) {
    return FileFormatError(fmt::format("checkpoint '{}' is unusable: {}", dir, what));
  };
  const std::string manifest_path = (root / kManifestFile).string();
  if (!fs::exists(manifest_path))
    throw fail(
        fmt::format("{} is missing (not a checkpoint, or an unfinished save)", kManifestFile));
  Manifest manifest =
      manifest_from_json(json_read_file(manifest_path, "checkpoint manifest"), manifest_path);

  // Sizes and checksums first: nothing in a file is parsed before its bytes
  // are known to be the ones that were written.
  for (const char* name : {kModelFile, kOptimizerFile}) {
    const FileRecord* rec = manifest.file(name);
    if (rec == nullptr) throw fail(fmt::format("{} does not list {}", kManifestFile, name));
    const fs::path p = root / name;
    std::error_code ec;
    const auto bytes = fs::file_size(p, ec);
    if (ec) throw fail(fmt::format("{} is missing: {}", name, ec.message()));
    if (static_cast<int64_t>(bytes) != rec->bytes)
      throw fail(fmt::format("{} is {} bytes but the manifest records {} (truncated or replaced)",
                             name, bytes, rec->bytes));
    if (verify == Verify::structure) continue;
    const std::string crc = crc32c_text(file_crc32c(p.string(), rec->bytes));
    if (crc != rec->checksum)
      throw fail(fmt::format("{} has checksum {} but the manifest records {} (corrupted)", name,
                             crc, rec->checksum));
  }

  SafetensorsFile model((root / kModelFile).string());
  SafetensorsFile optimizer((root / kOptimizerFile).string());
  model_tensors_checked(model.tensors(), manifest, [&](const std::string& what) {
    return fail(fmt::format("{}: {}", kModelFile, what));
  });
  optimizer_tensors_check(optimizer.tensors(), manifest, [&](const std::string& what) {
    return fail(fmt::format("{}: {}", kOptimizerFile, what));
  });
  return Checkpoint{dir, std::move(manifest), std::move(model), std::move(optimizer)};
}

std::vector<std::string> model_differences(const ModelSpec& c, const ModelSpec& m) {
  std::vector<std::string> out;
  const auto cmp = [&](const char* field, auto a, auto b) {
    if (a != b) out.push_back(fmt::format("{}: checkpoint {}, this run {}", field, a, b));
  };
  cmp("vocab", c.vocab, m.vocab);
  cmp("hidden", c.hidden, m.hidden);
  cmp("intermediate", c.intermediate, m.intermediate);
  cmp("layers", c.layers, m.layers);
  cmp("heads", c.heads, m.heads);
  cmp("kv_heads", c.kv_heads, m.kv_heads);
  cmp("head_dim", c.head_dim, m.head_dim);
  cmp("rope_theta", c.rope_theta, m.rope_theta);
  if (!(c.rope_scaling == m.rope_scaling))
    out.push_back(fmt::format("rope_scaling: checkpoint {}, this run {}",
                              rope_scaling_to_json(c.rope_scaling).dump(),
                              rope_scaling_to_json(m.rope_scaling).dump()));
  cmp("norm_eps", c.norm_eps, m.norm_eps);
  cmp("tied_embeddings", c.tied_embeddings, m.tied_embeddings);
  // The experts and the attention variants, as the hash counts them (the
  // balancing loss's coefficient and scope are training settings).
  const auto moe_text = [](const ModelSpec& x) {
    if (!x.moe.enabled()) return std::string("dense");
    const MoeSpec& e = x.moe;
    return fmt::format("{} experts of width {}, top-{}, {} {}, scale {}, gate on the {}, shared {}, MoE layers {}",
                       e.experts, e.expert_intermediate, e.top_k, router_score_name(e.score),
                       router_weights_name(e.weights), e.route_scale, gate_on_name(e.gate_on),
                       e.shared_intermediate, x.moe_layers());
  };
  MoeSpec ce = c.moe, me = m.moe;
  ce.aux_loss_coef = me.aux_loss_coef = 0;
  ce.aux_scope = me.aux_scope = AuxLossScope::global;
  ce.capacity_factor = me.capacity_factor = 0;
  ce.imbalance = me.imbalance = 0;
  if (!(ce == me)) cmp("moe", moe_text(c), moe_text(m));
  const auto attention_text = [](const AttentionVariant& a) {
    return fmt::format("qk norm {}, NoPE every {}, chunk {}, temperature {}/{}", qk_norm_name(a.qk_norm),
                       a.nope_interval, a.attention_chunk, a.temperature_scale, a.temperature_floor);
  };
  if (!(c.attention == m.attention)) cmp("attention", attention_text(c.attention), attention_text(m.attention));
  return out;
}

void check_compatible(const Manifest& manifest, const ModelSpec& model, const std::string& origin) {
  const auto diffs = model_differences(manifest.model, model);
  if (!diffs.empty())
    throw InputError(fmt::format("{} is of a different model ({} {}, this run {} {}): {}", origin,
                                 manifest.model.name, manifest.model.hash(), model.name,
                                 model.hash(), fmt::join(diffs, "; ")));
}

std::string checkpoint_dir_name(int64_t step) { return fmt::format("step_{:06d}", step); }

namespace {

// The N of "step_N" or "step_N.old-<pid>"; nullopt for any other name.
std::optional<int64_t> parse_step_name(const std::string& name, bool& moved_aside) {
  constexpr std::string_view prefix = "step_";
  if (!name.starts_with(prefix)) return std::nullopt;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end == first || step < 0) return std::nullopt;
  const std::string_view rest(end, static_cast<size_t>(last - end));
  moved_aside = false;
  if (rest.empty()) return step;
  constexpr std::string_view old = ".old-";
  if (rest.starts_with(old) && rest.size() > old.size() &&
      rest.substr(old.size()).find_first_not_of("0123456789") == std::string_view::npos) {
    moved_aside = true;
    return step;
  }
  return std::nullopt;
}

// Why `dir` is not a complete checkpoint: its manifest does not parse, or a
// file is missing or not at its recorded size (checksums are left to
// load_checkpoint); empty when it looks complete.
std::string incompleteness(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "it is missing";
  try {
    const Manifest m = manifest_from_json(
        json_read_file((dir / kManifestFile).string(), "checkpoint manifest"), dir.string());
    for (const char* name : {kModelFile, kOptimizerFile}) {
      const FileRecord* rec = m.file(name);
      if (rec == nullptr) return fmt::format("its manifest lists no {}", name);
      const auto bytes = fs::file_size(dir / name, ec);
      if (ec) return fmt::format("{} is missing", name);
      if (static_cast<int64_t>(bytes) != rec->bytes)
        return fmt::format("{} is {} bytes, its manifest says {}", name, bytes, rec->bytes);
    }
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

// The step folders under `root`, newest first: by step, and at one step a
// plain step_N before a moved-aside step_N.old-<pid>.
std::vector<fs::path> step_folders(const fs::path& root) {
  std::vector<std::tuple<int64_t, bool, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec)) continue;
    bool moved_aside = false;
    if (const auto step = parse_step_name(entry.path().filename().string(), moved_aside))
      found.emplace_back(*step, moved_aside, entry.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
    if (std::get<1>(a) != std::get<1>(b)) return !std::get<1>(a);
    return std::get<2>(a) < std::get<2>(b);
  });
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::get<2>(f));
  return out;
}

// The folder "<root>/latest" names, when it names a plain step folder.
std::optional<fs::path> latest_named(const fs::path& root) {
  std::ifstream in(root / "latest");
  if (!in) return std::nullopt;
  std::string name;
  std::getline(in, name);
  bool moved_aside = false;
  if (!parse_step_name(name, moved_aside) || moved_aside) return std::nullopt;
  return root / name;
}

}  // namespace

void mark_latest(const std::string& root, const std::string& dir_name) {
  file_write_atomic((fs::path(root) / "latest").string(), dir_name + "\n");
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  if (const auto named = latest_named(root); named && incompleteness(*named).empty()) return named->string();
  for (const auto& d : step_folders(root))
    if (incompleteness(d).empty()) return d.string();
  return std::nullopt;
}

std::optional<std::string> resume_checkpoint(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  const auto folders = step_folders(root);
  // The newest checkpoint: the one written last, as "latest" records it,
  // else the highest step. A save that died between moving the old folder
  // aside and putting the new one in place left step_N.old-<pid>, the old
  // checkpoint of that step, complete: it stands in for a missing step_N.
  std::optional<fs::path> newest = latest_named(root);
  if (newest && !fs::exists(*newest, ec)) {
    const std::string base = newest->filename().string() + ".old-";
    for (const auto& d : folders)
      if (d.filename().string().starts_with(base) && incompleteness(d).empty()) return d.string();
  }
  // Without "latest" (checkpoints of another writer): the highest step that
  // was committed, which a manifest marks; a bare step folder never was.
  if (!newest)
    for (const auto& d : folders)
      if (fs::exists(d / kManifestFile, ec)) {
        newest = d;
        break;
      }
  if (!newest) return std::nullopt;
  const std::string fault = incompleteness(*newest);
  if (fault.empty()) return newest->string();
  throw resume_damaged(root, newest->string(), fault);
}

InputError resume_damaged(const std::string& root, const std::string& newest, const std::string& fault) {
  // Never fall back on our own: the run would redo the steps after the older
  // checkpoint, and its metrics would say them twice. The one named is
  // intact to its checksums.
  std::string older;
  std::error_code ec;
  for (const auto& d : step_folders(root)) {
    if (fs::equivalent(d, newest, ec) || !incompleteness(d).empty()) continue;
    try {
      (void)load_checkpoint(d.string());
    } catch (const Error&) {
      continue;
    }
    older = d.string();
    break;
  }
  return InputError(fmt::format(
      "cannot resume: the newest checkpoint {} is damaged ({}); weft does not fall back to an older one by "
      "itself. {}",
      newest, fault,
      older.empty() ? std::string("No intact checkpoint is left in ") + root +
                          "; start again with --overwrite (the run is moved aside, not deleted)"
                    : fmt::format("To continue from the newest intact one, give --resume-from {} (the steps after "
                                  "it are trained again, and their earlier metrics are moved aside)",
                                  older)));
}

}  // namespace weft::checkpoint
