// A SentencePiece model (tokenizer.model; Llama 2's kind) through
// libsentencepiece, which gives the reference's ids by construction. Each
// document is wrapped in the model's BOS and EOS (those it defines: an id of
// -1 means none), as Llama 2's pretraining data marks documents.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace weft::data {

// FileFormatError naming `path` when it is not a SentencePiece model.
std::unique_ptr<Tokenizer> sp_tokenizer_load(const std::string& path);

}  // namespace weft::data
