// Rates measured on the devices of this machine (`weft calibrate`): how long
// the model's GEMMs, attention and streaming kernels take on one device, and
// the collectives over groups of its ranks. The cost model uses them in
// place of datasheet peaks times fitted efficiencies wherever it has them
// (tuner/cost.cpp); a DeviceSpec carries them when a measured profile is in
// use.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

// One GEMM (M x K) * (K x N), timed.
struct GemmRate {
  int64_t m = 0, n = 0, k = 0;
  double seconds = 0;
};

// A memory-bound kernel family: seconds = launch_s + bytes / bytes_per_s,
// fitted over the sizes it was timed at. bytes as the cost model counts them.
struct StreamRate {
  double launch_s = 0;
  double bytes_per_s = 0;
};

// One causal attention call, forward and backward, timed.
struct AttentionRate {
  std::string kind;  // flash | materialized | cudnn
  int64_t b = 0, h = 0, h_kv = 0, t = 0, d = 0;
  double fwd_s = 0, bwd_s = 0;
};

// A collective (all_reduce, all_gather, reduce_scatter) over `ranks` ranks of
// this machine, or point-to-point (p2p, ranks = 2): seconds = latency_s +
// bytes / bytes_per_s, fitted over message sizes. bytes: the full buffer
// (all-reduce's, all-gather's output, reduce-scatter's input), or the message.
struct CommRate {
  std::string op;
  int64_t ranks = 0;
  double latency_s = 0;
  double bytes_per_s = 0;
};

// The memory-bound kernel families the cost model prices by bytes moved, by
// the names measured profiles time them under:
// rmsnorm_fwd, rmsnorm_bwd, rmsnorm_unfused_fwd, rmsnorm_unfused_bwd, rope,
// residual, swiglu_fwd, swiglu_bwd, embedding_fwd, embedding_bwd,
// cross_entropy, adamw.
const std::vector<std::string>& stream_families();
// Bytes the model counts for one call of a family over `rows` rows of
// `width` elements of `a` bytes (for adamw: `rows` parameters whose
// gradients are `width` bytes each), and the kernel launches it takes.
struct StreamWork {
  double bytes = 0;
  int launches = 1;
};
StreamWork stream_work(std::string_view family, double rows, double width, double a);

struct MeasuredRates {
  std::vector<GemmRate> gemm;
  std::map<std::string, StreamRate> streams;  // by family: rmsnorm, rope, swiglu, ...
  std::vector<AttentionRate> attention;
  std::vector<CommRate> comm;
  // The ranks measured outnumbered the cores (ranks x threads > cores, as
  // when CPU ranks oversubscribe a small machine): each rate was measured
  // with every rank computing at once, and a rank that waits (a pipeline
  // bubble) yields its core to the others instead of leaving it idle.
  bool shared_cores = false;

  // Seconds of a GEMM: the measured shape's own time, else the nearest
  // measured shape (in log M, N, K) scaled by the FLOP ratio; nothing when no
  // GEMM was measured.
  std::optional<double> gemm_seconds(double m, double n, double k) const;
  // Seconds of a stream of `bytes` in a family, if measured.
  std::optional<double> stream_seconds(const std::string& family, double bytes) const;
  // Seconds of an attention forward or backward: the nearest measured call
  // of that kind scaled by the causal FLOP ratio (B H T^2 D).
  std::optional<double> attention_seconds(const std::string& kind, bool backward, double b, double h,
                                          double h_kv, double t, double d) const;
  // Seconds of a collective on `ranks` ranks, if that op and group size were measured.
  std::optional<double> comm_seconds(const std::string& op, int64_t ranks, double bytes) const;
};

}  // namespace weft
