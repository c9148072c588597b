// Device profiles: what the cost model knows about a device beyond its
// datasheet. A profile is a JSON file (format "weft-device-profile") with the
// cost constants and, when it was measured on a machine (`weft calibrate`),
// the measured rates (core/measured_rates.h) and the machine's fingerprint.
// The GPU presets ship profiles fitted to public measured training runs
// (calibration/profiles/, built into the binary); cost_defaults() starts
// from them.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/device_spec.h"
#include "core/measured_rates.h"
#include "tuner/cost.h"

namespace weft::tuner {

constexpr int kDeviceProfileVersion = 1;

enum class ProfileOrigin { fitted, measured };

struct DeviceProfile {
  std::string device;            // the preset family ("a100", "hopper") or the device's name
  ProfileOrigin origin = ProfileOrigin::fitted;
  CostConstants constants;
  nlohmann::json fingerprint;    // measured: the machine and build it was measured on
  nlohmann::json provenance;     // fitted: the rows and the fit; measured: the command
  std::shared_ptr<const MeasuredRates> rates;  // measured only
};

nlohmann::json profile_to_json(const DeviceProfile& p);
// InputError naming `origin` (a path) and the field for a malformed profile,
// another format or version.
DeviceProfile profile_from_json(const nlohmann::json& j, const std::string& origin);
DeviceProfile profile_load(const std::string& path);
// Written through a temporary file and a rename (never half-written).
void profile_save(const DeviceProfile& p, const std::string& path);

// The family whose fitted profile a device shares: "a100" (40 and 80 GB),
// "hopper" (H100, H200), else the device's own name.
std::string device_family_name(const DeviceSpec& device);

// The fitted profile a device preset ships with (its family's), if any.
std::optional<DeviceProfile> preset_profile(const DeviceSpec& device);

// This machine and build, as a measured profile records it: host name, CPU
// model and cores (or the GPU's name and count), the threads and ranks per
// node it was measured with, the weft version and the kernel backends.
nlohmann::json machine_fingerprint(const DeviceSpec& device, int64_t ranks_per_node, int64_t threads);

// Why a measured profile must not be used here: each fingerprint field that
// differs from this machine's, as "field: profile X, here Y". Empty when it
// matches.
std::vector<std::string> profile_mismatches(const DeviceProfile& p, const nlohmann::json& here);

// Puts a profile to use for `cluster`: a measured one's rates onto the
// device (the cost model prefers them to the datasheet), its constants into
// `k`. InputError naming `path` and every fingerprint field that differs
// from `here` (another machine, rank count, thread count or weft version),
// or a profile of another device: a stale profile is never used.
void profile_use(const DeviceProfile& p, const std::string& path, const nlohmann::json& here,
                 ClusterSpec& cluster, CostConstants& k);

}  // namespace weft::tuner
