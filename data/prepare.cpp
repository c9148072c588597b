#include "data/prepare.h"

#include "core/stop.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "data/permutation.h"
#include "data/split_writer.h"
#include "data/token_data.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/utf8.h"

namespace weft::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSplitRule =
    "documents ('%'-line separated in fortune-format files, else whole files; JSONL: one per "
    "line) visited in a seeded random order go to val while they fit under val_fraction of all "
    "bytes; if none fits, val is the tail of the last document cut at a line start";

// A batch of documents encoded between two progress reports: big enough
// that starting threads costs nothing, small enough to report often and to
// hold its tokens in memory.
constexpr int64_t kBatchBytes = 8 << 20;
constexpr size_t kBatchPieces = 1 << 14;

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
void split_assign(std::vector<Piece>& pieces, const std::vector<InputFile>& files,
                  const std::string& text_field, double val_fraction, uint64_t seed) {
  if (val_fraction <= 0) return;
  int64_t total = 0;
  for (const auto& p : pieces) total += p.text_bytes;
  const int64_t target =
      std::max<int64_t>(1, std::llround(val_fraction * static_cast<double>(total)));
  const Permutation order(static_cast<int64_t>(pieces.size()), mix64(seed));
  int64_t val = 0;
  for (int64_t i = 0; i < order.size() && val < target; ++i) {
    Piece& p = pieces[static_cast<size_t>(order.at(i))];
    if (val + p.text_bytes > target) continue;
    p.split = Split::val;
    val += p.text_bytes;
  }
  if (val > 0) return;
  // Every document is larger than the target: cut the last one.
  std::string scratch;
  const std::string_view text = piece_text(files, text_field, pieces.back(), scratch);
  const auto end = static_cast<int64_t>(text.size());
  int64_t cut = end - target;
  int64_t q = cut;
  while (q < end && text[static_cast<size_t>(q - 1)] != '\n') ++q;
  if (q < end) cut = q;
  Piece tail = pieces.back();
  pieces.back().text_bytes = cut;
  tail.text_begin += cut;
  tail.text_bytes = end - cut;
  tail.split = Split::val;
  pieces.push_back(tail);
}

// Ill-formed UTF-8 in the text files (JSONL text is valid by construction).
void utf8_report(const std::vector<InputFile>& files, PrepareResult& r) {
  for (const auto& in : files) {
    if (in.format != InputFormat::text) continue;
    const Utf8Check c = utf8_check(
        {reinterpret_cast<const char*>(in.file->data()), static_cast<size_t>(in.file->size())});
    if (c.invalid > 0 && r.invalid_utf8 == 0) {
      r.invalid_utf8_file = in.file->path();
      r.invalid_utf8_offset = c.first_offset;
    }
    r.invalid_utf8 += c.invalid;
  }
}

nlohmann::json split_meta(const SplitFile& f) {
  return {{"file", f.file},
          {"tokens", f.tokens},
          {"documents", f.documents},
          {"dtype", dtype_name(f.dtype)},
          {"checksum", fmt::format("{:016x}", f.checksum)}};
}

// Encodes the pieces on `threads` threads, batch by batch, and appends each
// piece's tokens to its split's writer in piece order.
class BatchEncoder {
 public:
  BatchEncoder(const Tokenizer& tokenizer, const std::vector<InputFile>& files,
               const std::string& text_field, int64_t threads)
      : tokenizer_(tokenizer),
        files_(files),
        text_field_(text_field),
        workers_(static_cast<size_t>(threads)) {
    for (auto& w : workers_) w.encoder = tokenizer.encoder();
  }

  void run(const std::vector<Piece>& pieces, SplitWriter& train, SplitWriter* val,
           const PrepareOptions& o, int64_t total_bytes) {
    const auto start = std::chrono::steady_clock::now();
    PrepareProgress progress;
    progress.bytes_total = total_bytes;
    for (size_t begin = 0; begin < pieces.size();) {
      stop_check();  // the caller removes the unfinished folder
      size_t end = begin;
      int64_t bytes = 0;
      while (end < pieces.size() && end - begin < kBatchPieces && bytes < kBatchBytes)
        bytes += pieces[end++].text_bytes;
      encode_batch(pieces, begin, end, bytes);
      for (const auto& w : workers_) {
        for (size_t i = 0; i < w.ends.size(); ++i) {
          const size_t from = i == 0 ? 0 : w.ends[i - 1];
          const std::span<const int32_t> t(w.tokens.data() + from, w.ends[i] - from);
          (pieces[w.begin + i].split == Split::val ? *val : train).document_append(t);
          progress.tokens += static_cast<int64_t>(t.size());
        }
      }
      progress.bytes_done += bytes;
      progress.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (o.progress) o.progress(progress);
      begin = end;
    }
  }

 private:
  struct Worker {
    std::unique_ptr<TokenEncoder> encoder;
    size_t begin = 0, end = 0;    // its pieces of the batch
    std::vector<int32_t> tokens;  // theirs, back to back
    std::vector<size_t> ends;     // where each piece's tokens end
    std::exception_ptr error;
  };

  void encode_range(Worker& w, const std::vector<Piece>& pieces) {
    try {
      std::string scratch;
      for (size_t i = w.begin; i < w.end; ++i) {
        tokenizer_.encode_document(*w.encoder, piece_text(files_, text_field_, pieces[i], scratch),
                                   w.tokens);
        w.ends.push_back(w.tokens.size());
      }
    } catch (...) {
      w.error = std::current_exception();
    }
  }

  // Gives each worker a run of the batch's pieces of about equal bytes.
  void encode_batch(const std::vector<Piece>& pieces, size_t begin, size_t end, int64_t bytes) {
    const auto n = static_cast<int64_t>(workers_.size());
    size_t at = begin;
    int64_t seen = 0;
    for (int64_t k = 0; k < n; ++k) {
      Worker& w = workers_[static_cast<size_t>(k)];
      w.tokens.clear();
      w.ends.clear();
      w.begin = at;
      const int64_t goal = bytes * (k + 1) / n;
      while (at < end && (k == n - 1 || seen < goal)) seen += pieces[at++].text_bytes;
      w.end = at;
    }
    std::vector<std::thread> threads;
    for (size_t k = 1; k < workers_.size(); ++k)
      if (workers_[k].begin < workers_[k].end)
        threads.emplace_back([&, k] { encode_range(workers_[k], pieces); });
    encode_range(workers_[0], pieces);
    for (auto& t : threads) t.join();
    for (const auto& w : workers_)
      if (w.error) std::rethrow_exception(w.error);
  }

  const Tokenizer& tokenizer_;
  const std::vector<InputFile>& files_;
  const std::string& text_field_;
  std::vector<Worker> workers_;
};

nlohmann::json tokenizer_meta(const Tokenizer& t) {
  const auto f = t.file();
  if (!f) return nullptr;
  return {{"path", f->path}, {"bytes", f->bytes}, {"xxh64", fmt::format("{:016x}", f->xxh64)}};
}

PrepareResult prepare_checked(const PrepareOptions& o) {
  // Every check that can fail comes before anything is written.
  if (o.inputs.empty()) throw InputError("no input files: pass --input FILE...");
  if (!std::isfinite(o.val_fraction) || o.val_fraction < 0 || o.val_fraction > 0.5)
    throw InputError(fmt::format("--val-fraction {} must be in [0, 0.5]", o.val_fraction));
  if (o.threads < 0)
    throw InputError(fmt::format("--threads {} must be 0 (every core) or more", o.threads));
  const auto tokenizer = tokenizer_create(o.tokenizer);
  out_check(o);
  std::vector<InputFile> files;
  std::vector<Piece> pieces = documents_scan(o.inputs, o.text_field, files);
  if (pieces.empty())
    throw InputError(fmt::format(
        "the input holds no documents (every JSONL text is empty or blank); check --text-field "
        "'{}'",
        o.text_field));
  int64_t total = 0;
  for (const auto& in : files) total += in.text_bytes;
  if (o.val_fraction > 0 && total < 2)
    throw InputError(fmt::format(
        "the input holds {} byte, too little to split off a validation set; add text or pass "
        "--val-fraction 0",
        total));
  const int64_t documents = static_cast<int64_t>(pieces.size());
  split_assign(pieces, files, o.text_field, o.val_fraction, o.seed);

  PrepareResult r;
  r.dir = o.out;
  r.tokenizer = tokenizer->name();
  r.document_tokens = tokenizer->document_tokens().description;
  r.documents = documents;
  r.vocab = tokenizer->vocab();
  r.text_bytes = total;
  r.threads = o.threads > 0 ? o.threads : std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (tokenizer->reads_utf8()) utf8_report(files, r);
  for (const auto& p : pieces) ++(p.split == Split::val ? r.documents_val : r.documents_train);

  const fs::path out_abs = fs::absolute(fs::path(o.out));
  fs::create_directories(out_abs.parent_path());
  const fs::path tmp = temp_sibling(out_abs, "tmp");
  fs::create_directories(tmp);
  try {
    const auto start = std::chrono::steady_clock::now();
    const auto train = split_writer_create(o.format, tmp.string(), "train", r.vocab);
    std::unique_ptr<SplitWriter> val;
    if (o.val_fraction > 0) val = split_writer_create(o.format, tmp.string(), "val", r.vocab);
    BatchEncoder(*tokenizer, files, o.text_field, r.threads)
        .run(pieces, *train, val.get(), o, total);
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
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Read back through the normal path: checks what was written, and the
    // baseline is computed by the same code the trainer would use.
    r.unigram_entropy = unigram_entropy(*token_source_open((tmp / train_f.file).string()));

    nlohmann::json sources = nlohmann::json::array();
    for (const auto& in : files)
      sources.push_back({{"path", fs::absolute(in.file->path()).lexically_normal().string()},
                         {"format", in.format == InputFormat::jsonl ? "jsonl" : "text"},
                         {"bytes", in.file->size()},
                         {"documents", in.documents}});
    const DocumentTokens& doc_tokens = tokenizer->document_tokens();
    nlohmann::json invalid = nullptr;
    if (r.invalid_utf8 > 0)
      invalid = {{"sequences", r.invalid_utf8},
                 {"replaced_by", "U+FFFD"},
                 {"first_file", fs::absolute(r.invalid_utf8_file).lexically_normal().string()},
                 {"first_offset", r.invalid_utf8_offset}};
    nlohmann::json meta = {
        {"format", "weft-data"},
        {"version", 1},
        {"created_by", std::string("weft ") + WEFT_VERSION},
        {"tokenizer", r.tokenizer},
        {"tokenizer_file", tokenizer_meta(*tokenizer)},
        {"token_format", token_format_name(o.format)},
        {"vocab", r.vocab},
        {"document_tokens",
         {{"prefix", doc_tokens.prefix},
          {"suffix", doc_tokens.suffix},
          {"description", doc_tokens.description}}},
        {"sources", sources},
        {"documents", documents},
        {"invalid_utf8", invalid},
        {"split",
         {{"rule", kSplitRule},
          {"unit", "bytes"},
          {"val_fraction", o.val_fraction},
          {"seed", o.seed}}},
        {"train", split_meta(train_f)},
        {"val", val_meta},
        {"unigram_entropy_nats", r.unigram_entropy},
    };
    if (std::any_of(files.begin(), files.end(),
                    [](const auto& in) { return in.format == InputFormat::jsonl; }))
      meta["text_field"] = o.text_field;
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
