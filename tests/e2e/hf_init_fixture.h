// What the `weft train --init` tests on one rank and under mpirun share: the
// Hugging Face folders and reference losses of tools/hf_init_fixtures.py, the
// command line that trains on the fixture's tokens, and comparisons of
// exported tensors with a folder's.
#pragma once

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "golden/golden_file.h"
#include "trainer/checkpoint/pretrained.h"

namespace weft::test {

inline std::string hf_fixture(const std::string& name) {
  return std::string(WEFT_FIXTURES_DIR) + "/hf_init/" + name;
}

inline const GoldenFile& hf_reference() {
  static const GoldenFile f = golden_file_read(hf_fixture("reference.bin"));
  return f;
}

// transformers' fp32 loss of a folder's model on the fixture's tokens, or of
// that model with the vocabulary padded (key "loss_vocab72").
inline double hf_reference_loss(const std::string& folder, const std::string& key = "loss") {
  return hf_reference().at(folder + "." + key).f32()[0];
}

// Train arguments whose global batch is every window of the fixture's
// tokens once: step 1's loss is the loaded model's loss on all of them.
inline std::string hf_train_args(const std::string& layout, const std::string& out) {
  const auto& s = hf_reference().header["scalars"];
  return fmt::format("train --data {} --seq {} --global-batch {} --layout {} --threads 1 --log-every 1 "
                     "--comm-timeout 120 --out {}",
                     hf_fixture("tokens.npy"), s["seq"].get<int64_t>(), s["windows"].get<int64_t>(), layout, out);
}

inline std::vector<double> metrics_losses(const std::string& run) {
  std::vector<double> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// Every parameter of the exported folder `exported` equals the folder
// `source`'s widened to fp32, bit for bit; rows past the source's vocabulary
// (padding) are not compared.
inline void expect_same_tensors(const std::string& exported, const std::string& source) {
  const auto got = checkpoint::pretrained_open(exported);
  const auto want = checkpoint::pretrained_open(source);
  ASSERT_EQ(got.params.size(), want.params.size()) << exported;
  for (const auto& [name, t] : want.params) {
    const auto& g = got.param(name);
    ASSERT_EQ(g.dtype, checkpoint::DType::F32) << name;
    std::vector<float> w(size_t(t.elements()));
    checkpoint::to_f32(t.dtype, t.data, w.data(), t.elements());
    EXPECT_EQ(std::memcmp(g.data, w.data(), w.size() * 4), 0) << name << " of " << exported;
  }
}

}  // namespace weft::test
