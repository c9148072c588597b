#include "data/token_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "data/blend.h"
#include "data/formats.h"
#include "data/megatron_file.h"

namespace weft::data {

namespace fs = std::filesystem;

namespace {

// Text never tokenized is the likeliest wrong input; it deserves a hint.
bool looks_like_text(const MappedFile& f) {
  const int64_t n = std::min<int64_t>(f.size(), 4096);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t c = f.data()[i];
    if (c < 0x20 && c != '\n' && c != '\r' && c != '\t') return false;
  }
  return true;
}

std::unique_ptr<TokenSource> shards_open(const std::vector<fs::path>& files, Integrity integrity) {
  std::vector<std::unique_ptr<TokenSource>> parts;
  for (const auto& f : files) parts.push_back(token_source_open(f.string(), integrity));
  if (parts.size() == 1) return std::move(parts[0]);
  return std::make_unique<ConcatTokenSource>(std::move(parts));
}

// Checks the fields of a prepared folder's meta.json that weft reads, so a
// hand-edited or damaged file is one FileFormatError naming the field rather
// than a JSON type error deep in a reader. Fields weft only records are not
// checked.
void meta_check(const nlohmann::json& meta, const std::string& path) {
  const auto bad = [&](const std::string& field, const std::string& want) {
    return FileFormatError(fmt::format("data description '{}': \"{}\" must be {}", path, field, want));
  };
  if (!meta.is_object()) throw FileFormatError(fmt::format("data description '{}' is not a JSON object", path));
  for (const char* split : {"train", "val"}) {
    const auto it = meta.find(split);
    if (it == meta.end() || it->is_null()) continue;
    const std::string field = std::string(split) + ".file";
    if (!it->is_object() || !it->contains("file") || !(*it)["file"].is_string())
      throw FileFormatError(
          fmt::format("data description '{}' has no \"{}\": {{\"file\": ...}}", path, split));
    // A prepared folder names its own files; a path that leaves the folder
    // is not one weft wrote.
    const fs::path file((*it)["file"].get<std::string>());
    bool escapes = file.empty() || file.is_absolute();
    for (const auto& part : file) escapes = escapes || part == "..";
    if (escapes)
      throw bad(field, fmt::format("a file name inside the folder, got {}", (*it)["file"].dump()));
  }
  if (meta.contains("vocab")) {
    const auto& v = meta["vocab"];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{1} << 32) ||
        (!v.is_number_unsigned() && (v.get<int64_t>() < 0 || v.get<int64_t>() > int64_t{1} << 32)))
      throw bad("vocab", fmt::format("a whole number from 0 to 2^32, got {}", v.dump()));
  }
  if (meta.contains("unigram_entropy_nats")) {
    const auto& v = meta["unigram_entropy_nats"];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      throw bad("unigram_entropy_nats", fmt::format("a finite number >= 0, got {}", v.dump()));
  }
  for (const char* field : {"created_by", "tokenizer", "token_format"})
    if (meta.contains(field) && !meta[field].is_string())
      throw bad(field, fmt::format("a string, got {}", meta[field].dump()));
  for (const auto& [field, key] : {std::pair{"tokenizer_file", "path"}, std::pair{"document_tokens", "description"}}) {
    if (!meta.contains(field) || meta[field].is_null()) continue;
    if (!meta[field].is_object()) throw bad(field, fmt::format("an object or null, got {}", meta[field].dump()));
    if (meta[field].contains(key) && !meta[field][key].is_string())
      throw bad(std::string(field) + "." + key, fmt::format("a string, got {}", meta[field][key].dump()));
  }
}

TokenData prepared_dir_open(const fs::path& dir, Integrity integrity) {
  TokenData d;
  d.path = dir.string();
  const std::string meta_path = (dir / "meta.json").string();
  d.meta = json_read_file(meta_path, "data description");
  meta_check(d.meta, meta_path);
  const auto split_file = [&](const char* split) -> std::string {
    const auto it = d.meta.find(split);
    if (it == d.meta.end() || it->is_null()) return "";
    return (dir / (*it)["file"].get<std::string>()).string();
  };
  const std::string train = split_file("train");
  if (train.empty())
    throw FileFormatError(fmt::format("data description '{}' names no train file", meta_path));
  d.train = token_source_open(train, integrity);
  const std::string val = split_file("val");
  if (!val.empty()) d.val = token_source_open(val, integrity);
  return d;
}

TokenData shard_dir_open(const fs::path& dir, Integrity integrity) {
  std::vector<fs::path> train, val;
  bool any = false;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto& e = *it;
    any = true;
    if (!e.is_regular_file(ec)) continue;
    const std::string name = e.path().filename().string();
    const std::string ext = e.path().extension().string();
    if (ext != ".tok" && ext != ".bin" && ext != ".npy") continue;
    if (name.find("train") != std::string::npos)
      train.push_back(e.path());
    else if (name.find("val") != std::string::npos)
      val.push_back(e.path());
  }
  if (ec)
    throw InputError(fmt::format("cannot list data folder '{}': {}", dir.string(), ec.message()));
  if (!any) throw InputError(fmt::format("data folder '{}' is empty", dir.string()));
  if (train.empty())
    throw InputError(fmt::format(
        "data folder '{}' has neither a meta.json from `weft data prepare` nor token files named "
        "*train*.tok, *train*.bin or *train*.npy",
        dir.string()));
  std::sort(train.begin(), train.end());
  std::sort(val.begin(), val.end());
  TokenData d;
  d.path = dir.string();
  d.train = shards_open(train, integrity);
  if (!val.empty()) d.val = shards_open(val, integrity);
  return d;
}

}  // namespace

std::unique_ptr<TokenSource> token_source_open(const std::string& path, Integrity integrity) {
  if (const auto megatron = megatron_paths(path)) return megatron_open(*megatron, integrity);
  auto file = std::make_shared<const MappedFile>(path);
  const uint8_t* b = file->data();
  const int64_t n = file->size();
  if (n >= 8 && std::memcmp(b, kTokenFileMagic, 8) == 0) return weft_tok_source(file, integrity);
  if (npy_detect(*file)) return npy_source(file);
  if (llmc_bin_detect(*file)) return llmc_bin_source(file);
  if (n >= 9 && std::memcmp(b, kMegatronIdxMagic, 9) == 0)
    throw FileFormatError(fmt::format(
        "'{}' is a Megatron index whose name does not end in .idx; name the pair PREFIX.bin and "
        "PREFIX.idx and pass PREFIX",
        path));
  if (looks_like_text(*file))
    throw FileFormatError(fmt::format(
        "'{}' looks like text, not tokens; tokenize it first with `weft data prepare --input {} "
        "--out DIR` and pass DIR",
        path, path));
  throw FileFormatError(fmt::format(
      "'{}' is not a token file weft can read: expected weft .tok (magic WEFTTOK), llm.c .bin "
      "(magic {} or {}), numpy .npy, or a Megatron PREFIX.bin with its PREFIX.idx beside it",
      path, kLlmcMagicU16, kLlmcMagicU32));
}

TokenData token_data_open(const std::string& path, Integrity integrity) {
  if (path.empty()) throw InputError("no data path given");
  std::error_code ec;
  const auto st = fs::status(path, ec);
  const bool megatron_prefix = !fs::exists(st) && megatron_paths(path);
  if (!megatron_prefix && (ec || !fs::exists(st)))
    throw InputError(fmt::format("data path '{}' does not exist", path));
  if (!megatron_prefix && fs::is_directory(st)) {
    const fs::path dir(path);
    if (fs::exists(dir / "meta.json")) return prepared_dir_open(dir, integrity);
    return shard_dir_open(dir, integrity);
  }
  TokenData d;
  d.path = path;
  d.train = token_source_open(path, integrity);
  return d;
}

TokenData token_data_open(const DataSpec& spec, Integrity integrity) {
  if (spec.paths.empty()) throw InputError("no data path given");
  if (spec.paths.size() == 1) return token_data_open(spec.paths[0], integrity);
  std::vector<std::unique_ptr<TokenSource>> train, val;
  std::vector<double> train_weights, val_weights;
  for (size_t i = 0; i < spec.paths.size(); ++i) {
    TokenData part = token_data_open(spec.paths[i], integrity);
    const double w = spec.blend() ? spec.weights[i] : 1.0;
    train.push_back(std::move(part.train));
    train_weights.push_back(w);
    if (part.val) {
      val.push_back(std::move(part.val));
      val_weights.push_back(w);
    }
  }
  TokenData d;
  d.path = spec.describe();
  const auto join = [&](std::vector<std::unique_ptr<TokenSource>> parts,
                        std::vector<double> weights) -> std::unique_ptr<TokenSource> {
    if (spec.blend())
      return std::make_unique<BlendTokenSource>(std::move(parts), std::move(weights));
    return std::make_unique<ConcatTokenSource>(std::move(parts));
  };
  d.train = join(std::move(train), std::move(train_weights));
  double val_weight = 0;
  for (const double w : val_weights) val_weight += w;
  if (!val.empty() && val_weight > 0) d.val = join(std::move(val), std::move(val_weights));
  return d;
}

void token_data_validate(const TokenData& data, int64_t vocab, int64_t seq) {
  WEFT_ASSERT(data.train != nullptr);
  if (seq <= 0) throw InputError(fmt::format("sequence length {} must be positive", seq));
  for (const TokenSource* s : {data.train.get(), data.val.get()}) {
    if (!s) continue;
    for (const WeightedPart& part : s->blend_parts())
      if (part.weight > 0 && part.source->size() < seq + 1)
        throw InputError(fmt::format(
            "sequence length {} needs at least {} tokens (seq + 1) but {} is shorter; use a "
            "shorter --seq or more data",
            seq, seq + 1, part.source->describe()));
    validate_vocab(*s, vocab);
  }
}

int64_t token_data_meta_vocab(const TokenData& data) {
  return data.meta.is_object() ? data.meta.value("vocab", int64_t{0}) : 0;
}

std::vector<std::string> token_data_meta_lines(const TokenData& data) {
  std::vector<std::string> lines;
  if (!data.meta.is_object()) return lines;
  const auto& m = data.meta;
  lines.push_back(fmt::format("{}: prepared by {}, {} tokenizer, vocab {}", data.path, m.value("created_by", "?"),
                              m.value("tokenizer", "?"), token_data_meta_vocab(data)));
  // Older folders have neither field.
  const auto file = m.value("tokenizer_file", nlohmann::json());
  if (file.is_object()) lines.push_back(fmt::format("  tokenizer file {}", file.value("path", "?")));
  const auto doc = m.value("document_tokens", nlohmann::json());
  if (doc.is_object()) lines.push_back(fmt::format("  documents: {}", doc.value("description", "?")));
  return lines;
}

double token_data_baseline(const TokenData& data) {
  // meta_check made it a finite number when present.
  if (data.meta.is_object() && data.meta.contains("unigram_entropy_nats"))
    return data.meta["unigram_entropy_nats"].get<double>();
  return unigram_entropy(*data.train);
}

}  // namespace weft::data
