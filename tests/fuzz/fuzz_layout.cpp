// A layout's text (--layout, a recipe's layout, the tuner's journal): parsed,
// checked against a model, run and world, its FP8 GEMMs judged, and its
// canonical text parsed back to the same layout.
#include "core/layout.h"
#include "core/model_spec.h"
#include "memory/shapes.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  static const ModelSpec m = model_preset("tiny");
  const std::string text(fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const Layout l = Layout::parse(text);
    const std::string canonical = l.to_string();
    if (Layout::parse(canonical).to_string() != canonical) {
      std::fprintf(stderr, "fuzz: finding: '%s' -> '%s' does not parse back\n", text.c_str(), canonical.c_str());
      std::abort();
    }
    for (const int64_t world : {1, 2, 4, 8}) {
      const RunSpec run{256, 16, Precision::bf16};
      if (!l.violations(m, run, world).empty()) continue;
      (void)memory::fp8_runs_none(m, run, l);
      (void)memory::fp8_bf16_gemms_text(m, run, l);
    }
  });
  return 0;
}
