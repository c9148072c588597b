// The measurements behind a measured device profile. Each runs the very
// kernels and collectives the trainer runs, through their launch protocol,
// on buffers shaped as the trainer's for the model: a profile's times are
// what a step is made of.
#include "trainer/calibrate_device.h"

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

namespace weft::trainer {

namespace {

using kernels::Acc;
using Clock = std::chrono::steady_clock;

// Buffers, launches and timing on one device, in Elem (float on the CPU,
// bf16 on a GPU).
template <typename Elem>
class Bench {
 public:
  using A = Acc<Elem>;

  Bench(const DeviceSpec& device, parallel::Comm& world, double min_seconds)
      : gpu_(device.kind == DeviceKind::gpu),
        arena_(gpu_ ? memory::device_allocator() : memory::host_allocator()),
        stream_(gpu_ ? kernels::Backend::cuda : kernels::Backend::cpu),
        world_(world),
        min_seconds_(min_seconds) {}

  kernels::Stream stream() const { return stream_.get(); }
  kernels::Backend backend() const { return stream().backend; }

  // A buffer of n elements filled with `value` (never zeros: some kernels
  // take other paths on them); freed by clear().
  template <typename T>
  T* buffer(int64_t n, double value = 0.01) {
    T* p = arena_.allocate_as<T>(memory::Category::workspace, std::max<int64_t>(n, 1), "calibration");
    held_.push_back(p);
    if constexpr (std::is_same_v<T, Elem> || std::is_same_v<T, A>)
      kernels::status_check(kernels::launch(kernels::FillParams<T>{.n = n, .value = value, .x = p}, {}, stream()), "fill");
    return p;
  }
  void clear() {
    memory::synchronize(stream());
    for (void* p : held_) arena_.release(p);
    held_.clear();
    if (workspace_) arena_.release(workspace_);
    workspace_ = nullptr;
    workspace_bytes_ = 0;
  }

  template <typename P>
  void run(const P& p, const char* op) {
    const int64_t need = kernels::workspace_bytes(p, backend());
    if (need > workspace_bytes_) {
      if (workspace_) arena_.release(workspace_);
      workspace_ = arena_.allocate(memory::Category::workspace, need, "calibration.workspace");
      workspace_bytes_ = need;
    }
    kernels::status_check(kernels::launch(p, kernels::Workspace{workspace_, workspace_bytes_}, stream()), op);
  }

  // Seconds per call of f: repeated until min_seconds passed (3 calls at
  // least) after one warm-up call, on every rank at once; the slowest rank's.
  double time(const std::function<void()>& f) {
    world_.barrier();
    f();
    memory::synchronize(stream());
    int64_t reps = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    int64_t batch = 1;
    while (reps < 3 || elapsed < min_seconds_) {
      for (int64_t i = 0; i < batch; ++i) f();
      memory::synchronize(stream());
      reps += batch;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      batch = std::min<int64_t>(batch * 2, 64);
    }
    double per_call = elapsed / double(reps);
    world_.all_reduce(&per_call, 1, parallel::ReduceOp::max);
    return per_call;
  }

 private:
  bool gpu_;
  memory::Arena arena_;
  memory::OwnedStream stream_;
  parallel::Comm& world_;
  double min_seconds_;
  std::vector<void*> held_;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
};

// The shard shapes of one tensor-parallel degree and micro-batch.
struct Shard {
  int64_t M, T, B, C, Hl, Kl, D, Fl, Vl, tp;
};

std::vector<Shard> shards(const DeviceCalibration& c) {
  const auto& m = c.model;
  std::vector<Shard> out;
  for (int64_t tp : c.tps)
    for (int64_t mb : c.mbs) {
      if (tp < 1 || mb < 1 || m.heads % tp || m.kv_heads % tp || m.intermediate % tp || m.vocab % tp) continue;
      out.push_back({mb * c.run.seq, c.run.seq, mb, m.hidden, m.heads / tp, m.kv_heads / tp, m.head_dim,
                     m.intermediate / tp, m.vocab / tp, tp});
    }
  return out;
}

template <typename Elem>
void measure_gemms(Bench<Elem>& b, const DeviceCalibration& c, MeasuredRates& r) {
  // Every linear of a block and the head, at every shard: forward (M, N, K),
  // data gradient (M, K, N) and weight gradient (N, K, M), each with the
  // transposes the trainer uses.
  std::set<std::tuple<int, int64_t, int64_t, int64_t>> seen;
  for (const Shard& s : shards(c)) {
    const int64_t qkv = (s.Hl + 2 * s.Kl) * s.D;
    for (auto [N, K] : {std::pair{qkv, s.C}, {s.C, s.Hl * s.D}, {2 * s.Fl, s.C}, {s.C, s.Fl}, {s.Vl, s.C}}) {
      const int64_t M = s.M;
      auto* x = b.template buffer<Elem>(M * K);
      auto* w = b.template buffer<Elem>(N * K);
      auto* y = b.template buffer<Elem>(M * N);
      auto* dx = b.template buffer<Elem>(M * K);
      auto* dw = b.template buffer<typename Bench<Elem>::A>(N * K);
      if (seen.insert({0, M, N, K}).second) {
        const auto p = kernels::linear_forward_gemm<Elem>(M, K, N, x, w, y);
        r.gemm.push_back({M, N, K, b.time([&] { b.run(p, "gemm"); })});
      }
      if (seen.insert({1, M, K, N}).second) {
        const auto p = kernels::linear_dgrad_gemm<Elem>(M, K, N, y, w, dx);
        r.gemm.push_back({M, K, N, b.time([&] { b.run(p, "gemm"); })});
      }
      if (seen.insert({2, N, K, M}).second) {
        const auto p = kernels::linear_wgrad_gemm<Elem>(M, K, N, y, x, dw);
        r.gemm.push_back({N, K, M, b.time([&] { b.run(p, "gemm"); })});
      }
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
      const int64_t q_n = s.B * s.T * s.Hl * s.D, kv_n = s.B * s.T * s.Kl * s.D;
      const bool mat = kind == AttentionKind::materialized;
      auto* q = b.template buffer<Elem>(q_n);
      auto* k = b.template buffer<Elem>(kv_n);
      auto* v = b.template buffer<Elem>(kv_n);
      auto* out = b.template buffer<Elem>(q_n);
      auto* lse = b.template buffer<A>(s.B * s.Hl * s.T);
      Elem* probs = mat ? b.template buffer<Elem>(s.B * s.Hl * s.T * s.T) : nullptr;
      auto* dout = b.template buffer<Elem>(q_n);
      auto* dq = b.template buffer<Elem>(q_n);
      auto* dk = b.template buffer<Elem>(kv_n);
      auto* dv = b.template buffer<Elem>(kv_n);
      const kernels::AttentionForwardParams<Elem> fwd{.kind = kind, .B = s.B, .T = s.T, .H = s.Hl, .H_kv = s.Kl,
                                                      .D = s.D, .q = q, .k = k, .v = v, .out = out, .lse = lse,
                                                      .probs = probs};
      const kernels::AttentionBackwardParams<Elem> bwd{
          .kind = kind, .B = s.B, .T = s.T, .H = s.Hl, .H_kv = s.Kl, .D = s.D, .q = q, .k = k, .v = v,
          .out = out, .lse = lse, .probs = probs, .dout = dout, .dq = dq, .dk = dk, .dv = dv};
      const double f = b.time([&] { b.run(fwd, "attention forward"); });
      const double g = b.time([&] { b.run(bwd, "attention backward"); });
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
  const double a = double(sizeof(Elem));
  std::map<std::string, std::vector<std::pair<double, double>>> points;
  auto add = [&](const char* family, double rows, double width, double seconds) {
    points[family].push_back({stream_work(family, rows, width, a).bytes, seconds});
  };
  // Each family at every shard's size and a quarter of it, so that the fit
  // sees the fixed cost of a launch apart from the bytes.
  std::set<std::pair<int64_t, int64_t>> norm_rows;
  for (const Shard& s : shards(c)) {
    for (int64_t quarter : {int64_t{1}, int64_t{4}}) {
      const int64_t M = std::max<int64_t>(1, s.M / quarter), C = s.C;
      // RMSNorm over the rows of a norm region: every token, or (sequence
      // parallelism) 1/tp of them.
      for (int64_t rows : {M, std::max<int64_t>(1, M / s.tp)}) {
        if (!norm_rows.insert({rows, C}).second) continue;
        auto* x = b.template buffer<Elem>(rows * C);
        auto* w = b.template buffer<Elem>(C, 1.0);
        auto* y = b.template buffer<Elem>(rows * C);
        auto* dx = b.template buffer<Elem>(rows * C);
        auto* rstd = b.template buffer<A>(rows, 1.0);
        auto* xhat = b.template buffer<A>(rows * C);
        auto* dw = b.template buffer<A>(C);
        const double eps = c.model.norm_eps;
        add("rmsnorm_fwd", double(rows), double(C), b.time([&] {
              b.run(kernels::RmsnormForwardParams<Elem>{.rows = rows, .C = C, .eps = eps, .x = x, .weight = w,
                                                        .y = y, .rstd = rstd},
                    "rmsnorm");
            }));
        add("rmsnorm_bwd", double(rows), double(C), b.time([&] {
              b.run(kernels::RmsnormBackwardParams<Elem>{.rows = rows, .C = C, .x = x, .weight = w, .rstd = rstd,
                                                         .dy = y, .dx = dx, .dweight = dw},
                    "rmsnorm backward");
            }));
        add("rmsnorm_unfused_fwd", double(rows), double(C), b.time([&] {
              b.run(kernels::RmsnormUnfusedForwardParams<Elem>{.rows = rows, .C = C, .eps = eps, .x = x,
                                                               .weight = w, .y = y, .rstd = rstd, .x_hat = xhat},
                    "rmsnorm unfused");
            }));
        add("rmsnorm_unfused_bwd", double(rows), double(C), b.time([&] {
              b.run(kernels::RmsnormUnfusedBackwardParams<Elem>{.rows = rows, .C = C, .x_hat = xhat,
                                                                .rstd = rstd, .weight = w, .dy = y, .dx = dx,
                                                                .dweight = dw},
                    "rmsnorm unfused backward");
            }));
        add("residual", double(rows), double(C), b.time([&] {
              b.run(kernels::AddParams<Elem>{.n = rows * C, .a = x, .b = y, .out = dx}, "add");
            }));
        b.clear();
      }
      const int64_t B = std::max<int64_t>(1, s.B / quarter), T = s.T, rows = B * T;
      {
        auto* q = b.template buffer<Elem>(rows * s.Hl * s.D);
        auto* k = b.template buffer<Elem>(rows * s.Kl * s.D);
        add("rope", double(rows), double((s.Hl + s.Kl) * s.D), b.time([&] {
              b.run(kernels::RopeParams<Elem>{.direction = kernels::RopeDirection::forward, .B = B, .T = T,
                                              .H = s.Hl, .H_kv = s.Kl, .D = s.D, .theta = c.model.rope_theta,
                                              .q = q, .k = k},
                    "rope");
            }));
        b.clear();
      }
      {
        auto* gate = b.template buffer<Elem>(rows * s.Fl);
        auto* up = b.template buffer<Elem>(rows * s.Fl);
        auto* act = b.template buffer<Elem>(rows * s.Fl);
        auto* dg = b.template buffer<Elem>(rows * s.Fl);
        auto* du = b.template buffer<Elem>(rows * s.Fl);
        add("swiglu_fwd", double(rows), double(s.Fl), b.time([&] {
              b.run(kernels::SwigluForwardParams<Elem>{.rows = rows, .F = s.Fl, .gate = gate, .up = up, .act = act},
                    "swiglu");
            }));
        add("swiglu_bwd", double(rows), double(s.Fl), b.time([&] {
              b.run(kernels::SwigluBackwardParams<Elem>{.rows = rows, .F = s.Fl, .gate = gate, .up = up,
                                                        .dact = act, .dgate = dg, .dup = du},
                    "swiglu backward");
            }));
        b.clear();
      }
      {
        // Ids spread over the vocabulary (this shard's part of it).
        auto* ids = b.template buffer<int32_t>(rows);
        std::vector<int32_t> host(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) host[size_t(i)] = int32_t((i * 7919) % c.model.vocab);
        memory::copy(ids, host.data(), rows * int64_t(sizeof(int32_t)), b.stream());
        auto* table = b.template buffer<Elem>(s.Vl * s.C);
        auto* out = b.template buffer<Elem>(rows * s.C);
        auto* dtable = b.template buffer<A>(s.Vl * s.C);
        add("embedding_fwd", double(rows), double(s.C), b.time([&] {
              b.run(kernels::EmbeddingForwardParams<Elem>{.rows = rows, .C = s.C, .V = c.model.vocab,
                                                          .vocab_start = 0, .V_local = s.Vl, .tokens = ids,
                                                          .table = table, .out = out, .ids_checked = true},
                    "embedding");
            }));
        add("embedding_bwd", double(rows), double(s.C), b.time([&] {
              b.run(kernels::EmbeddingBackwardParams<Elem>{.rows = rows, .C = s.C, .V = c.model.vocab,
                                                           .vocab_start = 0, .V_local = s.Vl, .tokens = ids,
                                                           .dout = out, .dtable = dtable, .ids_checked = true},
                    "embedding backward");
            }));
        auto* logits = b.template buffer<Elem>(rows * s.Vl);
        auto* row_max = b.template buffer<A>(rows);
        auto* sum_exp = b.template buffer<A>(rows, 1.0);
        auto* loss = b.template buffer<A>(rows);
        add("cross_entropy", double(rows), double(s.Vl), b.time([&] {
              b.run(kernels::CrossEntropyMaxParams<Elem>{.rows = rows, .V_local = s.Vl, .logits = logits,
                                                         .row_max = row_max},
                    "cross entropy max");
              b.run(kernels::CrossEntropySumExpParams<Elem>{.rows = rows, .V_local = s.Vl, .logits = logits,
                                                            .row_max = row_max, .sum_exp = sum_exp},
                    "cross entropy sum");
              b.run(kernels::CrossEntropyLossGradParams<Elem>{.rows = rows, .V = c.model.vocab, .vocab_start = 0,
                                                              .V_local = s.Vl, .logits = logits, .targets = ids,
                                                              .row_max = row_max, .sum_exp = sum_exp, .loss = loss,
                                                              .ids_checked = true},
                    "cross entropy loss");
            }));
        b.clear();
      }
    }
  }
  // AdamW over the parameters of a tensor-parallel shard of the model, and a
  // quarter of them.
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
    add("adamw", double(n), double(sizeof(A)), b.time([&] { b.run(p, "adamw"); }));
    b.clear();
  }
  for (const auto& [family, pts] : points) r.streams[family] = fit_stream(pts);
}

template <typename Elem>
void measure_comm(Bench<Elem>& b, const DeviceCalibration& c, parallel::Comm& world, const GroupsFor& groups_for,
                  MeasuredRates& r) {
  const int64_t n_world = world.size();
  std::vector<int64_t> sizes;
  for (int64_t bytes = int64_t{1} << 10; bytes <= (int64_t{1} << c.max_log2_bytes); bytes *= 4) sizes.push_back(bytes);
  auto fit = [&](const char* op, int64_t ranks, const std::vector<std::pair<double, double>>& pts) {
    const StreamRate s = fit_stream(pts);
    r.comm.push_back({op, ranks, s.launch_s, s.bytes_per_s});
  };
  for (int64_t n = 2; n <= n_world; ++n) {
    if (n_world % n != 0) continue;
    Layout l;
    l.tp = n;
    l.dp = n_world / n;
    parallel::ProcessGroups g = groups_for(l);
    parallel::Comm& tp = *g.tp;
    std::vector<std::pair<double, double>> ar, ag, rs;
    for (int64_t bytes : sizes) {
      const int64_t count = std::max<int64_t>(n, bytes / 4 / n * n);
      float* buf = b.template buffer<float>(count);
      float* out = b.template buffer<float>(count);
      auto sync = [&] { memory::synchronize(kernels::Stream{b.backend(), g.cuda_stream}); };
      ar.push_back({double(count) * 4, b.time([&] {
                      tp.all_reduce(buf, count);
                      sync();
                    })});
      ag.push_back({double(count) * 4, b.time([&] {
                      tp.all_gather(buf, out, count / n);
                      sync();
                    })});
      rs.push_back({double(count) * 4, b.time([&] {
                      tp.reduce_scatter(buf, out, count / n);
                      sync();
                    })});
      b.clear();
    }
    fit("all_reduce", n, ar);
    fit("all_gather", n, ag);
    fit("reduce_scatter", n, rs);
    if (n == 2) {
      // Point-to-point between the pairs, every pair at once: the first
      // sends, the second receives, as neighbouring pipeline stages do.
      std::vector<std::pair<double, double>> p2p;
      for (int64_t bytes : sizes) {
        const int64_t count = std::max<int64_t>(1, bytes / 4);
        float* buf = b.template buffer<float>(count);
        const int64_t me = tp.rank();
        p2p.push_back({double(count) * 4, b.time([&] {
                         if (me == 0) tp.send(buf, count, 1, 7);
                         else tp.recv(buf, count, 0, 7);
                         memory::synchronize(kernels::Stream{b.backend(), g.cuda_stream});
                       })});
        b.clear();
      }
      fit("p2p", 2, p2p);
    }
  }
}

template <typename Elem>
MeasuredRates measure(const DeviceCalibration& c, const DeviceSpec& device, parallel::Comm& world,
                      const GroupsFor& groups_for) {
  Bench<Elem> b(device, world, c.min_seconds);
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

}  // namespace weft::trainer
