// Shared by the tokenizer fuzz targets: the fuzzer's bytes as a tokenizer
// file, loaded through tokenizer_create and then used as `weft data prepare`
// uses it, on texts that reach special tokens, CJK, combining marks and
// invalid UTF-8. Every id must lie inside the vocab.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "data/tokenizer.h"

namespace weft::fuzz {

inline void fuzz_tokenizer_file(const std::string& name, std::string_view bytes) {
  const std::string path = fuzz_file(name, bytes);
  fuzz_parse([&] {
    const auto tok = data::tokenizer_create(path);
    const auto encoder = tok->encoder();
    static constexpr std::string_view kTexts[] = {
        "Hello, world! It's 2026: 12345 tokens.\n\n  indented\ttabs",
        "<|begin_of_text|>special <|end_of_text|><s></s><unk>",
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e caf\xc3\xa9 e\xcc\x81 \xf0\x9f\x98\x80",
        "bad \xff\xfe utf-8 \xc3",
        "",
    };
    std::vector<int32_t> ids;
    for (const auto text : kTexts) {
      ids.clear();
      tok->encode_document(*encoder, text, ids);
      for (const int32_t id : ids)
        if (id < 0 || id >= tok->vocab()) std::abort();  // encode must stay inside the vocab
      (void)tok->decode(ids);
    }
    (void)tok->document_tokens().description;
  });
}

}  // namespace weft::fuzz
