// A Megatron .idx/.bin pair. The input is framed as a 4-byte little-endian
// length of the .idx, the .idx, then the .bin (seeds in corpus/megatron are tests/fixtures/megatron_* so framed), so the
// fuzzer can mutate the index and the data it describes together.
#include <algorithm>
#include <cstring>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "data/megatron_file.h"
#include "data/token_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  uint32_t idx_bytes = 0;
  if (size >= 4) std::memcpy(&idx_bytes, data, 4);
  const size_t body = size >= 4 ? size - 4 : 0;
  const size_t n_idx = std::min<size_t>(idx_bytes, body);
  const auto bytes = fuzz::fuzz_bytes(data, size).substr(size >= 4 ? 4 : size);
  fuzz::fuzz_file("mega.idx", bytes.substr(0, n_idx));
  fuzz::fuzz_file("mega.bin", bytes.substr(n_idx));
  const std::string prefix = (fuzz::fuzz_dir() / "mega").string();
  for (const auto integrity : {data::Integrity::header, data::Integrity::full}) {
    fuzz::fuzz_parse([&] {
      const auto paths = data::megatron_paths(prefix + ".idx");
      if (!paths) return;
      const auto src = data::megatron_open(*paths, integrity);
      (void)src->describe();
      const int64_t n = src->size();
      if (n <= 0) return;
      (void)src->token(0);
      (void)src->token(n - 1);
      if (integrity == data::Integrity::full) (void)src->token_find_bad(1000);
    });
  }
  return 0;
}
