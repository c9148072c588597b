// A safetensors file: its length word, JSON header and data buffer, and a
// read of each floating-point tensor's first row as a rank takes its shard.
#include <algorithm>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "trainer/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("model.safetensors", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const checkpoint::SafetensorsFile f(path);
    (void)f.crc32c();
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
      (void)f.at(t.name);
      if (t.shape.size() != 1 && t.shape.size() != 2) continue;
      const int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
      if (rows == 0 || cols == 0) continue;
      const int64_t n = std::min<int64_t>(cols, 64);
      row.resize(n);
      fuzz::fuzz_parse([&] { checkpoint::tensor_read_f32_block(t, 0, 1, 0, n, row.data()); });
    }
  });
  return 0;
}
