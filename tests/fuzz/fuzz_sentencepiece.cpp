// A SentencePiece tokenizer.model, read by `weft data prepare --tokenizer`:
// libsentencepiece parses it, then weft's wrapper takes the vocab, the BOS
// and EOS ids and the document tokens, and encodes and decodes
// (fuzz_tokenizer.h).
#include "tests/fuzz/fuzz_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weft::fuzz::fuzz_tokenizer_file("tokenizer.model", weft::fuzz::fuzz_bytes(data, size));
  return 0;
}
