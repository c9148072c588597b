// The measurements behind a measured device profile. Each runs the very
// kernels and collectives the trainer runs, through their launch protocol,
// on buffers shaped as the trainer's for the model: a profile's times are
// what a step is made of.
#include "trainer/calibrate_device.h"

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

namespace weft::trainer {

namespace {

using kernels::Acc;
using Clock = std::chrono::steady_clock;

// The shard shapes of one tensor-parallel degree and micro-batch.
struct Shard {
  int64_t M, T, B, C, Hl, Kl, D, Fl, Vl, tp;
};

// Buffers, launches and timing on one device, in Elem (float on the CPU,
// bf16 on a GPU).
template <typename Elem>
class Bench {
 public:
  using A = Acc<Elem>;

  Bench(const DeviceSpec& device, parallel::Comm& world, double min_seconds, int64_t flush_bytes)
      : flush_bytes_(flush_bytes),
        base_flush_(flush_bytes),
        gpu_(device.kind == DeviceKind::gpu),
        arena_(gpu_ ? memory::device_allocator() : memory::host_allocator()),
        stream_(gpu_ ? kernels::Backend::cuda : kernels::Backend::cpu),
        world_(world),
        min_seconds_(min_seconds) {}

  kernels::Stream stream() const { return stream_.get(); }
  // Measurements of a shard cycle through flush_for(shard) bytes of copies
  // (at least the cache-based default).
  void set_flush(std::function<int64_t(const Shard&)> flush_for) { flush_for_ = std::move(flush_for); }
  void use_shard(const Shard& s) {
    if (flush_for_) flush_bytes_ = std::max(base_flush_, flush_for_(s));
  }
  kernels::Backend backend() const { return stream().backend; }

  // How many copies of a measurement's buffers (set_bytes together) to
  // cycle through so that each call finds its data out of the cache, as in
  // a training step, where every kernel's operands were last touched a whole
  // layer or step ago: a kernel timed on the same hot buffers again and
  // again runs 10-20% faster than it does in training.
  int copies_for(int64_t set_bytes) const {
    return int(std::clamp<int64_t>((flush_bytes_ + set_bytes - 1) / std::max<int64_t>(set_bytes, 1), 1, 64));
  }
  // `copies` buffers of n elements each (see buffer()).
  template <typename T>
  std::vector<T*> buffers(int copies, int64_t n, double value = 0.01) {
    std::vector<T*> v;
    for (int i = 0; i < copies; ++i) v.push_back(buffer<T>(n, value));
    return v;
  }
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

  // Seconds per call of f(copy): repeated over the copies until
  // min_seconds passed (3 calls at least) after a warm-up round, on every
  // rank at once; the slowest rank's.
  double time(const std::function<void(int)>& f, int copies = 1) {
    world_.barrier();
    for (int i = 0; i < copies; ++i) f(i);
    memory::synchronize(stream());
    int64_t reps = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    int64_t batch = 1;
    while (reps < 3 || elapsed < min_seconds_) {
      for (int64_t i = 0; i < batch; ++i) f(int((reps + i) % copies));
      memory::synchronize(stream());
      reps += batch;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
      batch = std::min<int64_t>(batch * 2, 64);
    }
    double per_call = elapsed / double(reps);
    world_.all_reduce(&per_call, 1, parallel::ReduceOp::max);
    return per_call;
  }

  // The same for a collective: every rank of its group must call it equally
  // often, so the count comes from the slowest rank's first call.
  double time_collective(const std::function<void()>& f) {
    world_.barrier();
    f();
    auto t0 = Clock::now();
    f();
    double first = std::chrono::duration<double>(Clock::now() - t0).count();
    world_.all_reduce(&first, 1, parallel::ReduceOp::max);
    const int64_t reps = std::clamp<int64_t>(int64_t(std::ceil(min_seconds_ / std::max(first, 1e-9))), 3, 200);
    world_.barrier();
    t0 = Clock::now();
    for (int64_t i = 0; i < reps; ++i) f();
    double per_call = std::chrono::duration<double>(Clock::now() - t0).count() / double(reps);
    world_.all_reduce(&per_call, 1, parallel::ReduceOp::max);
    return per_call;
  }

 private:
  int64_t flush_bytes_;
  int64_t base_flush_;
  std::function<int64_t(const Shard&)> flush_for_;
  bool gpu_;
  memory::Arena arena_;
  memory::OwnedStream stream_;
  parallel::Comm& world_;
  double min_seconds_;
  std::vector<void*> held_;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
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

template <typename Elem>
void measure_comm(Bench<Elem>& b, const DeviceCalibration& c, parallel::Comm& world, const GroupsFor& groups_for,
                  MeasuredRates& r) {
  const int64_t n_world = world.size();
  std::vector<int64_t> sizes;
  for (int64_t bytes = int64_t{1} << 10; bytes <= (int64_t{1} << c.max_log2_bytes); bytes *= 4) sizes.push_back(bytes);
  // Latency from the smallest message (1 KiB: all latency), bandwidth from
  // what the larger ones take beyond it (least squares through the origin):
  // a plain linear fit is ruled by the large messages and can put the
  // latency below zero, yet the small ones (a step's loss and norm) count.
  auto fit = [&](const char* op, int64_t ranks, const std::vector<std::pair<double, double>>& pts) {
    const double latency = std::max(0.0, pts.front().second);
    double bb = 0, bt = 0;
    for (auto [bytes, t] : pts) {
      bb += bytes * bytes;
      bt += bytes * std::max(t - latency, 0.0);
    }
    r.comm.push_back({op, ranks, latency, bt > 0 ? bb / bt : pts.back().first / pts.back().second});
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
      ar.push_back({double(count) * 4, b.time_collective([&] {
                      tp.all_reduce(buf, count);
                      sync();
                    })});
      ag.push_back({double(count) * 4, b.time_collective([&] {
                      tp.all_gather(buf, out, count / n);
                      sync();
                    })});
      rs.push_back({double(count) * 4, b.time_collective([&] {
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
        p2p.push_back({double(count) * 4, b.time_collective([&] {
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

}  // namespace weft::trainer
