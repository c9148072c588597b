// The golden reader on the committed fixtures and on broken files.
//
// Only internal consistency is checked here (shapes against the config, the
// loss against cross-entropy recomputed in fp64 from the stored logits, the
// optimizer record); matching weft's own model lives with the trainer tests.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/unit/golden/golden_file.h"

namespace weft::test {
namespace {

std::string fixture(const std::string& name) { return std::string(WEFT_FIXTURES_DIR) + "/" + name; }

// Expected HF parameter names and shapes for a config.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_params(const nlohmann::json& c) {
  const int64_t V = c.at("vocab_size"), C = c.at("hidden_size"), F = c.at("intermediate_size");
  const int64_t L = c.at("num_hidden_layers"), H = c.at("num_attention_heads");
  const int64_t H_kv = c.at("num_key_value_heads"), D = c.at("head_dim");
  std::vector<std::pair<std::string, std::vector<int64_t>>> p;
  p.push_back({"model.embed_tokens.weight", {V, C}});
  for (int64_t i = 0; i < L; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    p.push_back({l + "self_attn.q_proj.weight", {H * D, C}});
    p.push_back({l + "self_attn.k_proj.weight", {H_kv * D, C}});
    p.push_back({l + "self_attn.v_proj.weight", {H_kv * D, C}});
    p.push_back({l + "self_attn.o_proj.weight", {C, H * D}});
    p.push_back({l + "mlp.gate_proj.weight", {F, C}});
    p.push_back({l + "mlp.up_proj.weight", {F, C}});
    p.push_back({l + "mlp.down_proj.weight", {C, F}});
    p.push_back({l + "input_layernorm.weight", {C}});
    p.push_back({l + "post_attention_layernorm.weight", {C}});
  }
  p.push_back({"model.norm.weight", {C}});
  if (!c.at("tie_word_embeddings").get<bool>()) p.push_back({"lm_head.weight", {V, C}});
  return p;
}

bool is_param_name(const std::string& n) { return n.rfind("model.", 0) == 0 || n == "lm_head.weight"; }

class GoldenFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenFixture, ShapesMatchConfig) {
  const auto g = golden_file_read(fixture(GetParam()));
  const auto& c = g.header.at("config");
  const int64_t B = g.header.at("scalars").at("batch"), T = g.header.at("scalars").at("seq_len");
  const int64_t V = c.at("vocab_size");
  EXPECT_EQ(c.at("hidden_size").get<int64_t>(),
            c.at("num_attention_heads").get<int64_t>() * c.at("head_dim").get<int64_t>());

  const auto params = expected_params(c);
  for (const auto& [name, shape] : params) {
    for (const std::string prefix : {"", "grad.", "final."}) {
      SCOPED_TRACE(prefix + name);
      const auto& t = g.at(prefix + name);
      EXPECT_EQ(t.dtype, GoldenDtype::kF32);
      EXPECT_EQ(t.shape, shape);
      for (float x : t.f32()) ASSERT_TRUE(std::isfinite(x));
    }
  }
  // No stray parameters, and the counts agree: params == grads == finals.
  int64_t n_params = 0, n_grads = 0, n_finals = 0;
  for (const auto& [name, t] : g.tensors) {
    if (is_param_name(name)) ++n_params;
    if (name.rfind("grad.", 0) == 0) ++n_grads;
    if (name.rfind("final.", 0) == 0 && name != "final_loss") ++n_finals;
  }
  EXPECT_EQ(n_params, static_cast<int64_t>(params.size()));
  EXPECT_EQ(n_grads, n_params);
  EXPECT_EQ(n_finals, n_params);
  EXPECT_EQ(g.header.at("scalars").at("num_params").get<int64_t>(), n_params);
  EXPECT_EQ(g.has("lm_head.weight"), !c.at("tie_word_embeddings").get<bool>());

  const auto& inputs = g.at("inputs");
  const auto& targets = g.at("targets");
  EXPECT_EQ(inputs.shape, (std::vector<int64_t>{B, T}));
  EXPECT_EQ(targets.shape, (std::vector<int64_t>{B, T}));
  for (int32_t id : inputs.i32()) EXPECT_TRUE(id >= 0 && id < V) << id;
  for (int32_t id : targets.i32()) EXPECT_TRUE(id >= 0 && id < V) << id;
  // Both are windows of one (B, T+1) draw: targets are the next tokens.
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t + 1 < T; ++t) {
      EXPECT_EQ(targets.i32()[b * T + t], inputs.i32()[b * T + t + 1]) << b << "," << t;
    }
  }
  EXPECT_EQ(g.at("logits").shape, (std::vector<int64_t>{B, T, V}));
  EXPECT_TRUE(g.at("loss").shape.empty());
  EXPECT_TRUE(g.at("final_loss").shape.empty());
}

TEST_P(GoldenFixture, LossIsMeanCrossEntropyOfLogits) {
  const auto g = golden_file_read(fixture(GetParam()));
  const int64_t V = g.header.at("config").at("vocab_size");
  const auto& logits = g.at("logits").f32();  // (B, T, V)
  const auto& targets = g.at("targets").i32();  // (B, T)
  const int64_t N = static_cast<int64_t>(targets.size());
  double sum = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    const float* row = logits.data() + i * V;
    double max = row[0];
    for (int64_t v = 1; v < V; ++v) max = std::max(max, static_cast<double>(row[v]));
    double z = 0.0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(row[v]) - max);
    sum += std::log(z) + max - row[targets[i]];
  }
  const double ce = sum / static_cast<double>(N);
  const float loss = g.at("loss").f32()[0];
  // PyTorch reduced in fp32: a few ulps of the loss, not more.
  EXPECT_NEAR(loss, ce, 8 * FLT_EPSILON * ce);
  EXPECT_NEAR(g.header.at("scalars").at("loss_f64_from_logits").get<double>(), ce, 1e-12 * ce);
  EXPECT_EQ(g.header.at("scalars").at("loss").get<double>(), static_cast<double>(loss));
}

TEST_P(GoldenFixture, OptimizerRecordIsConsistent) {
  const auto g = golden_file_read(fixture(GetParam()));
  const auto& opt = g.header.at("optimizer");
  const int64_t steps = opt.at("num_steps");
  const double lr = opt.at("lr"), max_norm = opt.at("max_grad_norm");
  const int64_t warmup = opt.at("warmup_steps");
  const auto& losses = g.at("step_losses").f32();
  const auto& norms = g.at("grad_norms").f32();
  const auto& coefs = g.at("clip_coefs").f32();
  const auto& lrs = g.at("lrs").f64();
  ASSERT_EQ(static_cast<int64_t>(losses.size()), steps);
  ASSERT_EQ(static_cast<int64_t>(norms.size()), steps);
  ASSERT_EQ(static_cast<int64_t>(coefs.size()), steps);
  ASSERT_EQ(static_cast<int64_t>(lrs.size()), steps);
  EXPECT_EQ(losses[0], g.at("loss").f32()[0]);  // step 1 sees the initial weights
  for (int64_t s = 1; s <= steps; ++s) {
    const auto i = static_cast<size_t>(s - 1);
    EXPECT_DOUBLE_EQ(lrs[i], lr * static_cast<double>(std::min(s, warmup)) / static_cast<double>(warmup));
    EXPECT_TRUE(std::isfinite(losses[i]) && norms[i] > 0.0f);
    EXPECT_NEAR(coefs[i], std::min(1.0, max_norm / (norms[i] + 1e-6)), 1e-6);
  }
  // Five steps on one batch must fit it better.
  EXPECT_LT(g.at("final_loss").f32()[0], losses.back());
  EXPECT_LT(losses.back(), losses.front());
  // Weight decay covers exactly the 2-D weights.
  for (const auto& name : opt.at("weight_decay_params")) EXPECT_EQ(g.at(name).shape.size(), 2u) << name;
  for (const auto& name : opt.at("no_weight_decay_params")) EXPECT_EQ(g.at(name).shape.size(), 1u) << name;
}

TEST_P(GoldenFixture, GradientOfTheLossDescends) {
  // A cheap sign check on the stored grads: final - initial for a decayed
  // weight points mostly against grad (Adam's first step is -lr*sign(grad)).
  const auto g = golden_file_read(fixture(GetParam()));
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  const auto& w0 = g.at(name).f32();
  const auto& w1 = g.at("final." + name).f32();
  const auto& dw = g.at("grad." + name).f32();
  double dot = 0.0;
  for (size_t i = 0; i < w0.size(); ++i) dot += static_cast<double>(w1[i] - w0[i]) * dw[i];
  EXPECT_LT(dot, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenFixture,
                         ::testing::Values("golden_llama_gqa.bin", "golden_llama_tied.bin"));

// --- The reader's own checks, on hand-made files ---------------------------

std::vector<std::byte> make_file(const std::string& header, uint32_t version, int64_t data_bytes,
                                 const char* magic = "WEFTGLD1") {
  std::vector<std::byte> f(16 + header.size() + static_cast<size_t>(data_bytes));
  std::memcpy(f.data(), magic, 8);
  const uint32_t n = static_cast<uint32_t>(header.size());
  for (int k = 0; k < 4; ++k) {
    f[8 + k] = static_cast<std::byte>((version >> (8 * k)) & 0xff);
    f[12 + k] = static_cast<std::byte>((n >> (8 * k)) & 0xff);
  }
  std::memcpy(f.data() + 16, header.data(), header.size());
  return f;
}

void expect_format_error(const std::vector<std::byte>& f, const std::string& needle) {
  try {
    golden_file_parse(f, "test.bin");
    FAIL() << "expected FileFormatError containing '" << needle << "'";
  } catch (const FileFormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.bin"), std::string::npos) << e.what();
  }
}

const std::string kOneTensor =
    R"({"tensors": {"x": {"dtype": "f32", "shape": [2, 1], "offset": 0, "nbytes": 8}}})";

TEST(GoldenReader, ReadsAWellFormedFile) {
  auto f = make_file(kOneTensor, 1, 8);
  const float values[2] = {1.5f, -2.0f};
  std::memcpy(f.data() + 16 + kOneTensor.size(), values, sizeof(values));
  const auto g = golden_file_parse(f, "test.bin");
  EXPECT_EQ(g.at("x").shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(g.at("x").f32(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_THROW(g.at("x").i32(), FileFormatError);
  EXPECT_THROW(g.at("y"), FileFormatError);
}

TEST(GoldenReader, RejectsBrokenFiles) {
  expect_format_error(std::vector<std::byte>(10), "shorter than");
  expect_format_error(make_file(kOneTensor, 1, 8, "WEFTGLD0"), "magic");
  expect_format_error(make_file(kOneTensor, 2, 8), "version 2");
  auto short_header = make_file(kOneTensor, 1, 0);
  short_header.resize(16 + 10);
  expect_format_error(short_header, "header");
  expect_format_error(make_file("{not json", 1, 0), "not valid JSON");
  expect_format_error(make_file(R"({"config": {}})", 1, 0), "\"tensors\"");
  expect_format_error(make_file(kOneTensor, 1, 4), "truncated");
  expect_format_error(
      make_file(R"({"tensors": {"x": {"dtype": "f16", "shape": [1], "offset": 0, "nbytes": 2}}})", 1, 8),
      "dtype");
  expect_format_error(
      make_file(R"({"tensors": {"x": {"dtype": "f32", "shape": [3], "offset": 0, "nbytes": 8}}})", 1, 16),
      "nbytes");
  expect_format_error(
      make_file(R"({"tensors": {"x": {"dtype": "f32", "shape": [1], "offset": 4, "nbytes": 4}}})", 1, 16),
      "multiple of 8");
  expect_format_error(
      make_file(R"({"tensors": {"x": {"dtype": "f32", "shape": [-1], "offset": 0, "nbytes": 4}}})", 1, 16),
      "non-negative");
}

TEST(GoldenReader, MissingFileIsAFormatError) {
  EXPECT_THROW(golden_file_read(fixture("no_such_fixture.bin")), FileFormatError);
}

}  // namespace
}  // namespace weft::test
