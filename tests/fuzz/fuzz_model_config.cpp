// A Hugging Face config.json, read as `--model path/config.json` and as the
// config of an `--init` folder (which also refuses unsupported rope scaling).
#include "core/model_spec.h"
#include "tests/fuzz/fuzz_common.h"
#include "trainer/checkpoint/hf_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  fuzz::fuzz_file("config.json", fuzz::fuzz_bytes(data, size));
  fuzz::fuzz_parse([&] {
    const ModelSpec m = checkpoint::hf_folder_model(fuzz::fuzz_dir().string(), nullptr);
    (void)m.param_count();
    (void)m.hash();
    (void)m.summary();
  });
  return 0;
}
