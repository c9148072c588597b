// A measured device profile, as `weft calibrate` writes it and `--profile` reads it.
#include "tests/fuzz/fuzz_common.h"
#include "tuner/device_profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("profile.json", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] { (void)tuner::profile_load(path); });
  return 0;
}
