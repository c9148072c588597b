// `weft data prepare`: text files in, a prepared data folder out.
//
// The folder holds train.tok and val.tok (weft token files; with
// TokenFormat::megatron, train.bin/.idx and val.bin/.idx, one sequence per
// document) and meta.json: the source files, tokenizer, vocab, token and
// document counts, the split rule and the unigram entropy of the train split
// (the loss baseline).
//
// Documents: in a file with lines holding only "%" (the fortune format) each
// such line ends a document; any other file is one document. A document keeps
// its bytes, separator line included, so the documents of a file concatenate
// back to the file.
//
// Split, deterministic in (inputs, val_fraction, seed), in bytes of text:
// documents are visited in a seeded random order and each one goes to val if
// it still fits under val_fraction of all bytes; train keeps the rest. When
// no document fits (few, large documents) the val split is instead the tail
// of the last document, cut at a line start. Both splits keep file order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/data/split_writer.h"

namespace weft::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files
  std::string out;                  // the folder to create
  std::string tokenizer = "byte";
  TokenFormat format = TokenFormat::weft;  // of the token files
  double val_fraction = 0.05;  // in [0, 0.5]; 0 writes no val split
  uint64_t seed = 0;
  bool force = false;  // replace `out` when it holds a prepared dataset
};

struct PrepareResult {
  std::string dir;
  int64_t documents = 0;
  int64_t documents_train = 0;  // a document cut in two counts in both splits
  int64_t documents_val = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t vocab = 0;
  double unigram_entropy = 0;  // nats/token of the train split
};

// Writes the folder atomically: everything goes to a temporary sibling that
// is renamed to `out` only when complete, so a failed or interrupted prepare
// leaves nothing behind and never touches an existing `out`. InputError for
// an empty input list, a missing or empty input file, an unknown tokenizer,
// a val_fraction outside [0, 0.5], or an `out` that exists and is not empty
// (without `force`, or with `force` when it is not a prepared dataset).
PrepareResult data_prepare(const PrepareOptions& options);

// The documents of one file's text (see above), each a view into `text`.
std::vector<std::string_view> text_documents(std::string_view text);

}  // namespace weft::data
