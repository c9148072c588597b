#include <nlohmann/json.hpp>

#include "core/device_spec.h"
#include "core/error.h"
#include "core/units.h"
#include "test_util.h"

namespace weft {
namespace {

TEST(DeviceSpec, PresetsCarryDatasheetNumbers) {
  const auto a = device_preset("a100-80gb");
  EXPECT_EQ(a.memory_bytes, 81920 * MiB);
  EXPECT_DOUBLE_EQ(a.peak_bf16_flops, 312e12);
  EXPECT_DOUBLE_EQ(a.memory_bandwidth, 2039e9);
  const auto h = device_preset("H100-SXM");
  EXPECT_EQ(h.name, "h100");
  EXPECT_DOUBLE_EQ(h.peak_bf16_flops, 989.4e12);
  EXPECT_GT(device_preset("h200").memory_bytes, h.memory_bytes);
  EXPECT_LT(device_preset("a100-40gb").memory_bytes, a.memory_bytes);
}

TEST(DeviceSpec, CpuStatesItsPeak) {
  const auto c = device_preset("cpu");
  EXPECT_EQ(c.kind, DeviceKind::cpu);
  EXPECT_GT(c.peak_fp32_flops, 0);
  EXPECT_DOUBLE_EQ(c.peak_flops("bf16"), c.peak_fp32_flops);
  EXPECT_NE(c.summary().find("GFLOP/s"), std::string::npos);
}

TEST(DeviceSpec, UnknownDeviceListsValidNames) {
  WEFT_EXPECT_THROW_MSG(device_preset("v100"), InputError, "v100", "a100-80gb", "h200");
}

TEST(ClusterSpec, FromCliValues) {
  const auto c = cluster_resolve("h100", 64, kUnset);
  EXPECT_EQ(c.gpus, 64);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_EQ(c.nodes(), 8);
  EXPECT_EQ(cluster_resolve("h100", 4, kUnset).nodes(), 1);
  WEFT_EXPECT_THROW_MSG(cluster_resolve("h100", 12, 8), InputError, "12", "8");
  WEFT_EXPECT_THROW_MSG(cluster_resolve("h100", -4, 8), InputError, "-4");
  WEFT_EXPECT_THROW_MSG(cluster_resolve("h100", 8, -1), InputError, "-1");
}

TEST(ClusterSpec, FromJsonFile) {
  test::TempDir dir;
  const auto path = dir.file("cluster.json", R"({"device": {"preset": "h100", "name": "h100-ib200",
    "inter_node_bandwidth": 25e9}, "gpus": 32, "gpus_per_node": 4})");
  const auto c = cluster_resolve(path, kUnset, kUnset);
  EXPECT_EQ(c.device.name, "h100-ib200");
  EXPECT_DOUBLE_EQ(c.device.inter_node_bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(c.device.peak_bf16_flops, 989.4e12);
  EXPECT_EQ(c.gpus, 32);
  EXPECT_EQ(c.gpus_per_node, 4);
  // CLI values override the file.
  EXPECT_EQ(cluster_resolve(path, 8, kUnset).gpus, 8);

  const auto custom = dir.file("custom.json", R"({"device": {"name": "mygpu",
    "memory_bytes": 17179869184, "peak_bf16_flops": 1e14, "memory_bandwidth": 1e12,
    "intra_node_bandwidth": 1e11, "inter_node_bandwidth": 1e10}, "gpus": 16})");
  const auto k = cluster_resolve(custom, kUnset, kUnset);
  EXPECT_EQ(k.device.memory_bytes, 16 * GiB);
  EXPECT_EQ(k.gpus_per_node, 8);

  WEFT_EXPECT_THROW_MSG(cluster_resolve(dir.file("bad.json", R"({"gpus": 8})"), kUnset, kUnset), InputError,
                        "bad.json", "device");
  WEFT_EXPECT_THROW_MSG(
      cluster_resolve(dir.file("neg.json", R"({"device": {"preset": "h100", "memory_bytes": -1}})"),
                      kUnset, kUnset),
      InputError, "memory_bytes");
  WEFT_EXPECT_THROW_MSG(
      cluster_resolve(dir.file("partial.json", R"({"device": {"memory_bytes": 1e10}})"), kUnset, kUnset),
      InputError, "preset");
}

TEST(DeviceSpec, JsonRoundTrip) {
  for (const auto& name : device_preset_names()) {
    const auto d = device_preset(name);
    const nlohmann::json j = d;
    const auto back = j.get<DeviceSpec>();
    EXPECT_EQ(back.name, d.name);
    EXPECT_EQ(back.memory_bytes, d.memory_bytes);
    EXPECT_DOUBLE_EQ(back.peak_bf16_flops, d.peak_bf16_flops);
    EXPECT_DOUBLE_EQ(back.inter_node_bandwidth, d.inter_node_bandwidth);
    EXPECT_EQ(back.kind, d.kind);
  }
}

TEST(Units, DurationsAndSizes) {
  EXPECT_DOUBLE_EQ(parse_duration("10m"), 600);
  EXPECT_DOUBLE_EQ(parse_duration("90s"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("250ms"), 0.25);
  EXPECT_DOUBLE_EQ(parse_duration("2"), 2);
  WEFT_EXPECT_THROW_MSG(parse_duration("10x"), InputError, "10x");
  WEFT_EXPECT_THROW_MSG(parse_duration("-1m"), InputError, "-1m");
  EXPECT_EQ(format_bytes(1.5 * double(GiB)), "1.50 GiB");
}

}  // namespace
}  // namespace weft
