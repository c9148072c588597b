// A PEFT adapter folder's adapter_config.json, read by --lora-init: the
// fuzzer's bytes as the config beside a valid adapter_model.safetensors (tiny-test,
// rank 2 on every linear layer).
#include <vector>

#include "core/model_spec.h"
#include "tests/fuzz/fuzz_common.h"
#include "trainer/checkpoint/hf_names.h"
#include "trainer/checkpoint/peft.h"

namespace {

// The folder with the weights, made once.
const std::string& adapter_dir(const weft::ModelSpec& m) {
  static const std::string dir = [&] {
    using namespace weft;
    const LoraSpec lora = LoraSpec::with_rank(2);
    const int64_t C = m.hidden, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim, F = m.intermediate;
    const int64_t in_out[kLinears][2] = {{C, q}, {C, kv}, {C, kv}, {q, C}, {C, F}, {C, F}, {F, C}};
    static std::vector<std::vector<float>> values;
    std::vector<checkpoint::TensorRef> tensors;
    for (int64_t layer = 0; layer < m.layers; ++layer)
      for (int g = 0; g < kLinears; ++g)
        for (const bool b : {false, true}) {
          const std::vector<int64_t> shape =
              b ? std::vector<int64_t>{in_out[g][1], lora.rank} : std::vector<int64_t>{lora.rank, in_out[g][0]};
          values.emplace_back(size_t(shape[0] * shape[1]), 0.5f);
          tensors.push_back({checkpoint::lora_param_name(Linear(g), layer, b), checkpoint::DType::F32, shape,
                             values.back().data()});
        }
    const std::string d = (fuzz::fuzz_dir() / "peft").string();
    checkpoint::peft_write(d, m, lora, "", tensors, {});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace weft;
  static const ModelSpec m = model_preset("tiny-test");
  const std::string dir = adapter_dir(m);
  std::ofstream(dir + "/adapter_config.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  fuzz::fuzz_parse([&] {
    const auto a = checkpoint::peft_open(dir, m);
    (void)a.lora.targets_text();
  });
  return 0;
}
