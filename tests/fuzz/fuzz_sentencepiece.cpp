// A SentencePiece tokenizer.model, read by `weft data prepare --tokenizer`:
// libsentencepiece parses it, then weft's wrapper takes the vocab, the BOS
// and EOS ids and the document tokens, and encodes and decodes a few texts.
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "trainer/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("tokenizer.model", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const auto tok = data::tokenizer_create(path);
    const auto encoder = tok->encoder();
    static constexpr std::string_view kTexts[] = {
        "Hello, world! It's 2026: 12345 tokens.\n\n  indented\ttabs",
        "<s> </s> <unk> \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e caf\xc3\xa9",
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
  return 0;
}
