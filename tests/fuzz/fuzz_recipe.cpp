// A saved recipe, read by `weft train --recipe` and `weft recipe show/diff`.
#include "tests/fuzz/fuzz_common.h"
#include "tuner/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  const std::string path = fuzz::fuzz_file("recipe.json", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const tuner::Recipe r = tuner::recipe_load(path);
    (void)tuner::recipe_to_json(r).dump();
    (void)tuner::recipe_diff(r, r);
  });
  return 0;
}
