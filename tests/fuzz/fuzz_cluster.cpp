// A custom cluster file, read as `--gpu cluster.json`.
#include "core/device_spec.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("cluster.json", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const ClusterSpec c = cluster_resolve(path, kUnset, kUnset);
    (void)c.summary();
    (void)c.nodes();
  });
  return 0;
}
