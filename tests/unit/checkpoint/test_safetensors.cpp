// safetensors reader and writer, CRC32C and the 16-bit float conversions.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/unit/test_util.h"
#include "trainer/checkpoint/crc32c.h"
#include "trainer/checkpoint/dtype.h"
#include "trainer/checkpoint/safetensors.h"

namespace weft::checkpoint {
namespace {

using test::TempDir;

std::string read_bytes(const std::string& path) {
  return test::file_contents(path);
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file from a header text and a data buffer, with no padding.
std::string hand_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// Expects a FileFormatError whose message names the file and contains `what`.
void expect_refused(const std::string& path, const std::string& what) {
  try {
    SafetensorsFile f(path);
    FAIL() << "accepted " << path << ", expected an error containing '" << what << "'";
  } catch (const FileFormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(Crc32c, CheckValueAndBothPathsAgree) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the published check value
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(4099);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t begin : {0, 1, 3, 8}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 4000}) {
      const uint32_t fast = crc32c(buf.data() + begin, n);
      EXPECT_EQ(fast, crc32c_update_portable(0, buf.data() + begin, n)) << begin << " " << n;
      // Incremental equals one-shot, at any split.
      const size_t cut = n / 3;
      EXPECT_EQ(fast,
                crc32c_update(crc32c(buf.data() + begin, cut), buf.data() + begin + cut, n - cut));
    }
  }
  EXPECT_EQ(crc32c_text(0xE3069283u), "crc32c:e3069283");
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  // 1 + 2^-8 lies halfway between bf16 1.0 (0x3F80) and 1 + 2^-7 (0x3F81):
  // ties go to the even mantissa.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the dropped bits must stay NaN.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7F800001u)))));
  // Every non-NaN bf16 value survives the round trip through fp32.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h);
  }
  const float in[3] = {0.5f, -3.25f, 1e-3f};
  uint16_t mid[3];
  float out[3];
  f32_to_bf16(in, mid, 3);
  bf16_to_f32(mid, out, 3);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -3.25f);
  EXPECT_NEAR(out[2], 1e-3f, 1e-3f / 128);
}

TEST(F16, ConvertsExactly) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0xFBFF), -65504.0f);
  EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
}

TEST(Safetensors, RoundTripManyDtypesAndShapes) {
  TempDir dir;
  const std::vector<float> f32 = {1.5f, -2.f, 3.f, 0.25f, 5.f, 6.f};    // (2, 3)
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x7F80, 0x0001};  // (4)
  const std::vector<int32_t> i32 = {-7, 0, 2147483647};                 // (3, 1)
  const std::vector<uint8_t> u8 = {1, 2, 3, 4, 5};                      // (5)
  const double scalar = 3.141592653589793;                              // ()
  const uint16_t f16[2] = {0x3C00, 0xC000};                             // (1, 2)
  const std::vector<TensorRef> tensors = {
      {"w.f32", DType::F32, {2, 3}, f32.data()}, {"w.bf16", DType::BF16, {4}, bf16.data()},
      {"empty", DType::F32, {0, 4}, nullptr},    {"ids", DType::I32, {3, 1}, i32.data()},
      {"bytes", DType::U8, {5}, u8.data()},      {"scalar", DType::F64, {}, &scalar},
      {"half", DType::F16, {1, 2}, f16},
  };
  const std::string path = dir.path("t.safetensors");
  const FileDigest d = safetensors_write(path, tensors, {{"format", "pt"}, {"note", "hi"}});
  const std::string raw = read_bytes(path);
  EXPECT_EQ(d.bytes, static_cast<int64_t>(raw.size()));
  EXPECT_EQ(d.crc32c, crc32c(raw.data(), raw.size()));
  uint64_t n;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(::getpid())));

  SafetensorsFile f(path);
  EXPECT_EQ(f.file_bytes(), d.bytes);
  EXPECT_EQ(f.crc32c(), d.crc32c);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "hi");
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& want = tensors[i];
    const TensorRef& got = f.tensors()[i];  // data order is the order written
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    ASSERT_EQ(got.bytes(), want.bytes());
    if (want.bytes() > 0) {
      EXPECT_EQ(std::memcmp(got.data, want.data, want.bytes()), 0) << want.name;
    }
    EXPECT_EQ(&f.at(want.name), &got);
  }
  EXPECT_EQ(f.at("scalar").elements(), 1);
  EXPECT_EQ(f.at("empty").elements(), 0);
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_THROW(f.at("nope"), FileFormatError);

  float widened[4];
  to_f32(DType::BF16, f.at("w.bf16").data, widened, 4);
  EXPECT_EQ(widened[0], 1.0f);
  EXPECT_EQ(widened[1], -2.0f);
  float h[2];
  to_f32(DType::F16, f.at("half").data, h, 2);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_THROW(to_f32(DType::I32, f.at("ids").data, h, 1), InputError);

  SafetensorsFile moved = std::move(f);
  EXPECT_EQ(moved.tensors().size(), tensors.size());
}

TEST(Safetensors, ReadsShardBlocks) {
  // (3, 4) in bf16; a tensor-parallel rank reads rows 1..2, cols 1..3.
  std::vector<uint16_t> w(12);
  for (int i = 0; i < 12; ++i) w[i] = f32_to_bf16(static_cast<float>(i));
  const TensorRef t{"w", DType::BF16, {3, 4}, w.data()};
  float block[6];
  tensor_read_f32_block(t, 1, 2, 1, 3, block);
  EXPECT_EQ(std::vector<float>(block, block + 6), (std::vector<float>{5, 6, 7, 9, 10, 11}));
  const float norm[4] = {1, 2, 3, 4};
  const TensorRef n{"n", DType::F32, {4}, norm};
  float half[2];
  tensor_read_f32_block(n, 2, 2, 0, 1, half);
  EXPECT_EQ(half[0], 3.0f);
  EXPECT_EQ(half[1], 4.0f);
  EXPECT_THROW(tensor_read_f32_block(t, 2, 2, 0, 4, block), InputError);
  EXPECT_THROW(tensor_read_f32_block(n, 0, 1, 1, 1, half), InputError);
}

TEST(Safetensors, HeaderIsByteExact) {
  TempDir dir;
  const float a[2] = {1.0f, 2.0f};
  const uint16_t b = 0x3F80;
  const std::string path = dir.path("exact.safetensors");
  safetensors_write(path, {{"a", DType::F32, {2}, a}, {"b", DType::BF16, {}, &b}},
                    {{"format", "pt"}});

  std::string json = R"({"__metadata__":{"format":"pt"},)"
                     R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}})";
  ASSERT_EQ(json.size(), 139u);
  json += std::string(5, ' ');  // 139 -> 144, a multiple of 8
  std::string data(10, '\0');
  std::memcpy(data.data(), a, 8);
  std::memcpy(data.data() + 8, &b, 2);
  EXPECT_EQ(read_bytes(path), hand_file(json, data));
}

TEST(Safetensors, ReadsAHandBuiltFile) {
  TempDir dir;
  // Unpadded header, keys in another order than the data, an empty tensor
  // between two others: all valid by the format.
  const float x[3] = {1, 2, 3};
  const int32_t y = 42;
  std::string data(16, '\0');
  std::memcpy(data.data(), &y, 4);
  std::memcpy(data.data() + 4, x, 12);
  const std::string path = dir.file(
      "hand.safetensors", hand_file(R"({"x":{"shape":[3],"dtype":"F32","data_offsets":[4,16]},)"
                                    R"("e":{"dtype":"BF16","shape":[2,0],"data_offsets":[4,4]},)"
                                    R"("y":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
                                    data));
  const SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "y");
  EXPECT_EQ(f.metadata().size(), 0u);
  float got[3];
  to_f32(DType::F32, f.at("x").data, got, 3);
  EXPECT_EQ(got[2], 3.0f);
  int32_t yy;
  std::memcpy(&yy, f.at("y").data, 4);
  EXPECT_EQ(yy, 42);
}

TEST(Safetensors, RefusesDamagedFiles) {
  TempDir dir;
  const float v[4] = {1, 2, 3, 4};
  const std::string good = dir.path("good.safetensors");
  safetensors_write(good, {{"a", DType::F32, {2}, v}, {"b", DType::F32, {2}, v + 2}});
  const std::string raw = read_bytes(good);
  const std::string data(reinterpret_cast<const char*>(v), 16);

  expect_refused(dir.path("missing.safetensors"), "cannot open");
  expect_refused(dir.file("empty.safetensors", ""), "too short");
  expect_refused(dir.file("short.safetensors", std::string(5, '\0')), "too short");

  const std::string truncated = dir.file("trunc.safetensors", raw.substr(0, raw.size() - 3));
  expect_refused(truncated, "truncated");
  expect_refused(dir.file("trunc_header.safetensors", raw.substr(0, 20)), "header length");

  std::string big_len = raw;
  big_len.replace(0, 8, le64(1'000'000));
  expect_refused(dir.file("big_len.safetensors", big_len), "header length 1000000 exceeds");

  expect_refused(dir.file("bad_json.safetensors", hand_file(R"({"a": {"dtype": )", "")),
                 "not valid JSON");
  expect_refused(dir.file("array.safetensors", hand_file("[1, 2]", "")), "not a JSON object");

  const auto entry = [](const char* name, const char* dtype, const char* shape, int b, int e) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype,
                       shape, b, e);
  };
  const auto file = [&](const std::string& name, const std::string& entries) {
    return dir.file(name, hand_file("{" + entries + "}", data));
  };
  expect_refused(file("overlap.safetensors",
                      entry("a", "F32", "[3]", 0, 12) + "," + entry("b", "F32", "[2]", 8, 16)),
                 "overlap");
  expect_refused(file("gap.safetensors",
                      entry("a", "F32", "[1]", 0, 4) + "," + entry("b", "F32", "[2]", 8, 16)),
                 "belong to no tensor");
  expect_refused(file("size.safetensors",
                      entry("a", "F32", "[3]", 0, 8) + "," + entry("b", "F32", "[2]", 8, 16)),
                 "hold 8 bytes but shape [3] of F32 needs 12");
  expect_refused(file("trailing.safetensors", entry("a", "F32", "[2]", 0, 8)), "8 trailing bytes");
  expect_refused(file("past.safetensors", entry("a", "F32", "[6]", 0, 24)), "run past");
  expect_refused(file("dtype.safetensors", entry("a", "Q4", "[4]", 0, 16)), "unknown dtype");
  expect_refused(file("neg.safetensors", entry("a", "F32", "[-4]", 0, 16)), "non-negative");
  expect_refused(file("backwards.safetensors", entry("a", "F32", "[4]", 16, 0)),
                 "end before begin");
  expect_refused(
      file("meta.safetensors", R"("__metadata__":{"k":1},)" + entry("a", "F32", "[4]", 0, 16)),
      "not a string");
  expect_refused(file("noshape.safetensors", R"("a":{"dtype":"F32","data_offsets":[0,16]})"),
                 "missing 'shape'");
}

TEST(Safetensors, WriterRefusesBadInput) {
  TempDir dir;
  const float v[2] = {1, 2};
  const std::string path = dir.path("w.safetensors");
  EXPECT_THROW(safetensors_write(path, {{"a", DType::F32, {2}, v}, {"a", DType::F32, {2}, v}}),
               InputError);
  EXPECT_THROW(safetensors_write(path, {{"", DType::F32, {2}, v}}), InputError);
  EXPECT_THROW(safetensors_write(path, {{"__metadata__", DType::F32, {2}, v}}), InputError);
  EXPECT_THROW(safetensors_write(path, {{"a", DType::F32, {2}, nullptr}}), InputError);
  EXPECT_THROW(safetensors_write(path, {{"a", DType::F32, {-2}, v}}), InputError);
  EXPECT_THROW(
      safetensors_write(dir.path("no/such/folder/w.safetensors"), {{"a", DType::F32, {2}, v}}),
      InputError);
  EXPECT_FALSE(std::filesystem::exists(path));
  // An empty file list is a valid file: "{}" padded to 8 bytes.
  safetensors_write(path, {});
  EXPECT_EQ(read_bytes(path), le64(8) + "{}      ");
  EXPECT_TRUE(SafetensorsFile(path).tensors().empty());
}

}  // namespace
}  // namespace weft::checkpoint
