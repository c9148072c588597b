// Device profiles: JSON round trips, refusal of malformed or foreign ones
// naming the field, fingerprints, and the presets' built-in profiles.
#include <fstream>

#include "test_util.h"
#include "core/error.h"
#include "tuner/device_profile.h"

namespace weft::tuner {
namespace {

DeviceProfile measured() {
  DeviceProfile p;
  p.device = "cpu";
  p.origin = ProfileOrigin::measured;
  p.constants = datasheet_constants(device_preset("cpu"));
  p.fingerprint = machine_fingerprint(device_preset("cpu"), 2, 1);
  auto r = std::make_shared<MeasuredRates>();
  r->gemm = {{512, 1536, 512, 1.5e-3}, {512, 512, 1536, 1.4e-3}};
  r->streams["rmsnorm"] = {2e-6, 4e9};
  r->attention = {{"flash", 2, 8, 8, 256, 64, 2e-3, 5e-3}};
  r->comm = {{"all_reduce", 2, 2e-5, 3e9}, {"p2p", 2, 5e-6, 6e9}};
  p.rates = r;
  return p;
}

TEST(DeviceProfile, RoundTripsThroughJson) {
  const auto p = measured();
  const auto q = profile_from_json(profile_to_json(p), "test");
  EXPECT_EQ(q.device, "cpu");
  EXPECT_EQ(q.origin, ProfileOrigin::measured);
  EXPECT_EQ(q.constants, p.constants);
  EXPECT_EQ(q.fingerprint, p.fingerprint);
  ASSERT_TRUE(q.rates);
  EXPECT_EQ(q.rates->gemm.size(), 2u);
  EXPECT_DOUBLE_EQ(*q.rates->stream_seconds("rmsnorm", 4e9), 1.0 + 2e-6);
  EXPECT_FALSE(q.rates->stream_seconds("rope", 1.0));
  EXPECT_DOUBLE_EQ(*q.rates->comm_seconds("all_reduce", 2, 3e9), 1.0 + 2e-5);
  EXPECT_FALSE(q.rates->comm_seconds("all_reduce", 4, 1.0));
  // A measured GEMM by its own time; another shape scaled by FLOPs from the nearest.
  EXPECT_DOUBLE_EQ(*q.rates->gemm_seconds(512, 1536, 512), 1.5e-3);
  EXPECT_DOUBLE_EQ(*q.rates->gemm_seconds(1024, 1536, 512), 3.0e-3);
  EXPECT_DOUBLE_EQ(*q.rates->attention_seconds("flash", true, 4, 8, 8, 256, 64), 1e-2);
  EXPECT_FALSE(q.rates->attention_seconds("materialized", false, 2, 8, 8, 256, 64));
}

TEST(DeviceProfile, MalformedProfilesNameTheField) {
  auto j = profile_to_json(measured());
  auto bad = j;
  bad["format"] = "something-else";
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "p.json", "not a weft device profile");
  bad = j;
  bad["version"] = 99;
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "version 99", "weft calibrate");
  bad = j;
  bad["rates"]["gemm"][0]["seconds"] = -1;
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "seconds", "positive");
  bad = j;
  bad["rates"]["comm"][0].erase("ranks");
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "missing field 'ranks'");
  bad = j;
  bad["constants"]["gemm_efficiency"] = "fast";
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "gemm_efficiency");
  bad = j;
  bad.erase("fingerprint");
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "fingerprint");
  bad = j;
  bad["fingerprint"]["threads"] = "4";
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "p.json", "fingerprint.threads", "\"4\"");
  bad = j;
  bad["rates"]["streams"] = nlohmann::json::object({{"copy", {{"launch_s", 1e-6}, {"bytes_per_s", nullptr}}}});
  WEFT_EXPECT_THROW_MSG(profile_from_json(bad, "p.json"), InputError, "p.json", "bytes_per_s", "null");
  const std::string path = ::testing::TempDir() + "/profile_garbage.json";
  std::ofstream(path) << "{not json";
  WEFT_EXPECT_THROW_MSG(profile_load(path), InputError, path.c_str());
}

TEST(DeviceProfile, FingerprintMismatchesAreNamed) {
  const auto p = measured();
  EXPECT_TRUE(profile_mismatches(p, machine_fingerprint(device_preset("cpu"), 2, 1)).empty());
  const auto diff = profile_mismatches(p, machine_fingerprint(device_preset("cpu"), 4, 1));
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_NE(diff[0].find("ranks_per_node: profile 2, here 4"), std::string::npos) << diff[0];
  auto old = p;
  old.fingerprint["weft_version"] = "0.0.1";
  EXPECT_EQ(profile_mismatches(old, machine_fingerprint(device_preset("cpu"), 2, 1)).size(), 1u);
}

TEST(DeviceProfile, GpuPresetsShipFittedProfiles) {
  for (const char* dev : {"a100-40gb", "a100-80gb", "h100", "h200"}) {
    const auto p = preset_profile(device_preset(dev));
    ASSERT_TRUE(p) << dev;
    EXPECT_EQ(p->origin, ProfileOrigin::fitted);
    EXPECT_EQ(cost_defaults(device_preset(dev)), p->constants) << dev;
    EXPECT_TRUE(p->provenance.contains("fitted_rows")) << dev;
  }
  EXPECT_FALSE(preset_profile(device_preset("cpu")));
  EXPECT_EQ(cost_defaults(device_preset("cpu")), datasheet_constants(device_preset("cpu")));
}

}  // namespace
}  // namespace weft::tuner
