// One token file of any format weft detects from its first bytes (weft .tok,
// llm.c .bin, numpy .npy), opened with the full integrity check, then read
// as the loader and `weft data info` read it.
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "data/token_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("tokens", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const auto src = data::token_source_open(path, data::Integrity::full);
    (void)src->describe();
    const int64_t n = src->size();
    if (n <= 0) return;
    (void)src->token(0);
    (void)src->token(n - 1);
    (void)src->token_find_bad(src->vocab() > 0 ? src->vocab() : 256);
    std::vector<int32_t> out(std::min<int64_t>(n, 16));
    if (!src->token_find_bad(int64_t{1} << 31))
      src->tokens_copy(n - int64_t(out.size()), int64_t(out.size()), out.data());
  });
  return 0;
}
