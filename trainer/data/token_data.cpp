#include "trainer/data/token_data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/data/formats.h"

namespace weft::data {

namespace fs = std::filesystem;

namespace {

constexpr char kMegatronIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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

TokenData prepared_dir_open(const fs::path& dir, Integrity integrity) {
  TokenData d;
  d.path = dir.string();
  d.meta = json_read_file((dir / "meta.json").string(), "data description");
  const auto split_file = [&](const char* split) -> std::string {
    const auto it = d.meta.find(split);
    if (it == d.meta.end() || it->is_null()) return "";
    if (!it->is_object() || !it->contains("file") || !(*it)["file"].is_string())
      throw FileFormatError(fmt::format("data description '{}' has no \"{}\": {{\"file\": ...}}",
                                        (dir / "meta.json").string(), split));
    return (dir / (*it)["file"].get<std::string>()).string();
  };
  const std::string train = split_file("train");
  if (train.empty())
    throw FileFormatError(
        fmt::format("data description '{}' names no train file", (dir / "meta.json").string()));
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
  auto file = std::make_shared<const MappedFile>(path);
  const uint8_t* b = file->data();
  const int64_t n = file->size();
  if (n >= 8 && std::memcmp(b, kTokenFileMagic, 8) == 0) return weft_tok_source(file, integrity);
  if (npy_detect(*file)) return npy_source(file);
  if (llmc_bin_detect(*file)) return llmc_bin_source(file);
  const bool megatron_idx = n >= 9 && std::memcmp(b, kMegatronIdxMagic, 9) == 0;
  if (megatron_idx ||
      (ends_with(path, ".bin") && fs::exists(path.substr(0, path.size() - 4) + ".idx")))
    throw FileFormatError(fmt::format(
        "'{}' is a Megatron .bin/.idx dataset, which weft does not read yet; convert it to "
        "weft .tok, llm.c .bin or numpy .npy",
        path));
  if (looks_like_text(*file))
    throw FileFormatError(fmt::format(
        "'{}' looks like text, not tokens; tokenize it first with `weft data prepare --input {} "
        "--out DIR` and pass DIR",
        path, path));
  throw FileFormatError(fmt::format(
      "'{}' is not a token file weft can read: expected weft .tok (magic WEFTTOK), llm.c .bin "
      "(magic {} or {}) or numpy .npy",
      path, kLlmcMagicU16, kLlmcMagicU32));
}

TokenData token_data_open(const std::string& path, Integrity integrity) {
  if (path.empty()) throw InputError("no data path given");
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw InputError(fmt::format("data path '{}' does not exist", path));
  if (fs::is_directory(st)) {
    const fs::path dir(path);
    if (fs::exists(dir / "meta.json")) return prepared_dir_open(dir, integrity);
    return shard_dir_open(dir, integrity);
  }
  TokenData d;
  d.path = path;
  d.train = token_source_open(path, integrity);
  return d;
}

void token_data_validate(const TokenData& data, int64_t vocab, int64_t seq) {
  WEFT_ASSERT(data.train != nullptr);
  if (seq <= 0) throw InputError(fmt::format("sequence length {} must be positive", seq));
  for (const TokenSource* s : {data.train.get(), data.val.get()}) {
    if (!s) continue;
    if (s->size() < seq + 1)
      throw InputError(fmt::format(
          "sequence length {} needs at least {} tokens (seq + 1) but {} is shorter; use a "
          "shorter --seq or more data",
          seq, seq + 1, s->describe()));
    validate_vocab(*s, vocab);
  }
}

double token_data_baseline(const TokenData& data) {
  if (data.meta.is_object() && data.meta.contains("unigram_entropy_nats") &&
      data.meta["unigram_entropy_nats"].is_number())
    return data.meta["unigram_entropy_nats"].get<double>();
  return unigram_entropy(*data.train);
}

}  // namespace weft::data
