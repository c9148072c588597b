// A Hugging Face tokenizer.json of the byte-level BPE family (Llama 3,
// GPT-2), encoding exactly as the `tokenizers` library does:
//
//   text -> UTF-8 repair (utf8.h)
//        -> added tokens split out (added_tokens.h)
//        -> each run between them: the Split regexes (split_regex.h), then
//           ByteLevel's prefix space and regex
//        -> each pre-token: BPE over its bytes (bpe.h)
//
// and document tokens from the file's TemplateProcessing post-processor.
// What the file may contain is listed in hf_tokenizer_json.h.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace weft::data {

// Reads and checks `path`: FileFormatError naming the file when it is not
// JSON, not a tokenizer.json, or uses an unsupported component.
std::unique_ptr<Tokenizer> hf_tokenizer_load(const std::string& path);

}  // namespace weft::data
