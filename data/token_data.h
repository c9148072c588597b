// Opening training data: one token file of any supported format, or a folder
// holding a train split and (usually) a validation split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/data_spec.h"
#include "data/token_file.h"
#include "data/token_source.h"

namespace weft::data {

// Opens one token file by mmap, detecting its format from its first bytes:
// weft .tok, llm.c .bin or numpy .npy; or a Megatron .bin/.idx dataset named
// by its prefix, its .idx, or its .bin with the .idx beside it. InputError
// for a missing or empty file; FileFormatError naming the path and the
// problem for anything else (including text that was never tokenized).
std::unique_ptr<TokenSource> token_source_open(const std::string& path,
                                               Integrity integrity = Integrity::full);

struct TokenData {
  std::string path;  // what the user named (for several paths, all of them)
  std::unique_ptr<TokenSource> train;
  std::unique_ptr<TokenSource> val;  // null when the data has no validation split
  nlohmann::json meta;               // meta.json of a prepared folder; null otherwise
};

// `path` is a token file or Megatron dataset (all of it is train) or a
// folder: either one that `weft data prepare` wrote (meta.json and the splits
// it names), or shards named *train*.{tok,bin,npy} and *val*.{tok,bin,npy}
// (llm.c's layout; a .bin may be a Megatron dataset's), each split read as
// its shards back to back in name order.
TokenData token_data_open(const std::string& path, Integrity integrity = Integrity::full);

// Several paths (data_spec.h): each split of a plain list read as its paths'
// splits back to back; a blend's train split blends the parts' train splits
// by the weights, and its val split the val splits of the parts that have
// one (null when none does). One path opens as above, whatever its weight.
TokenData token_data_open(const DataSpec& spec, Integrity integrity = Integrity::full);

// Checks the data against a model and run: every id below `vocab` (one scan
// of each split) and at least seq + 1 tokens in each split (in each part of
// weight above 0, for a blend). InputError naming the offending value otherwise.
void token_data_validate(const TokenData& data, int64_t vocab, int64_t seq);

// meta.json's vocab for prepared data (checked when the folder was opened),
// else 0: Megatron files and folders of shards record none.
int64_t token_data_meta_vocab(const TokenData& data);

// What `weft data info` says of prepared data's meta.json: who prepared it,
// with which tokenizer and vocab, the tokenizer file and the document tokens
// where recorded. Empty for data without a meta.json.
std::vector<std::string> token_data_meta_lines(const TokenData& data);

// The unigram entropy of the train split in nats/token (the loss baseline):
// meta.json's value for prepared data, else computed by a scan.
double token_data_baseline(const TokenData& data);

}  // namespace weft::data
