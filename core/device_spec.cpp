#include "core/device_spec.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <thread>

#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"

namespace weft {

namespace {

constexpr double GB = 1e9;
constexpr double TF = 1e12;
constexpr int64_t MiB = int64_t{1} << 20;

// Datasheet numbers (NVIDIA A100 and H100/H200 SXM datasheets):
// - memory: the total nvidia-smi reports for each board;
// - peak: dense bf16 tensor-core throughput (no sparsity), fp32 non-tensor;
//   dense FP8 (E4M3/E5M2) tensor-core throughput where the part has FP8
//   tensor cores: H100 and H200 SXM 1979 TFLOP/s (the datasheets' 3958 is
//   with 2:4 sparsity); A100 has none (sm_80);
// - NVLink: the datasheet's bidirectional total halved (A100 600 GB/s -> 300,
//   H100/H200 900 GB/s -> 450 per direction);
// - network: one HDR 200 Gb/s NIC per A100 GPU (DGX A100) and one NDR
//   400 Gb/s NIC per H100/H200 GPU (DGX H100), i.e. 25 and 50 GB/s;
// - latencies: typical NCCL per-hop figures, ~5 us NVLink, ~10 us InfiniBand;
// - runtime overhead: what one GPU process takes beyond weft's arena (the
//   CUDA context, cuBLAS and cuDNN handles and their own memory): 544 MiB,
//   measured on an H200 (CUDA 13.0, driver 580; 0.52-0.53 GiB over eight
//   Llama 3.2 1B layouts, benchmarks/gpu_memory_model.py) and taken for every
//   GPU; NCCL's buffers, unmeasured, are the memory model's own term.
// h100-96gb is the H100 SXM board with 96 GB of HBM2e at a 500 W power limit
// (Meta's Grand Teton hosts, on which torchtitan's published runs were
// measured): 2.4 TB/s, NVLink and a 400 Gb/s NIC per GPU as its H100 SXM
// siblings. Its peak is not published (torchtitan: "between SXM and NVL");
// the preset states the SXM part's 132 SMs at its clocks, which the power
// limit lowers under load by an amount nobody has measured. Memory: 96 GiB
// less the ECC and driver share the 80 GB board reports (0.44%).
DeviceSpec gpu(const char* name, int64_t sm_arch, int64_t mem_mib, double bf16_tf, double fp8_tf, double fp32_tf,
               double hbm_gbs, double nvlink_gbs, double net_gbs, int64_t sms) {
  DeviceSpec d;
  d.name = name;
  d.kind = DeviceKind::gpu;
  d.sm_arch = sm_arch;
  d.memory_bytes = mem_mib * MiB;
  d.peak_bf16_flops = bf16_tf * TF;
  d.peak_fp8_flops = fp8_tf * TF;
  d.peak_fp32_flops = fp32_tf * TF;
  d.memory_bandwidth = hbm_gbs * GB;
  d.intra_node_bandwidth = nvlink_gbs * GB;
  d.inter_node_bandwidth = net_gbs * GB;
  d.intra_node_latency = 5e-6;
  d.inter_node_latency = 10e-6;
  d.sm_count = sms;
  d.runtime_overhead_bytes = kGpuRuntimeBytes;
  d.default_gpus_per_node = 8;
  return d;
}

std::vector<DeviceSpec> gpu_presets() {
  return {
      gpu("a100-40gb", 80, 40960, 312, 0, 19.5, 1555, 300, 25, 108),
      gpu("a100-80gb", 80, 81920, 312, 0, 19.5, 2039, 300, 25, 108),
      gpu("h100", 90, 81559, 989.4, 1978.9, 66.9, 3350, 450, 50, 132),
      gpu("h100-96gb", 90, 97871, 989.4, 1978.9, 66.9, 2400, 450, 50, 132),
      gpu("h200", 90, 143771, 989.4, 1978.9, 66.9, 4800, 450, 50, 132),
  };
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

double DeviceSpec::peak_flops(std::string_view precision) const {
  if (kind == DeviceKind::cpu || precision == "fp32") return peak_fp32_flops;
  return peak_bf16_flops;
}

std::string DeviceSpec::summary() const {
  if (kind == DeviceKind::cpu)
    return fmt::format("{} ({} cores, fp32 peak {:.0f} GFLOP/s, {:.1f} GiB)", name, sm_count,
                       peak_fp32_flops / 1e9, memory_bytes / double(1 << 30));
  return fmt::format("{} ({:.1f} GiB{}, bf16 dense peak {:.1f} TFLOP/s{}, HBM {:.0f} GB/s)", name,
                     memory_bytes / double(1 << 30),
                     shared_by > 1 ? fmt::format(": this rank's share, the GPU is shared by {} ranks", shared_by) : "",
                     peak_bf16_flops / TF,
                     has_fp8() ? fmt::format(", fp8 dense peak {:.0f} TFLOP/s", peak_fp8_flops / TF) : "",
                     memory_bandwidth / GB);
}

std::string fp8_unsupported_reason(const DeviceSpec& d) {
  if (d.kind == DeviceKind::cpu || d.has_fp8()) return "";
  const std::string arch = d.sm_arch > 0 ? fmt::format("sm_{}", d.sm_arch) : "architecture not stated";
  return fmt::format("{} ({}) has no FP8 tensor cores; FP8 needs sm_89 or sm_90 (h100, h200; a device "
                     "file states it with \"peak_fp8_flops\"), or the cpu device, where it is emulated",
                     d.name, arch);
}

void ClusterSpec::validate() const {
  if (gpus <= 0) throw InputError(fmt::format("--gpus {} must be a positive device count", gpus));
  // The largest clusters built hold about 10^5 GPUs; a count far past that
  // is a slip, and its space of layouts takes minutes to enumerate.
  if (gpus > kMaxClusterGpus)
    throw InputError(fmt::format("--gpus {} is past the {} GPUs a cluster may have here (2^20); give the cluster's "
                                 "own count",
                                 gpus, kMaxClusterGpus));
  if (gpus_per_node <= 0)
    throw InputError(fmt::format("--gpus-per-node {} must be positive", gpus_per_node));
  if (gpus > gpus_per_node && gpus % gpus_per_node != 0)
    throw InputError(fmt::format(
        "--gpus {} spans more than one node but is not a multiple of --gpus-per-node {}", gpus,
        gpus_per_node));
  if (nvlink_domain < 0)
    throw InputError(fmt::format("cluster: nvlink_domain {} must be positive (0: one node)", nvlink_domain));
  const int64_t d = domain();
  if (d % gpus_per_node != 0 && gpus_per_node % d != 0)
    throw InputError(fmt::format("cluster: nvlink_domain {} must divide or be a multiple of gpus_per_node {}",
                                 d, gpus_per_node));
  if (nics_per_node < 0)
    throw InputError(fmt::format("cluster: nics_per_node {} must be positive (0: one per device)", nics_per_node));
  if (!(nic_bandwidth >= 0) || !std::isfinite(nic_bandwidth))
    throw InputError(fmt::format("cluster: nic_bandwidth {} must be a positive number of bytes/s "
                                 "(0: the device's inter_node_bandwidth)",
                                 nic_bandwidth));
}

std::string ClusterSpec::summary() const {
  std::string s = fmt::format("{} x {} ({} node{} of {}", gpus, device.name, nodes(),
                              nodes() == 1 ? "" : "s", std::min(gpus, gpus_per_node));
  if (device.kind == DeviceKind::gpu && nodes() > 1)
    s += fmt::format(", {} x {:.0f} Gb/s network per node", nics(), nic_bytes_per_s() * 8 / GB);
  if (domain() != gpus_per_node) s += fmt::format(", NVLink domain of {}", domain());
  return s + ")";
}

std::vector<std::string> cluster_preset_names() {
  return {"dgx-a100", "dgx-a100-40gb", "dgx-h100", "dgx-h200"};
}

namespace {

// A DGX-style cluster preset, or nothing for another name.
std::optional<ClusterSpec> cluster_preset(const std::string& name) {
  static const std::pair<const char*, const char*> kPresets[] = {
      {"dgx-a100", "a100-80gb"}, {"dgx-a100-40gb", "a100-40gb"}, {"dgx-h100", "h100"}, {"dgx-h200", "h200"}};
  for (auto [cluster, device] : kPresets)
    if (lower(name) == cluster) {
      ClusterSpec c;
      c.device = device_preset(device);
      c.device.name = device;
      c.gpus_per_node = 8;
      c.nvlink_domain = 8;
      c.nics_per_node = 8;
      c.nic_bandwidth = c.device.inter_node_bandwidth;
      return c;
    }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> names;
  for (const auto& d : gpu_presets()) names.push_back(d.name);
  names.push_back("cpu");
  return names;
}

DeviceSpec device_from_gpu(const GpuProperties& p) {
  std::string upper = p.name;
  for (char& ch : upper) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  const double gib = double(p.memory_bytes) / double(int64_t{1} << 30);
  std::string preset;
  if (upper.find("H200") != std::string::npos) preset = "h200";
  else if (upper.find("H100") != std::string::npos) preset = "h100";
  else if (upper.find("A100") != std::string::npos) preset = gib > 60 ? "a100-80gb" : "a100-40gb";
  DeviceSpec d;
  if (!preset.empty()) {
    d = device_preset(preset);
  } else {
    // Dense bf16 tensor-core FLOPs per SM per clock: 1024 FMA on Ampere and
    // Ada, 2048 on Hopper (A100: 108 x 1.41 GHz x 2048 = 312 TFLOP/s; H100
    // SXM: 132 x 1.83 GHz x 4096 = 989 TFLOP/s).
    const double per_sm = p.compute_major >= 9 ? 4096 : 2048;
    d.peak_bf16_flops = double(p.sm_count) * p.clock_hz * per_sm;
    // Dense FP8 tensor-core FLOPs per SM per clock: 8192 on Hopper (twice
    // its bf16: H100 SXM 132 x 1.83 GHz x 8192 = 1979 TFLOP/s), 2048 on Ada
    // (L40S datasheet: 733 dense FP8 TFLOP/s from 142 SMs at 2.52 GHz);
    // none before sm_89.
    const int64_t arch = p.compute_major * 10 + p.compute_minor;
    const double fp8_per_sm = arch >= 90 ? 8192 : arch >= 89 ? 2048 : 0;
    d.peak_fp8_flops = double(p.sm_count) * p.clock_hz * fp8_per_sm;
    d.peak_fp32_flops = double(p.sm_count) * p.clock_hz * (p.compute_major >= 9 ? 256 : 128);
    d.memory_bandwidth = 2.0 * p.memory_clock_hz * p.memory_bus_bits / 8.0;
    d.intra_node_bandwidth = 25e9;  // PCIe 4 x16 without NVLink, stated
    d.inter_node_bandwidth = 12.5e9;
    d.intra_node_latency = 10e-6;
    d.inter_node_latency = 20e-6;
    d.runtime_overhead_bytes = kGpuRuntimeBytes;
  }
  d.name = preset.empty() ? p.name : preset;
  d.kind = DeviceKind::gpu;
  if (p.compute_major > 0) d.sm_arch = p.compute_major * 10 + p.compute_minor;
  d.memory_bytes = p.memory_bytes;
  if (p.sm_count > 0) d.sm_count = p.sm_count;
  return d;
}

#ifndef WEFT_HAVE_CUDA_RUNTIME
std::optional<DeviceSpec> gpu_detect(int) { return std::nullopt; }
int gpu_count() { return 0; }
void gpu_select(int ordinal) {
  throw InputError(fmt::format("GPU {} cannot be used: this build has no CUDA", ordinal));
}
#endif

DeviceSpec cpu_rank_share(const DeviceSpec& machine, int64_t local_ranks, int64_t threads) {
  if (local_ranks <= 1 && threads <= 0) return machine;
  const double cores = double(std::max<int64_t>(1, machine.sm_count));
  const double ranks = double(std::max<int64_t>(1, local_ranks));
  const double fair = cores / ranks;
  const double used = threads > 0 ? std::min(double(threads), fair) : fair;
  DeviceSpec d = machine;
  d.peak_fp32_flops = machine.peak_fp32_flops * used / cores;
  d.peak_bf16_flops = machine.peak_bf16_flops * used / cores;
  d.peak_fp8_flops = machine.peak_fp8_flops * used / cores;
  d.sm_count = std::max<int64_t>(1, int64_t(std::lround(used)));
  d.memory_bytes = int64_t(double(machine.memory_bytes) / ranks);
  d.memory_bandwidth = machine.memory_bandwidth / ranks;
  return d;
}

DeviceSpec device_detect_cpu() {
  DeviceSpec d;
  d.name = "cpu";
  d.kind = DeviceKind::cpu;
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  // Peak = cores x clock x fp32 FLOPs per cycle: two FMA units of 8 (AVX2) or
  // 16 (AVX-512) lanes. The clock is read from /proc/cpuinfo when present.
  double mhz = 2500.0;
  int lanes = 4;
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) mhz = std::max(1.0, std::stod(line.substr(colon + 1)));
    }
    if (line.rfind("flags", 0) == 0) {
      if (line.find(" avx512f") != std::string::npos) lanes = 16;
      else if (line.find(" avx2") != std::string::npos) lanes = 8;
    }
  }
  d.sm_count = cores;
  d.peak_fp32_flops = double(cores) * mhz * 1e6 * 2.0 /*FMA units*/ * lanes * 2.0 /*mul+add*/;
  d.peak_bf16_flops = d.peak_fp32_flops;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  d.memory_bytes = pages > 0 && page > 0 ? int64_t(pages) * page : int64_t{8} << 30;
  d.memory_bandwidth = 20 * GB;       // one DDR channel pair, stated
  d.intra_node_bandwidth = 5 * GB;    // shared-memory MPI transport, stated
  d.inter_node_bandwidth = 1 * GB;
  d.intra_node_latency = 2e-6;
  d.inter_node_latency = 20e-6;
  d.runtime_overhead_bytes = 0;
  d.default_gpus_per_node = cores;
  return d;
}

DeviceSpec device_preset(const std::string& name) {
  std::string key = lower(name);
  if (key == "h100-sxm" || key == "h100-80gb") key = "h100";
  if (key == "h200-sxm" || key == "h200-141gb") key = "h200";
  if (key == "cpu") return device_detect_cpu();
  for (const auto& d : gpu_presets())
    if (d.name == key) return d;
  throw InputError(fmt::format("unknown device '{}'; valid devices: {}; clusters: {} (or a cluster JSON file)",
                               name, fmt::join(device_preset_names(), ", "),
                               fmt::join(cluster_preset_names(), ", ")));
}

void to_json(nlohmann::json& j, const DeviceSpec& d) {
  j = nlohmann::json{{"name", d.name},
                     {"kind", d.kind == DeviceKind::cpu ? "cpu" : "gpu"},
                     {"memory_bytes", d.memory_bytes},
                     {"peak_bf16_flops", d.peak_bf16_flops},
                     {"peak_fp32_flops", d.peak_fp32_flops},
                     {"peak_fp8_flops", d.peak_fp8_flops},
                     {"sm_arch", d.sm_arch},
                     {"memory_bandwidth", d.memory_bandwidth},
                     {"intra_node_bandwidth", d.intra_node_bandwidth},
                     {"inter_node_bandwidth", d.inter_node_bandwidth},
                     {"intra_node_latency", d.intra_node_latency},
                     {"inter_node_latency", d.inter_node_latency},
                     {"sm_count", d.sm_count},
                     {"runtime_overhead_bytes", d.runtime_overhead_bytes},
                     {"default_gpus_per_node", d.default_gpus_per_node}};
}

namespace {

// The bounds a device's figures must lie in: far beyond any device (an H200
// holds 141 GB, peaks at 1e15 FLOP/s and moves 4.8e12 B/s; networks take
// microseconds), so that only a typo or a unit slip (bits for bytes, ms for
// s) is refused, before it makes every layout look free or impossible.
struct Range {
  double lo, hi;
  const char* unit;
};
constexpr Range kBytes{double(int64_t{1} << 20), double(int64_t{1} << 50), "bytes"};
constexpr Range kFlops{1e6, 1e18, "FLOP/s"};
constexpr Range kBandwidth{1e6, 1e15, "bytes/s"};
constexpr Range kLatency{1e-9, 1, "seconds"};
constexpr Range kCount{1, double(int64_t{1} << 20), ""};

std::string range_text(const Range& r) {
  return fmt::format("from {:g} to {:g}{}{}", r.lo, r.hi, *r.unit ? " " : "", r.unit);
}

}  // namespace

void from_json(const nlohmann::json& j, DeviceSpec& d) {
  if (!j.is_object()) throw InputError(fmt::format("field 'device' must be a JSON object, got {}", j.dump()));
  if (j.contains("preset")) {
    if (!j["preset"].is_string())
      throw InputError(fmt::format("field 'device.preset' must be a device name, got {}", j["preset"].dump()));
    d = device_preset(j["preset"].get<std::string>());
  } else if (!j.contains("memory_bytes") || !j.contains("peak_bf16_flops")) {
    throw InputError("device: give either \"preset\": NAME or at least \"memory_bytes\" and "
                     "\"peak_bf16_flops\"");
  }
  auto num = [&](const char* key, auto& field, const Range& range) {
    if (!j.contains(key)) return;
    const auto& v = j[key];
    if (!v.is_number())
      throw InputError(fmt::format("field 'device.{}' must be a number, got {}", key, v.dump()));
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer())
        throw InputError(fmt::format("field 'device.{}' must be a whole number, got {}", key, v.dump()));
    }
    const double x = v.get<double>();
    if (!(x >= range.lo && x <= range.hi))
      throw InputError(fmt::format("field 'device.{}' is {}; it must be {}", key, v.dump(), range_text(range)));
    if constexpr (std::is_integral_v<T>) field = v.get<T>();
    else field = x;
  };
  if (j.contains("name")) {
    if (!j["name"].is_string() || j["name"].get<std::string>().empty())
      throw InputError(fmt::format("field 'device.name' must be a name, got {}", j["name"].dump()));
    d.name = j["name"].get<std::string>();
  }
  if (j.contains("kind")) {
    if (j["kind"] != "cpu" && j["kind"] != "gpu")
      throw InputError(fmt::format("field 'device.kind' must be \"gpu\" or \"cpu\", got {}", j["kind"].dump()));
    d.kind = j["kind"] == "cpu" ? DeviceKind::cpu : DeviceKind::gpu;
  }
  num("memory_bytes", d.memory_bytes, kBytes);
  num("peak_bf16_flops", d.peak_bf16_flops, kFlops);
  num("peak_fp32_flops", d.peak_fp32_flops, kFlops);
  // 0 states that the device has no FP8 tensor cores; files written before
  // the field (or without it) keep the preset's, or none.
  if (!(j.contains("peak_fp8_flops") && j["peak_fp8_flops"].is_number() && j["peak_fp8_flops"].get<double>() == 0))
    num("peak_fp8_flops", d.peak_fp8_flops, kFlops);
  else
    d.peak_fp8_flops = 0;
  if (j.contains("sm_arch")) {
    const auto& v = j["sm_arch"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000)
      throw InputError(fmt::format("field 'device.sm_arch' is {}; it must be the compute capability times 10 "
                                   "(80 for A100, 89 for Ada, 90 for H100/H200) or 0 when unknown",
                                   v.dump()));
    d.sm_arch = v.get<int64_t>();
  }
  num("memory_bandwidth", d.memory_bandwidth, kBandwidth);
  num("intra_node_bandwidth", d.intra_node_bandwidth, kBandwidth);
  num("inter_node_bandwidth", d.inter_node_bandwidth, kBandwidth);
  num("intra_node_latency", d.intra_node_latency, kLatency);
  num("inter_node_latency", d.inter_node_latency, kLatency);
  num("sm_count", d.sm_count, kCount);
  num("default_gpus_per_node", d.default_gpus_per_node, kCount);
  if (j.contains("runtime_overhead_bytes")) {
    const auto& v = j["runtime_overhead_bytes"];
    if (!v.is_number_integer() || v.get<double>() < 0 || v.get<double>() > kBytes.hi)
      throw InputError(fmt::format("field 'device.runtime_overhead_bytes' is {}; it must be a whole number "
                                   "from 0 to {:g} bytes",
                                   v.dump(), kBytes.hi));
    d.runtime_overhead_bytes = v.get<int64_t>();
  }
  if (d.name.empty()) d.name = "custom";
  if (d.peak_fp32_flops <= 0) d.peak_fp32_flops = d.peak_bf16_flops;
  for (auto [field, v] : {std::pair{"memory_bandwidth", d.memory_bandwidth},
                          {"intra_node_bandwidth", d.intra_node_bandwidth},
                          {"inter_node_bandwidth", d.inter_node_bandwidth}})
    if (v <= 0) throw InputError(fmt::format("device '{}': missing field 'device.{}'", d.name, field));
}

void to_json(nlohmann::json& j, const ClusterSpec& c) {
  j = nlohmann::json{{"device", c.device},
                     {"gpus", c.gpus},
                     {"gpus_per_node", c.gpus_per_node},
                     {"nvlink_domain", c.domain()},
                     {"nics_per_node", c.nics()},
                     {"nic_bandwidth", c.nic_bytes_per_s()}};
}

ClusterSpec cluster_resolve(const std::string& gpu, int64_t gpus, int64_t gpus_per_node) {
  ClusterSpec c;
  int64_t file_gpus = 0, file_gpn = 0;
  if (gpu.ends_with(".json")) {
    const auto j = json_read_file(gpu, "cluster file");
    if (!j.is_object() || !j.contains("device"))
      throw InputError(fmt::format("cluster file '{}': expected {{\"device\": {{...}}, \"gpus\": N, "
                                   "\"gpus_per_node\": G}}",
                                   gpu));
    try {
      c.device = j["device"].get<DeviceSpec>();
      auto count = [&](const char* key, int64_t& field) {
        if (!j.contains(key)) return;
        const auto& v = j[key];
        if (!v.is_number_integer() || v.get<int64_t>() <= 0)
          throw InputError(fmt::format("field '{}' must be a positive whole number, got {}", key, v.dump()));
        field = v.get<int64_t>();
      };
      count("gpus", file_gpus);
      count("gpus_per_node", file_gpn);
      count("nvlink_domain", c.nvlink_domain);
      count("nics_per_node", c.nics_per_node);
      if (j.contains("nic_bandwidth")) {
        const auto& v = j["nic_bandwidth"];
        if (!v.is_number() || !(v.get<double>() >= kBandwidth.lo && v.get<double>() <= kBandwidth.hi))
          throw InputError(fmt::format("field 'nic_bandwidth' is {}; it must be a number of bytes/s {} (per port, "
                                       "one direction)",
                                       v.dump(), range_text(kBandwidth)));
        c.nic_bandwidth = v.get<double>();
      }
    } catch (const nlohmann::json::exception& e) {
      throw InputError(fmt::format("cluster file '{}': {}", gpu, json_error_text(e)));
    } catch (const InputError& e) {
      throw InputError(fmt::format("cluster file '{}': {}", gpu, e.what()));
    }
  } else if (auto preset = cluster_preset(gpu)) {
    c = *preset;
  } else {
    c.device = device_preset(gpu);
  }
  c.gpus = gpus != kUnset ? gpus : (file_gpus != 0 ? file_gpus : 1);
  c.gpus_per_node = gpus_per_node != kUnset ? gpus_per_node
                    : file_gpn != 0         ? file_gpn
                                            : c.device.default_gpus_per_node;
  if (!gpu.ends_with(".json")) {
    c.validate();
    return c;
  }
  try {
    c.validate();
    // A preset's domain is its hardware's, whatever share of it a run uses;
    // a file's describes the cluster it names, which holds the domain.
    if (c.nvlink_domain > std::max(c.gpus, c.gpus_per_node))
      throw InputError(fmt::format("field 'nvlink_domain' is {}, larger than the cluster's {} devices (gpus) and its "
                                   "nodes of {} (gpus_per_node); it must be at most {} (0: one node)",
                                   c.nvlink_domain, c.gpus, c.gpus_per_node, std::max(c.gpus, c.gpus_per_node)));
  } catch (const InputError& e) {
    throw InputError(fmt::format("cluster file '{}': {}", gpu, e.what()));
  }
  return c;
}

}  // namespace weft
