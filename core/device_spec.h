// DeviceSpec and ClusterSpec: what one accelerator (or the CPU) can do and how
// the devices of a cluster are connected. Presets carry datasheet numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/measured_rates.h"

namespace weft {

enum class DeviceKind { gpu, cpu };

// What one GPU process takes beyond weft's arena: the CUDA context and the
// cuBLAS and cuDNN handles with their own memory. Measured on an H200 (CUDA
// 13.0, driver 580): 0.52-0.53 GiB over eight Llama 3.2 1B layouts.
inline constexpr int64_t kGpuRuntimeBytes = int64_t{544} << 20;

struct DeviceSpec {
  std::string name;
  DeviceKind kind = DeviceKind::gpu;
  int64_t memory_bytes = 0;          // total device memory
  double peak_bf16_flops = 0;        // dense tensor-core bf16 FLOP/s
  double peak_fp32_flops = 0;        // dense fp32 FLOP/s (the peak used on CPU)
  // Dense FP8 tensor-core FLOP/s (E4M3/E5M2 inputs, fp32 accumulation); 0
  // for a device without FP8 tensor cores (before sm_89, and the CPU).
  double peak_fp8_flops = 0;
  int64_t sm_arch = 0;               // CUDA compute capability x 10 (80, 89, 90); 0: not a CUDA device or unknown
  double memory_bandwidth = 0;       // HBM (or DRAM) bytes/s
  double intra_node_bandwidth = 0;   // NVLink bytes/s per GPU, one direction
  double inter_node_bandwidth = 0;   // network bytes/s per GPU, one direction
  double intra_node_latency = 0;     // seconds per collective hop inside a node
  double inter_node_latency = 0;     // seconds per collective hop across nodes
  int64_t sm_count = 0;              // streaming multiprocessors (cores on CPU)
  int64_t runtime_overhead_bytes = 0;  // CUDA context, library handles (kGpuRuntimeBytes on a GPU)
  int64_t default_gpus_per_node = 8;
  // Ranks of this run that share this one device (a GPU several ranks were
  // started on): memory_bytes is then this rank's share, and the tensors
  // travel over MPI through host memory instead of NCCL (which needs a device
  // per rank). 1: a device of its own.
  int64_t shared_by = 1;
  // Rates measured on this machine (a measured device profile), which the
  // cost model prefers to the datasheet numbers above; none by default.
  std::shared_ptr<const MeasuredRates> measured;

  // The peak that MFU is measured against for a precision ("bf16"/"fp32").
  // FP8 layouts are measured against the bf16 peak too: MFU counts the
  // model's FLOPs against the dense compute-precision peak, whatever the
  // GEMMs ran in, so that FP8 and BF16 runs compare on one scale.
  double peak_flops(std::string_view precision) const;
  // Whether the device has FP8 tensor cores (a GPU with an FP8 peak).
  bool has_fp8() const { return kind == DeviceKind::gpu && peak_fp8_flops > 0; }
  std::string summary() const;
};

// Why FP8 GEMMs cannot run on `d`, naming the device, its architecture and
// the devices that can ("a100-80gb (sm_80) has no FP8 tensor cores; FP8
// needs sm_89 or sm_90 (h100, h200)"); empty when they can. The CPU is not
// refused here: its FP8 is emulated (quantise-dequantise around fp32 GEMMs),
// which training allows and the tuner searches only when pinned.
std::string fp8_unsupported_reason(const DeviceSpec& d);

// The most GPUs a cluster may have (2^20): ten times the largest built.
inline constexpr int64_t kMaxClusterGpus = int64_t{1} << 20;

// How the devices are wired. A node is the devices that share its network
// ports; an NVLink domain is the devices that reach each other over the fast
// link (a DGX node, or several nodes on one NVLink switch fabric). Ranks are
// numbered so that consecutive ones share a node and a domain.
struct ClusterSpec {
  DeviceSpec device;
  int64_t gpus = 1;           // world size
  int64_t gpus_per_node = 8;  // devices sharing a node's network ports
  int64_t nvlink_domain = 0;  // devices sharing the fast link; 0: one node (gpus_per_node)
  int64_t nics_per_node = 0;  // network ports per node; 0: one per device
  double nic_bandwidth = 0;   // bytes/s per port, one direction; 0: device.inter_node_bandwidth

  int64_t nodes() const { return (gpus + gpus_per_node - 1) / gpus_per_node; }
  int64_t domain() const { return nvlink_domain > 0 ? nvlink_domain : gpus_per_node; }
  int64_t nics() const { return nics_per_node > 0 ? nics_per_node : gpus_per_node; }
  double nic_bytes_per_s() const { return nic_bandwidth > 0 ? nic_bandwidth : device.inter_node_bandwidth; }
  // A device's share of its node's network when every device of the node
  // sends at once (as all of them do in a data-parallel reduction).
  double network_bandwidth_per_device() const {
    return double(nics()) * nic_bytes_per_s() / double(gpus_per_node);
  }
  // Throws InputError naming the values when a count or bandwidth is invalid.
  void validate() const;
  std::string summary() const;
};

// Cluster presets: DGX-style nodes (8 devices on NVLink, one network port per
// device: HDR 200 Gb/s for A100, NDR 400 Gb/s for H100 and H200).
std::vector<std::string> cluster_preset_names();

std::vector<std::string> device_preset_names();
// A preset by name (case-insensitive, "h100-sxm" accepted for "h100");
// InputError listing the valid names otherwise. "cpu" describes this machine.
DeviceSpec device_preset(const std::string& name);
// This machine's CPU: cores, and a peak from the vector width and clock.
DeviceSpec device_detect_cpu();
// What a CUDA device reports about itself (filled by the CUDA runtime in
// gpu_detect(); plain data so the mapping below is testable anywhere).
struct GpuProperties {
  std::string name;            // "NVIDIA H100 80GB HBM3"
  int64_t memory_bytes = 0;    // total global memory
  int64_t sm_count = 0;
  int64_t compute_major = 0;   // compute capability
  int64_t compute_minor = 0;
  double clock_hz = 0;         // SM boost clock
  double memory_bus_bits = 0;  // for the bandwidth of an unknown part
  double memory_clock_hz = 0;
};

// The DeviceSpec of a real GPU: the matching preset (A100 40/80 GB, H100,
// H200) with the device's own name, memory and SM count; an unknown part gets
// its dense bf16 peak from SMs x clock x tensor-core FLOPs per SM per clock
// (2048 on sm_80/86/89, 4096 on sm_90) and its bandwidth from the memory bus.
DeviceSpec device_from_gpu(const GpuProperties& p);

// The GPU this process would use (device `ordinal`), or nothing when the
// build has no CUDA or the machine no GPU.
std::optional<DeviceSpec> gpu_detect(int ordinal = 0);
// CUDA devices this process sees (0 without CUDA, a driver or a GPU).
int gpu_count();
// Makes device `ordinal` this thread's current device (cudaSetDevice);
// InputError naming the ordinal and the count when there is no such device.
void gpu_select(int ordinal);

// What one of `local_ranks` processes sharing a CPU machine gets when each runs
// `threads` threads (0: an equal share of the cores): its cores' part of the
// peak (oversubscribed ranks split the cores), and an equal part of the memory
// and its bandwidth. Device = rank, so MFU over all ranks is against the machine.
DeviceSpec cpu_rank_share(const DeviceSpec& machine, int64_t local_ranks, int64_t threads);

// --gpu NAME|FILE.json --gpus N --gpus-per-node G. NAME is a device preset
// (DGX-style nodes) or a cluster preset (dgx-a100, dgx-h100, ...). A JSON
// file describes a custom cluster: {"device": {"preset": "h100", ...overrides}
// or full fields, "gpus": N, "gpus_per_node": G, "nvlink_domain": D,
// "nics_per_node": K, "nic_bandwidth": bytes/s}; explicit CLI values override
// the file.
// kUnset for gpus or gpus_per_node takes the file's value, else 1 device and
// the device's default per node.
constexpr int64_t kUnset = INT64_MIN;
ClusterSpec cluster_resolve(const std::string& gpu, int64_t gpus, int64_t gpus_per_node);

void to_json(nlohmann::json& j, const DeviceSpec& d);
void from_json(const nlohmann::json& j, DeviceSpec& d);
void to_json(nlohmann::json& j, const ClusterSpec& c);

}  // namespace weft
