// A Hugging Face tokenizer.json, read by `weft data prepare --tokenizer`:
// parsed and checked, its split regexes compiled, then used to encode and
// decode (fuzz_tokenizer.h).
#include "tests/fuzz/fuzz_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  weft::fuzz::fuzz_tokenizer_file("tokenizer.json", weft::fuzz::fuzz_bytes(data, size));
  return 0;
}
