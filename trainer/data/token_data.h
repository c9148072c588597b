// Opening training data: one token file of any supported format, or a folder
// holding a train split and (usually) a validation split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "trainer/data/token_file.h"
#include "trainer/data/token_source.h"

namespace weft::data {

// Opens one token file by mmap, detecting its format from its first bytes:
// weft .tok, llm.c .bin or numpy .npy. InputError for a missing or empty
// file; FileFormatError naming the path and the problem for anything else
// (including text that was never tokenized, and Megatron .bin/.idx, which
// weft does not read yet).
std::unique_ptr<TokenSource> token_source_open(const std::string& path,
                                               Integrity integrity = Integrity::full);

struct TokenData {
  std::string path;  // what the user named
  std::unique_ptr<TokenSource> train;
  std::unique_ptr<TokenSource> val;  // null when the data has no validation split
  nlohmann::json meta;               // meta.json of a prepared folder; null otherwise
};

// `path` is a token file (all of it is train) or a folder: either one that
// `weft data prepare` wrote (meta.json, train.tok, val.tok), or shards named
// *train*.{tok,bin,npy} and *val*.{tok,bin,npy} (llm.c's layout), each split
// read as its shards back to back in name order.
TokenData token_data_open(const std::string& path, Integrity integrity = Integrity::full);

// Checks the data against a model and run: every id below `vocab` (one scan
// of each split) and at least seq + 1 tokens in each split. InputError naming
// the offending value otherwise.
void token_data_validate(const TokenData& data, int64_t vocab, int64_t seq);

// The unigram entropy of the train split in nats/token (the loss baseline):
// meta.json's value for prepared data, else computed by a scan.
double token_data_baseline(const TokenData& data);

}  // namespace weft::data
