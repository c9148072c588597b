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

TEST(ClusterSpec, TopologyFromPresetsAndJson) {
  // Device presets are DGX-style nodes: a port per device, NVLink within the node.
  const auto a = cluster_resolve("a100-80gb", 64, kUnset);
  EXPECT_EQ(a.domain(), 8);
  EXPECT_EQ(a.nics(), 8);
  EXPECT_DOUBLE_EQ(a.network_bandwidth_per_device(), 25e9);
  const auto dgx = cluster_resolve("dgx-h100", 16, kUnset);
  EXPECT_EQ(dgx.device.name, "h100");
  EXPECT_DOUBLE_EQ(dgx.network_bandwidth_per_device(), 50e9);
  EXPECT_NE(dgx.summary().find("8 x 400 Gb/s network per node"), std::string::npos) << dgx.summary();

  test::TempDir dir;
  const auto path = dir.file("topo.json", R"({"device": {"preset": "a100-80gb"}, "gpus": 64,
    "gpus_per_node": 8, "nics_per_node": 2, "nic_bandwidth": 25e9, "nvlink_domain": 8})");
  const auto c = cluster_resolve(path, kUnset, kUnset);
  EXPECT_EQ(c.nics(), 2);
  EXPECT_DOUBLE_EQ(c.network_bandwidth_per_device(), 2 * 25e9 / 8);
  const nlohmann::json j = c;
  EXPECT_EQ(j["nics_per_node"], 2);
  EXPECT_EQ(j["nvlink_domain"], 8);
  WEFT_EXPECT_THROW_MSG(
      cluster_resolve(dir.file("nics.json", R"({"device": {"preset": "h100"}, "nics_per_node": 0})"), kUnset, kUnset),
      InputError, "nics_per_node", "positive whole number");
  WEFT_EXPECT_THROW_MSG(
      cluster_resolve(dir.file("bw.json", R"({"device": {"preset": "h100"}, "nic_bandwidth": -5})"), kUnset, kUnset),
      InputError, "nic_bandwidth", "-5");
  WEFT_EXPECT_THROW_MSG(
      cluster_resolve(dir.file("dom.json", R"({"device": {"preset": "h100"}, "nvlink_domain": 3, "gpus": 8})"),
                      kUnset, kUnset),
      InputError, "nvlink_domain 3");
}

// A cluster file's wrong types and absurd figures: each names the file, the
// field, the value and what is valid.
TEST(ClusterSpec, FileValuesOfTheWrongTypeOrRangeAreRefusedByField) {
  test::TempDir dir;
  struct Case {
    const char* name;
    const char* json;
    std::vector<const char*> says;
  };
  const std::vector<Case> cases = {
      {"device5", R"({"device": 5})", {"field 'device'", "5"}},
      {"name3", R"({"device": {"preset": "h100", "name": 3}})", {"device.name", "3"}},
      {"kind", R"({"device": {"preset": "h100", "kind": "tpu"}})", {"device.kind", "tpu"}},
      {"overhead", R"({"device": {"preset": "h100", "runtime_overhead_bytes": "1G"}})",
       {"device.runtime_overhead_bytes", "1G"}},
      {"nic", R"({"device": {"preset": "h100"}, "nic_bandwidth": 1e-300})",
       {"nic_bandwidth", "1e-300", "from 1e+06 to 1e+15 bytes/s"}},
      {"hbm", R"({"device": {"preset": "h100", "memory_bandwidth": 1e30}})",
       {"device.memory_bandwidth", "1e+30", "bytes/s"}},
      {"latency", R"({"device": {"preset": "h100", "inter_node_latency": 1e-300}})",
       {"device.inter_node_latency", "from 1e-09 to 1 seconds"}},
      {"memory", R"({"device": {"preset": "h100", "memory_bytes": 1}})", {"device.memory_bytes", "bytes"}},
      {"domain", R"({"device": {"preset": "h100"}, "gpus": 16, "nvlink_domain": 32})",
       {"nvlink_domain", "32", "16 devices", "at most 16"}},
      {"gpus", R"({"device": {"preset": "h100"}, "gpus": "8"})", {"gpus", "\"8\""}},
  };
  for (const auto& c : cases) {
    const auto path = dir.file(std::string(c.name) + ".json", c.json);
    WEFT_EXPECT_THROW_MSG(cluster_resolve(path, kUnset, kUnset), InputError, path.c_str());
    for (const char* frag : c.says) WEFT_EXPECT_THROW_MSG(cluster_resolve(path, kUnset, kUnset), InputError, frag);
  }
  // A domain of a whole node while the run uses part of it is a preset's normal case.
  EXPECT_EQ(cluster_resolve("dgx-h100", 4, kUnset).domain(), 8);
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
  EXPECT_EQ(parse_bytes("2GiB"), 2 * GiB);
  EXPECT_EQ(parse_bytes("512MiB"), 512 * MiB);
  EXPECT_EQ(parse_bytes("1.5G"), 3 * GiB / 2);
  EXPECT_EQ(parse_bytes("64K"), 64 * KiB);
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_EQ(parse_bytes("10B"), 10);
  for (const char* bad : {"", "2GB", "-1G", "0", "1e30", "nanG", "2 GiB"})
    WEFT_EXPECT_THROW_MSG(parse_bytes(bad), InputError, (std::string("'") + bad + "'").c_str());
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

TEST(DeviceSpec, RealGpusMapToTheirPresetsAndUnknownOnesGetTheirPeakFromTheClock) {
  GpuProperties h100{"NVIDIA H100 80GB HBM3", 85520809984, 132, 9, 0, 1.98e9, 5120, 2.619e9};
  auto d = device_from_gpu(h100);
  EXPECT_EQ(d.name, "h100");
  EXPECT_EQ(d.memory_bytes, 85520809984);
  EXPECT_DOUBLE_EQ(d.peak_bf16_flops, device_preset("h100").peak_bf16_flops);
  GpuProperties h200{"NVIDIA H200", 150754820096, 132, 9, 0, 1.98e9, 6144, 3.2e9};
  EXPECT_EQ(device_from_gpu(h200).name, "h200");
  GpuProperties a40{"NVIDIA A100-SXM4-40GB", 42505273344, 108, 8, 0, 1.41e9, 5120, 1.215e9};
  GpuProperties a80{"NVIDIA A100-SXM4-80GB", 85198045184, 108, 8, 0, 1.41e9, 5120, 1.593e9};
  EXPECT_EQ(device_from_gpu(a40).name, "a100-40gb");
  EXPECT_EQ(device_from_gpu(a80).name, "a100-80gb");
  // An unknown Ampere part: 84 SMs at 1.74 GHz, 2048 bf16 FLOPs per SM per clock.
  GpuProperties other{"NVIDIA RTX A6000", 51050315776, 84, 8, 6, 1.74e9, 384, 8.0e9};
  d = device_from_gpu(other);
  EXPECT_EQ(d.name, "NVIDIA RTX A6000");
  EXPECT_NEAR(d.peak_bf16_flops, 84 * 1.74e9 * 2048, 1e6);
  EXPECT_NEAR(d.memory_bandwidth, 768e9, 1e9);
  EXPECT_EQ(d.sm_count, 84);
  // This machine: a GPU when there is one, else nothing (never an error).
  const auto here = gpu_detect();
  if (here) { EXPECT_GT(here->peak_bf16_flops, 0); }
}

TEST(DeviceSpec, CpuRanksShareTheMachine) {
  DeviceSpec m = device_preset("cpu");
  m.sm_count = 2;
  const auto quarter = cpu_rank_share(m, 4, 1);  // 4 ranks of 1 thread on 2 cores
  EXPECT_DOUBLE_EQ(quarter.peak_fp32_flops, m.peak_fp32_flops / 4);
  EXPECT_EQ(quarter.memory_bytes, m.memory_bytes / 4);
  const auto half = cpu_rank_share(m, 2, 0);
  EXPECT_DOUBLE_EQ(half.peak_fp32_flops, m.peak_fp32_flops / 2);
  EXPECT_DOUBLE_EQ(cpu_rank_share(m, 1, 0).peak_fp32_flops, m.peak_fp32_flops);
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

TEST(DeviceSpec, Fp8PeaksAndArchitectures) {
  // Dense FP8 from the H100/H200 SXM datasheets (3958 TFLOP/s with sparsity);
  // A100 (sm_80) has no FP8 tensor cores.
  const auto h = device_preset("h100");
  EXPECT_EQ(h.sm_arch, 90);
  EXPECT_DOUBLE_EQ(h.peak_fp8_flops, 1978.9e12);
  EXPECT_TRUE(h.has_fp8());
  EXPECT_TRUE(device_preset("h200").has_fp8());
  EXPECT_NE(h.summary().find("fp8 dense peak 1979"), std::string::npos) << h.summary();
  const auto a = device_preset("a100-80gb");
  EXPECT_EQ(a.sm_arch, 80);
  EXPECT_FALSE(a.has_fp8());
  EXPECT_EQ(a.summary().find("fp8"), std::string::npos);
  // MFU's peak stays the bf16 one on an FP8 device.
  EXPECT_DOUBLE_EQ(h.peak_flops("bf16"), 989.4e12);
  // The CPU has none, but is not refused (FP8 is emulated there).
  const auto c = device_preset("cpu");
  EXPECT_FALSE(c.has_fp8());
  EXPECT_EQ(fp8_unsupported_reason(c), "");
  EXPECT_EQ(fp8_unsupported_reason(h), "");
  const std::string why = fp8_unsupported_reason(a);
  EXPECT_NE(why.find("a100-80gb (sm_80) has no FP8 tensor cores"), std::string::npos) << why;
  EXPECT_NE(why.find("sm_89 or sm_90 (h100, h200"), std::string::npos) << why;
}

TEST(DeviceSpec, Fp8FromTheGpuItself) {
  // A detected H100 keeps the preset's FP8 peak and takes its architecture.
  GpuProperties h100{"NVIDIA H100 80GB HBM3", 85520809984, 132, 9, 0, 1.98e9, 5120, 2.619e9};
  EXPECT_DOUBLE_EQ(device_from_gpu(h100).peak_fp8_flops, 1978.9e12);
  EXPECT_EQ(device_from_gpu(h100).sm_arch, 90);
  // An unknown Ada part (L40S: 142 SMs at 2.52 GHz): 2048 FP8 FLOPs per SM
  // per clock, 733 TFLOP/s dense as its datasheet states.
  GpuProperties l40s{"NVIDIA L40S", 48305799168, 142, 8, 9, 2.52e9, 384, 9.0e9};
  const auto ada = device_from_gpu(l40s);
  EXPECT_EQ(ada.sm_arch, 89);
  EXPECT_NEAR(ada.peak_fp8_flops, 733e12, 1e12);
  EXPECT_TRUE(ada.has_fp8());
  // An unknown Ampere part has none, and says why by its architecture.
  GpuProperties a6000{"NVIDIA RTX A6000", 51050315776, 84, 8, 6, 1.74e9, 384, 8.0e9};
  const auto amp = device_from_gpu(a6000);
  EXPECT_FALSE(amp.has_fp8());
  EXPECT_NE(fp8_unsupported_reason(amp).find("(sm_86)"), std::string::npos) << fp8_unsupported_reason(amp);
}

TEST(DeviceSpec, Fp8FieldsInJson) {
  // Round trip, and a file written before the fields (a custom device
  // without them) loads as a device without FP8; a preset keeps its own.
  nlohmann::json j = device_preset("h100");
  EXPECT_DOUBLE_EQ(j.at("peak_fp8_flops").get<double>(), 1978.9e12);
  EXPECT_EQ(j.at("sm_arch").get<int64_t>(), 90);
  const auto back = j.get<DeviceSpec>();
  EXPECT_DOUBLE_EQ(back.peak_fp8_flops, 1978.9e12);
  EXPECT_EQ(back.sm_arch, 90);
  const auto old = nlohmann::json::parse(R"({"name": "old", "memory_bytes": 17179869184, "peak_bf16_flops": 1e14,
      "memory_bandwidth": 1e12, "intra_node_bandwidth": 1e11, "inter_node_bandwidth": 1e10})")
                       .get<DeviceSpec>();
  EXPECT_FALSE(old.has_fp8());
  EXPECT_EQ(old.sm_arch, 0);
  EXPECT_NE(fp8_unsupported_reason(old).find("old (architecture not stated)"), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(R"({"preset": "h200"})").get<DeviceSpec>().has_fp8());
  EXPECT_FALSE(nlohmann::json::parse(R"({"preset": "h100", "peak_fp8_flops": 0})").get<DeviceSpec>().has_fp8());
  WEFT_EXPECT_THROW_MSG(nlohmann::json::parse(R"({"preset": "h100", "peak_fp8_flops": 2})").get<DeviceSpec>(),
                        InputError, "device.peak_fp8_flops");
  WEFT_EXPECT_THROW_MSG(nlohmann::json::parse(R"({"preset": "h100", "sm_arch": "9.0"})").get<DeviceSpec>(),
                        InputError, "device.sm_arch", "89 for Ada");
}

}  // namespace
}  // namespace weft
