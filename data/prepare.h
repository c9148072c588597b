// `weft data prepare`: text files in, a prepared data folder out.
//
// The folder holds train.tok and val.tok (weft token files; with
// TokenFormat::megatron, train.bin/.idx and val.bin/.idx, one sequence per
// document) and meta.json: the source files, the tokenizer (and its file's
// checksum), the vocab, the tokens put around each document, token and
// document counts, the split rule and the unigram entropy of the train split
// (the loss baseline).
//
// Documents: see documents.h (text files, fortune-format files, JSONL).
// Each document is encoded on its own and wrapped in the tokenizer's
// document tokens (BOS/EOS, as its file says; none for the byte tokenizer).
//
// Split, deterministic in (inputs, val_fraction, seed), in bytes of text:
// documents are visited in a seeded random order and each one goes to val if
// it still fits under val_fraction of all bytes; train keeps the rest. When
// no document fits (few, large documents) the val split is instead the tail
// of the last document, cut at a line start. Both splits keep file order.
//
// Encoding runs on `threads` threads, a batch of documents at a time; the
// files are the same for any thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "data/documents.h"
#include "data/split_writer.h"

namespace weft::data {

struct PrepareProgress {
  int64_t bytes_done = 0;   // of text encoded so far
  int64_t bytes_total = 0;  // of all the text
  int64_t tokens = 0;
  double seconds = 0;  // since encoding began
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // text and JSONL files
  std::string out;                  // the folder to create
  std::string tokenizer = "byte";          // "byte" or a tokenizer file (tokenizer.h)
  std::string text_field = "text";         // of JSONL objects
  TokenFormat format = TokenFormat::weft;  // of the token files
  double val_fraction = 0.05;              // in [0, 0.5]; 0 writes no val split
  uint64_t seed = 0;
  int64_t threads = 0;  // 0: every core
  bool force = false;   // replace `out` when it holds a prepared dataset
  // Called after each batch of documents, from the calling thread.
  std::function<void(const PrepareProgress&)> progress;
};

struct PrepareResult {
  std::string dir;
  std::string tokenizer;        // its kind: byte, hf-bpe, sentencepiece
  std::string document_tokens;  // what goes around each document, for people
  int64_t documents = 0;
  int64_t documents_train = 0;  // a document cut in two counts in both splits
  int64_t documents_val = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t vocab = 0;
  double unigram_entropy = 0;  // nats/token of the train split
  int64_t text_bytes = 0;
  int64_t threads = 0;
  double seconds = 0;  // encoding and writing
  // Ill-formed UTF-8 in the input, each replaced by U+FFFD (text tokenizers
  // only; the byte tokenizer keeps bytes): how many, and the first one.
  int64_t invalid_utf8 = 0;
  std::string invalid_utf8_file;
  int64_t invalid_utf8_offset = -1;
};

// Writes the folder atomically: everything goes to a temporary sibling that
// is renamed to `out` only when complete, so a failed or interrupted prepare
// leaves nothing behind and never touches an existing `out`. InputError for
// an empty input list, a missing or empty input file, a bad JSONL line, an
// unknown or unreadable tokenizer, a val_fraction outside [0, 0.5], a
// negative thread count, or an `out` that exists and is not empty (without
// `force`, or with `force` when it is not a prepared dataset).
PrepareResult data_prepare(const PrepareOptions& options);

}  // namespace weft::data
