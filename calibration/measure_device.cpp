// The measurements behind a measured device profile. Each runs the very
// kernels and collectives (measure_comm.cpp) the trainer runs, through their
// launch protocol, on buffers shaped as the trainer's for the model: a
// profile's times are what a step is made of.
#include "calibration/measure_device.h"
#include "calibration/device_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "kernels/adamw/adamw.h"
#include "kernels/attention/attention.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "memory/arena.h"
#include "memory/device.h"
#include "memory/estimate.h"

namespace weft::calibration {

namespace {

template <typename Elem>
void measure_gemms(Bench<Elem>& b, const DeviceCalibration& c, MeasuredRates& r) {
  using A = typename Bench<Elem>::A;
  // Every linear of a block and the head, at every shard: forward (M, N, K),
  // data gradient (M, K, N) and weight gradient (N, K, M), each with the
  // transposes the trainer uses.
  std::set<std::tuple<int, int64_t, int64_t, int64_t>> seen;
  for (const Shard& s : shards(c)) {
    b.use_shard(s);
    for (const auto& nk : {std::pair{s.Hl * s.D, s.C}, {s.Kl * s.D, s.C}, {s.C, s.Hl * s.D}, {s.Fl, s.C},
                           {s.C, s.Fl}, {s.Vl, s.C}}) {
      // Named, not a structured binding: clang before 16 cannot capture one in a lambda.
      const int64_t N = nk.first, K = nk.second;
      const int64_t M = s.M;
      const int64_t e = int64_t(sizeof(Elem));
      const int n = b.copies_for(e * (2 * M * K + N * K + M * N) + int64_t(sizeof(A)) * N * K);
      const auto x = b.template buffers<Elem>(n, M * K);
      const auto w = b.template buffers<Elem>(n, N * K);
      const auto y = b.template buffers<Elem>(n, M * N);
      const auto dx = b.template buffers<Elem>(n, M * K);
      const auto dw = b.template buffers<A>(n, N * K);
      if (seen.insert({0, M, N, K}).second)
        r.gemm.push_back(
            {M, N, K, b.time([&](int i) { b.run(kernels::linear_forward_gemm<Elem>(M, K, N, x[i], w[i], y[i]), "gemm"); },
                             n)});
      if (seen.insert({1, M, K, N}).second)
        r.gemm.push_back(
            {M, K, N, b.time([&](int i) { b.run(kernels::linear_dgrad_gemm<Elem>(M, K, N, y[i], w[i], dx[i]), "gemm"); },
                             n)});
      if (seen.insert({2, N, K, M}).second)
        r.gemm.push_back(
            {N, K, M, b.time([&](int i) { b.run(kernels::linear_wgrad_gemm<Elem>(M, K, N, y[i], x[i], dw[i]), "gemm"); },
                             n)});
      b.clear();
    }
  }
}

template <typename Elem>
void measure_attention(Bench<Elem>& b, const DeviceCalibration& c, MeasuredRates& r) {
  using A = typename Bench<Elem>::A;
  for (AttentionKind kind : c.attention) {
    if (!kernels::attention_available(kind, b.backend())) continue;
    for (const Shard& s : shards(c)) {
      b.use_shard(s);
      const int64_t q_n = s.B * s.T * s.Hl * s.D, kv_n = s.B * s.T * s.Kl * s.D;
      const bool mat = kind == AttentionKind::materialized;
      const int64_t probs_n = mat ? s.B * s.Hl * s.T * s.T : 0;
      const int n = b.copies_for(int64_t(sizeof(Elem)) * (4 * q_n + 4 * kv_n + probs_n) +
                                 int64_t(sizeof(A)) * s.B * s.Hl * s.T);
      const auto q = b.template buffers<Elem>(n, q_n);
      const auto k = b.template buffers<Elem>(n, kv_n);
      const auto v = b.template buffers<Elem>(n, kv_n);
      const auto out = b.template buffers<Elem>(n, q_n);
      const auto lse = b.template buffers<A>(n, s.B * s.Hl * s.T);
      const auto probs = b.template buffers<Elem>(n, probs_n);
      const auto dout = b.template buffers<Elem>(n, q_n);
      const auto dq = b.template buffers<Elem>(n, q_n);
      const auto dk = b.template buffers<Elem>(n, kv_n);
      const auto dv = b.template buffers<Elem>(n, kv_n);
      auto fwd = [&](int i) {
        return kernels::AttentionForwardParams<Elem>{.kind = kind, .B = s.B, .T = s.T, .H = s.Hl, .H_kv = s.Kl,
                                                     .D = s.D, .q = q[i], .k = k[i], .v = v[i], .out = out[i],
                                                     .lse = lse[i], .probs = mat ? probs[i] : nullptr};
      };
      auto bwd = [&](int i) {
        return kernels::AttentionBackwardParams<Elem>{
            .kind = kind, .B = s.B, .T = s.T, .H = s.Hl, .H_kv = s.Kl, .D = s.D, .q = q[i], .k = k[i], .v = v[i],
            .out = out[i], .lse = lse[i], .probs = mat ? probs[i] : nullptr, .dout = dout[i], .dq = dq[i],
            .dk = dk[i], .dv = dv[i]};
      };
      const double f = b.time([&](int i) { b.run(fwd(i), "attention forward"); }, n);
      const double g = b.time([&](int i) { b.run(bwd(i), "attention backward"); }, n);
      r.attention.push_back({to_string(kind), s.B, s.Hl, s.Kl, s.T, s.D, f, g});
      b.clear();
    }
  }
}

// launch + bytes / bandwidth through the points by least squares, with a
// non-negative launch time.
StreamRate fit_stream(const std::vector<std::pair<double, double>>& points) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = double(points.size());
  for (auto [x, y] : points) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double det = n * sxx - sx * sx;
  if (points.size() >= 2 && det > 0) {
    const double slope = (n * sxy - sx * sy) / det;
    const double launch = (sy - slope * sx) / n;
    if (slope > 0 && launch >= 0) return {launch, 1.0 / slope};
  }
  return {0.0, sx / sy};  // one size, or a negative intercept: through the origin
}

template <typename Elem>
void measure_streams(Bench<Elem>& b, const DeviceCalibration& c, MeasuredRates& r) {
  using A = typename Bench<Elem>::A;
  constexpr int64_t e = int64_t(sizeof(Elem)), f32 = int64_t(sizeof(A));
  const double a = double(e);
  std::map<std::string, std::vector<std::pair<double, double>>> points;
  auto add = [&](const char* family, double rows, double width, double seconds) {
    points[family].push_back({stream_work(family, rows, width, a).bytes, seconds});
  };
  // Each family at every shard's size and a quarter of it, so that the fit
  // sees the fixed cost of a launch apart from the bytes.
  std::set<std::pair<int64_t, int64_t>> norm_rows;
  for (const Shard& s : shards(c)) {
    b.use_shard(s);
    for (int64_t quarter : {int64_t{1}, int64_t{4}}) {
      const int64_t M = std::max<int64_t>(1, s.M / quarter), C = s.C;
      // RMSNorm over the rows of a norm region: every token, or (sequence
      // parallelism) 1/tp of them.
      for (int64_t rows : {M, std::max<int64_t>(1, M / s.tp)}) {
        if (!norm_rows.insert({rows, C}).second) continue;
        const int n = b.copies_for(rows * C * (3 * e + f32) + C * (e + f32));
        const auto x = b.template buffers<Elem>(n, rows * C);
        const auto w = b.template buffers<Elem>(n, C, 1.0);
        const auto y = b.template buffers<Elem>(n, rows * C);
        const auto dx = b.template buffers<Elem>(n, rows * C);
        const auto rstd = b.template buffers<A>(n, rows, 1.0);
        const auto xhat = b.template buffers<A>(n, rows * C);
        const auto dw = b.template buffers<A>(n, C);
        const double eps = c.model.norm_eps;
        const double R = double(rows), W = double(C);
        add("rmsnorm_fwd", R, W, b.time([&](int i) {
              b.run(kernels::RmsnormForwardParams<Elem>{.rows = rows, .C = C, .eps = eps, .x = x[i], .weight = w[i],
                                                        .y = y[i], .rstd = rstd[i]},
                    "rmsnorm");
            }, n));
        add("rmsnorm_bwd", R, W, b.time([&](int i) {
              b.run(kernels::RmsnormBackwardParams<Elem>{.rows = rows, .C = C, .x = x[i], .weight = w[i],
                                                         .rstd = rstd[i], .dy = y[i], .dx = dx[i], .dweight = dw[i]},
                    "rmsnorm backward");
            }, n));
        add("rmsnorm_unfused_fwd", R, W, b.time([&](int i) {
              b.run(kernels::RmsnormUnfusedForwardParams<Elem>{.rows = rows, .C = C, .eps = eps, .x = x[i],
                                                               .weight = w[i], .y = y[i], .rstd = rstd[i],
                                                               .x_hat = xhat[i]},
                    "rmsnorm unfused");
            }, n));
        add("rmsnorm_unfused_bwd", R, W, b.time([&](int i) {
              b.run(kernels::RmsnormUnfusedBackwardParams<Elem>{.rows = rows, .C = C, .x_hat = xhat[i],
                                                                .rstd = rstd[i], .weight = w[i], .dy = y[i],
                                                                .dx = dx[i], .dweight = dw[i]},
                    "rmsnorm unfused backward");
            }, n));
        add("residual", R, W, b.time([&](int i) {
              b.run(kernels::AddParams<Elem>{.n = rows * C, .a = x[i], .b = y[i], .out = dx[i]}, "add");
            }, n));
        b.clear();
      }
      const int64_t B = std::max<int64_t>(1, s.B / quarter), T = s.T, rows = B * T;
      {
        const int n = b.copies_for(e * rows * (s.Hl + s.Kl) * s.D);
        const auto q = b.template buffers<Elem>(n, rows * s.Hl * s.D);
        const auto k = b.template buffers<Elem>(n, rows * s.Kl * s.D);
        add("rope", double(rows), double((s.Hl + s.Kl) * s.D), b.time([&](int i) {
              b.run(kernels::RopeParams<Elem>{.direction = kernels::RopeDirection::forward, .B = B, .T = T,
                                              .H = s.Hl, .H_kv = s.Kl, .D = s.D, .theta = c.model.rope_theta,
                                              .scaling = c.model.rope_scaling, .q = q[i], .k = k[i]},
                    "rope");
            }, n));
        b.clear();
      }
      {
        const int n = b.copies_for(5 * e * rows * s.Fl);
        const auto gate = b.template buffers<Elem>(n, rows * s.Fl);
        const auto up = b.template buffers<Elem>(n, rows * s.Fl);
        const auto act = b.template buffers<Elem>(n, rows * s.Fl);
        const auto dg = b.template buffers<Elem>(n, rows * s.Fl);
        const auto du = b.template buffers<Elem>(n, rows * s.Fl);
        add("swiglu_fwd", double(rows), double(s.Fl), b.time([&](int i) {
              b.run(kernels::SwigluForwardParams<Elem>{.rows = rows, .F = s.Fl, .gate = gate[i], .up = up[i],
                                                       .act = act[i]},
                    "swiglu");
            }, n));
        add("swiglu_bwd", double(rows), double(s.Fl), b.time([&](int i) {
              b.run(kernels::SwigluBackwardParams<Elem>{.rows = rows, .F = s.Fl, .gate = gate[i], .up = up[i],
                                                        .dact = act[i], .dgate = dg[i], .dup = du[i]},
                    "swiglu backward");
            }, n));
        b.clear();
      }
      {
        // Ids spread over the vocabulary (this shard's part of it).
        auto* ids = b.template buffer<int32_t>(rows);
        std::vector<int32_t> host(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) host[size_t(i)] = int32_t((i * 7919) % c.model.vocab);
        memory::copy(ids, host.data(), rows * int64_t(sizeof(int32_t)), b.stream());
        const int n = b.copies_for(s.Vl * s.C * (e + f32) + rows * s.C * e + rows * s.Vl * e);
        const auto table = b.template buffers<Elem>(n, s.Vl * s.C);
        const auto out = b.template buffers<Elem>(n, rows * s.C);
        const auto dtable = b.template buffers<A>(n, s.Vl * s.C);
        add("embedding_fwd", double(rows), double(s.C), b.time([&](int i) {
              b.run(kernels::EmbeddingForwardParams<Elem>{.rows = rows, .C = s.C, .V = c.model.vocab,
                                                          .vocab_start = 0, .V_local = s.Vl, .tokens = ids,
                                                          .table = table[i], .out = out[i], .ids_checked = true},
                    "embedding");
            }, n));
        add("embedding_bwd", double(rows), double(s.C), b.time([&](int i) {
              b.run(kernels::EmbeddingBackwardParams<Elem>{.rows = rows, .C = s.C, .V = c.model.vocab,
                                                           .vocab_start = 0, .V_local = s.Vl, .tokens = ids,
                                                           .dout = out[i], .dtable = dtable[i], .ids_checked = true},
                    "embedding backward");
            }, n));
        const auto logits = b.template buffers<Elem>(n, rows * s.Vl);
        auto* row_max = b.template buffer<A>(rows);
        auto* sum_exp = b.template buffer<A>(rows, 1.0);
        auto* loss = b.template buffer<A>(rows);
        add("cross_entropy", double(rows), double(s.Vl), b.time([&](int i) {
              b.run(kernels::CrossEntropyMaxParams<Elem>{.rows = rows, .V_local = s.Vl, .logits = logits[i],
                                                         .row_max = row_max},
                    "cross entropy max");
              b.run(kernels::CrossEntropySumExpParams<Elem>{.rows = rows, .V_local = s.Vl, .logits = logits[i],
                                                            .row_max = row_max, .sum_exp = sum_exp},
                    "cross entropy sum");
              b.run(kernels::CrossEntropyLossGradParams<Elem>{.rows = rows, .V = c.model.vocab, .vocab_start = 0,
                                                              .V_local = s.Vl, .logits = logits[i], .targets = ids,
                                                              .row_max = row_max, .sum_exp = sum_exp, .loss = loss,
                                                              .ids_checked = true},
                    "cross entropy loss");
            }, n));
        b.clear();
      }
    }
  }
  // AdamW over the parameters of a tensor-parallel shard of the model, and a
  // quarter of them (its operands are far larger than a cache: one copy).
  std::set<int64_t> sizes;
  for (int64_t tp : c.tps)
    for (int64_t quarter : {int64_t{1}, int64_t{4}})
      sizes.insert(std::max<int64_t>(1, c.model.param_count() / std::max<int64_t>(tp, 1) / quarter));
  for (int64_t n : sizes) {
    kernels::AdamwTensor<Elem> t;
    t.n = n;
    t.param = b.template buffer<Elem>(n);
    if constexpr (!std::is_same_v<Elem, A>) t.master = b.template buffer<A>(n);
    t.grad = b.template buffer<A>(n);
    t.m = b.template buffer<A>(n);
    t.v = b.template buffer<A>(n, 1e-4);
    const kernels::AdamwParams<Elem> p{.tensors = std::span<const kernels::AdamwTensor<Elem>>(&t, 1)};
    add("adamw", double(n), double(sizeof(A)), b.time([&](int) { b.run(p, "adamw"); }));
    b.clear();
  }
  for (const auto& [family, pts] : points) r.streams[family] = fit_stream(pts);
}


// What a rank touches in one training step at this shard (the memory
// model's worst stage for tp x 1 x world/tp at this micro-batch): every
// kernel of a step finds its operands where a working set of that size left
// them, in memory more than in a cache, so its measurement cycles through
// copies of its buffers as large (capped at 1 GiB). Timed on the same hot
// buffers again and again, the small model's GEMMs ran 25% faster than they
// do in training on a 2-core machine with a large shared L3.
int64_t working_set(const DeviceCalibration& c, const DeviceSpec& device, int64_t world, const Shard& s) {
  Layout l;
  l.tp = s.tp;
  l.dp = std::max<int64_t>(1, world / s.tp);
  l.mb = s.B;
  RunSpec run = c.run;
  run.global_batch = s.B * l.dp;
  if (!l.violations(c.model, run, l.tp * l.dp).empty()) return 0;
  return std::min<int64_t>(memory::estimate(c.model, run, l, device).peak(), int64_t{1} << 30);
}

// Enough to push a measurement's operands out of the caches a kernel sees
// first: a few times a core's L2 on the CPU (the last-level cache of a
// server is shared, and a training step's working set is of its size), a
// few times the L2 of a GPU.
int64_t default_flush_bytes(const DeviceSpec& device) {
  if (device.kind == DeviceKind::gpu) return int64_t{256} << 20;
  const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
  return std::max<int64_t>(int64_t{8} << 20, 4 * int64_t(l2 > 0 ? l2 : 1 << 20));
}

template <typename Elem>
MeasuredRates measure(const DeviceCalibration& c, const DeviceSpec& device, parallel::Comm& world,
                      const GroupsFor& groups_for) {
  Bench<Elem> b(device, world, c.min_seconds, c.flush_bytes > 0 ? c.flush_bytes : default_flush_bytes(device));
  if (c.flush_bytes == 0)
    b.set_flush([&](const Shard& s) { return working_set(c, device, world.size(), s); });
  MeasuredRates r;
  auto say = [&](const std::string& s) {
    if (c.progress) c.progress(s);
  };
  say("GEMMs of the model's linears");
  measure_gemms(b, c, r);
  say("attention");
  measure_attention(b, c, r);
  say("memory-bound kernels");
  measure_streams(b, c, r);
  if (world.size() > 1) {
    say("collectives and point-to-point");
    measure_comm(b, c, world, groups_for, r);
  }
  return r;
}

}  // namespace

MeasuredRates measure_device(const DeviceCalibration& c, const DeviceSpec& device, parallel::Comm& world,
                             const GroupsFor& groups_for) {
  if (device.kind == DeviceKind::gpu) return measure<kernels::bf16>(c, device, world, groups_for);
  return measure<float>(c, device, world, groups_for);
}

}  // namespace weft::calibration
