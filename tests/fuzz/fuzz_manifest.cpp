// A checkpoint's manifest.json, read by `weft train --resume/--init` and
// `weft export` before any tensor file is opened.
#include "core/json_io.h"
#include "tests/fuzz/fuzz_common.h"
#include "trainer/checkpoint/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("manifest.json", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const auto m = checkpoint::manifest_from_json(json_read_file(path, "checkpoint manifest"), path);
    (void)checkpoint::manifest_to_json(m).dump();
    (void)m.file("model.safetensors");
  });
  return 0;
}
