// A prepared data folder's meta.json, read by `weft train --data`, `weft
// eval` and `weft data info` before the token files it names are opened.
// The folder holds two small valid token files; the fuzzer writes meta.json.
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "data/token_data.h"
#include "data/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  static const bool once = [] {
    std::vector<int32_t> tokens(64);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37) % 256);
    data::token_file_write((fuzz::fuzz_dir() / "train.tok").string(), tokens, 256);
    data::token_file_write((fuzz::fuzz_dir() / "val.tok").string(), tokens, 256);
    return true;
  }();
  (void)once;
  fuzz::fuzz_file("meta.json", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const auto d = data::token_data_open(fuzz::fuzz_dir().string(), data::Integrity::full);
    (void)data::token_data_meta_lines(d);
    (void)data::token_data_baseline(d);
    data::token_data_validate(d, data::token_data_meta_vocab(d) > 0 ? data::token_data_meta_vocab(d) : 256, 8);
  });
  return 0;
}
