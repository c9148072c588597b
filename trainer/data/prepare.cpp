#include "trainer/data/prepare.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "trainer/data/mapped_file.h"
#include "trainer/data/permutation.h"
#include "trainer/data/split_writer.h"
#include "trainer/data/token_data.h"
#include "trainer/data/token_file.h"
#include "trainer/data/tokenizer.h"

namespace weft::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSplitRule =
    "documents ('%'-line separated in fortune-format files, else whole files) visited in a "
    "seeded random order go to val while they fit under val_fraction of all bytes; if none "
    "fits, val is the tail of the last document cut at a line start";

enum class Split { train, val };

// A run of one input file's bytes bound for one split.
struct Piece {
  size_t file;
  int64_t offset;
  int64_t bytes;
  Split split = Split::train;
};

bool is_separator_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line == "%";
}

// A fresh sibling of `target` no one else will pick: pid and a counter.
fs::path temp_sibling(const fs::path& target, const char* tag) {
  static std::atomic<int> counter{0};
  return target.parent_path() /
         fmt::format(".{}.{}-{}-{}", target.filename().string(), tag, ::getpid(), counter++);
}

void out_check(const PrepareOptions& o) {
  if (o.out.empty()) throw InputError("no output folder: pass --out DIR");
  std::error_code ec;
  const auto st = fs::status(o.out, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st))
    throw InputError(fmt::format("--out '{}' exists and is not a folder", o.out));
  if (fs::is_empty(o.out, ec)) return;
  if (!o.force)
    throw InputError(fmt::format(
        "--out '{}' already exists and is not empty; choose a new folder, or pass --force to "
        "replace a prepared dataset",
        o.out));
  if (!fs::exists(fs::path(o.out) / "meta.json"))
    throw InputError(fmt::format(
        "--out '{}' is not a prepared dataset (no meta.json), so --force will not replace it; "
        "choose a new folder",
        o.out));
}

// Moves the finished folder into place. rename(2) replaces an empty folder;
// a prepared one (force) is first moved aside, then removed.
void folder_commit(const fs::path& tmp, const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out) || fs::is_empty(out)) {
    fs::rename(tmp, out, ec);
    if (ec)
      throw InputError(
          fmt::format("cannot move the prepared data into '{}': {}", out.string(), ec.message()));
    return;
  }
  const fs::path old = temp_sibling(out, "old");
  fs::rename(out, old, ec);
  if (ec) throw InputError(fmt::format("cannot replace '{}': {}", out.string(), ec.message()));
  fs::rename(tmp, out, ec);
  if (ec) {
    std::error_code ignored;
    fs::rename(old, out, ignored);
    throw InputError(
        fmt::format("cannot move the prepared data into '{}': {}", out.string(), ec.message()));
  }
  fs::remove_all(old, ec);
}

// Assigns pieces to splits; see the rule in prepare.h.
void split_assign(std::vector<Piece>& pieces, const std::vector<std::shared_ptr<MappedFile>>& files,
                  double val_fraction, uint64_t seed) {
  if (val_fraction <= 0) return;
  int64_t total = 0;
  for (const auto& p : pieces) total += p.bytes;
  const int64_t target =
      std::max<int64_t>(1, std::llround(val_fraction * static_cast<double>(total)));
  const Permutation order(static_cast<int64_t>(pieces.size()), mix64(seed));
  int64_t val = 0;
  for (int64_t i = 0; i < order.size() && val < target; ++i) {
    Piece& p = pieces[static_cast<size_t>(order.at(i))];
    if (val + p.bytes > target) continue;
    p.split = Split::val;
    val += p.bytes;
  }
  if (val > 0) return;
  // Every document is larger than the target: cut the last one.
  Piece last = pieces.back();
  const uint8_t* text = files[last.file]->data();
  const int64_t end = last.offset + last.bytes;
  int64_t cut = end - target;
  int64_t q = cut;
  while (q < end && text[q - 1] != '\n') ++q;
  if (q < end) cut = q;
  pieces.back().bytes = cut - last.offset;
  pieces.push_back({last.file, cut, end - cut, Split::val});
}

nlohmann::json split_meta(const SplitFile& f) {
  return {{"file", f.file},
          {"tokens", f.tokens},
          {"documents", f.documents},
          {"dtype", dtype_name(f.dtype)},
          {"checksum", fmt::format("{:016x}", f.checksum)}};
}

}  // namespace

std::vector<std::string_view> text_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t doc_start = 0, line_start = 0;
  while (line_start < text.size()) {
    const size_t nl = text.find('\n', line_start);
    const size_t line_end = nl == std::string_view::npos ? text.size() : nl;
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    if (is_separator_line(text.substr(line_start, line_end - line_start))) {
      docs.push_back(text.substr(doc_start, next - doc_start));
      doc_start = next;
    }
    line_start = next;
  }
  if (doc_start < text.size()) docs.push_back(text.substr(doc_start));
  return docs;
}

namespace {

PrepareResult prepare_checked(const PrepareOptions& o) {
  // Every check that can fail comes before anything is written.
  if (o.inputs.empty()) throw InputError("no input files: pass --input FILE...");
  const auto tokenizer = tokenizer_create(o.tokenizer);
  if (!std::isfinite(o.val_fraction) || o.val_fraction < 0 || o.val_fraction > 0.5)
    throw InputError(fmt::format("--val-fraction {} must be in [0, 0.5]", o.val_fraction));
  out_check(o);
  std::vector<std::shared_ptr<MappedFile>> files;
  for (const auto& in : o.inputs) {
    if (fs::is_directory(in))
      throw InputError(fmt::format("input '{}' is a folder; pass its text files", in));
    files.push_back(std::make_shared<MappedFile>(in, "input file"));
  }

  std::vector<Piece> pieces;
  std::vector<int64_t> file_documents;
  int64_t total = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string_view text(reinterpret_cast<const char*>(files[f]->data()),
                                static_cast<size_t>(files[f]->size()));
    const auto docs = text_documents(text);
    for (const auto d : docs)
      pieces.push_back(
          {f, static_cast<int64_t>(d.data() - text.data()), static_cast<int64_t>(d.size())});
    file_documents.push_back(static_cast<int64_t>(docs.size()));
    total += files[f]->size();
  }
  if (o.val_fraction > 0 && total < 2)
    throw InputError(fmt::format(
        "the input holds {} byte, too little to split off a validation set; add text or pass "
        "--val-fraction 0",
        total));
  const int64_t documents = static_cast<int64_t>(pieces.size());
  split_assign(pieces, files, o.val_fraction, o.seed);

  const fs::path out(o.out);
  const fs::path out_abs = fs::absolute(out);
  fs::create_directories(out_abs.parent_path());
  const fs::path tmp = temp_sibling(out_abs, "tmp");
  fs::create_directories(tmp);
  try {
    PrepareResult r;
    r.dir = out.string();
    r.documents = documents;
    r.vocab = tokenizer->vocab();
    const auto train = split_writer_create(o.format, tmp.string(), "train", r.vocab);
    std::unique_ptr<SplitWriter> val;
    if (o.val_fraction > 0) val = split_writer_create(o.format, tmp.string(), "val", r.vocab);
    std::vector<int32_t> tokens;
    for (const auto& p : pieces) {
      tokens.clear();
      tokenizer->encode(
          std::string_view(reinterpret_cast<const char*>(files[p.file]->data()) + p.offset,
                           static_cast<size_t>(p.bytes)),
          tokens);
      (p.split == Split::val ? *val : *train).document_append(tokens);
      ++(p.split == Split::val ? r.documents_val : r.documents_train);
    }
    if (train->count() == 0)
      throw InputError("the train split came out empty; add text or lower --val-fraction");
    const SplitFile train_f = train->finish();
    r.train_tokens = train_f.tokens;
    nlohmann::json val_meta = nullptr;
    if (val) {
      const SplitFile val_f = val->finish();
      r.val_tokens = val_f.tokens;
      val_meta = split_meta(val_f);
    }
    // Read back through the normal path: checks what was written, and the
    // baseline is computed by the same code the trainer would use.
    r.unigram_entropy = unigram_entropy(*token_source_open((tmp / train_f.file).string()));

    nlohmann::json sources = nlohmann::json::array();
    for (size_t f = 0; f < files.size(); ++f)
      sources.push_back({{"path", fs::absolute(files[f]->path()).lexically_normal().string()},
                         {"bytes", files[f]->size()},
                         {"documents", file_documents[f]}});
    const nlohmann::json meta = {
        {"format", "weft-data"},
        {"version", 1},
        {"created_by", std::string("weft ") + WEFT_VERSION},
        {"tokenizer", tokenizer->name()},
        {"token_format", token_format_name(o.format)},
        {"vocab", r.vocab},
        {"sources", sources},
        {"documents", documents},
        {"split",
         {{"rule", kSplitRule},
          {"unit", "bytes"},
          {"val_fraction", o.val_fraction},
          {"seed", o.seed}}},
        {"train", split_meta(train_f)},
        {"val", val_meta},
        {"unigram_entropy_nats", r.unigram_entropy},
    };
    file_write_atomic((tmp / "meta.json").string(), meta.dump(2) + "\n");
    folder_commit(tmp, out_abs);
    return r;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace

PrepareResult data_prepare(const PrepareOptions& o) {
  try {
    return prepare_checked(o);
  } catch (const fs::filesystem_error& e) {
    // Permissions, a full disk, a read-only folder: the user's to fix.
    throw InputError(fmt::format("cannot prepare '{}': {}", o.out, e.what()));
  }
}

}  // namespace weft::data
