#include "tuner/space.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::tuner {

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::fits: return "fits";
    case Verdict::out_of_memory: return "oom";
    case Verdict::invalid: return "invalid";
  }
  return "?";
}

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

template <class T>
std::vector<T> pick(const std::vector<T>& pinned, std::vector<T> free) {
  return pinned.empty() ? free : pinned;
}

// The rule a layout breaks, as a short class for the pruning summary.
std::string rule_class(const std::string& violation) {
  const auto cut = violation.find_first_of("=<>(");
  std::string head = violation.substr(0, cut == std::string::npos ? violation.size() : cut);
  while (!head.empty() && (head.back() == ' ')) head.pop_back();
  return "invalid: " + head;
}

}  // namespace

std::vector<Layout> enumerate(const ModelSpec& m, const RunSpec& run, int64_t world,
                              const SpaceLimits& limits, DeviceKind device) {
  const int64_t model_tp = std::gcd(std::gcd(m.heads, m.kv_heads), std::gcd(m.vocab, m.intermediate));
  std::vector<int64_t> tps;
  for (int64_t d : divisors(world))
    if (model_tp % d == 0) tps.push_back(d);
  std::vector<AttentionKind> attns = {AttentionKind::flash, AttentionKind::materialized};
  if (device == DeviceKind::gpu) attns.push_back(AttentionKind::cudnn);
  attns = pick(limits.attention, attns);
  std::vector<GradPrecision> grads = {GradPrecision::fp32};
  if (run.precision == Precision::bf16) grads.push_back(GradPrecision::bf16);
  grads = pick(limits.grad, grads);
  std::vector<Layout> out;
  for (int64_t tp : pick(limits.tp, tps)) {
    if (tp <= 0 || world % tp != 0) continue;
    std::vector<int64_t> pps;
    for (int64_t d : divisors(world / tp))
      if (m.layers % d == 0) pps.push_back(d);
    for (int64_t pp : pick(limits.pp, pps)) {
      if (pp <= 0 || (world / tp) % pp != 0) continue;
      const int64_t dp = world / (tp * pp);
      std::vector<int64_t> mbs;
      for (int64_t mb = 1; mb <= limits.max_mb && run.global_batch % (mb * dp) == 0; mb *= 2)
        mbs.push_back(mb);
      std::vector<int64_t> vpps = {1};
      if (pp > 1 && m.layers % pp == 0)
        for (int64_t d : divisors(m.layers / pp))
          if (d > 1) vpps.push_back(d);
      std::vector<bool> sps = {false};
      if (tp > 1) sps.push_back(true);
      std::vector<int64_t> zeros = {0};
      if (dp > 1) zeros = {0, 1, 2, 3};
      const int64_t stage = m.layers % pp == 0 ? m.layers / pp : 0;
      std::vector<std::pair<Checkpointing, int64_t>> ckpts;
      for (Checkpointing c : pick(limits.ckpt, {Checkpointing::none, Checkpointing::selective,
                                                Checkpointing::ffn, Checkpointing::full})) {
        if (!limits.ckpt_layers.empty() && c != Checkpointing::none) {
          for (int64_t k : limits.ckpt_layers) ckpts.push_back({c, k});
          continue;
        }
        ckpts.push_back({c, 0});
        if (c == Checkpointing::full && limits.ckpt_layers.empty()) {
          std::vector<int64_t> ks;
          for (int64_t q : {1, 2, 3}) {
            const int64_t k = stage * q / 4;
            if (k > 0 && k < stage && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
          }
          for (int64_t k : ks) ckpts.push_back({c, k});
        }
      }
      for (int64_t mb : pick(limits.mb, mbs))
        for (int64_t vpp : pick(limits.vpp, vpps))
          for (bool sp : pick(limits.sp, sps))
            for (auto [ckpt, k] : ckpts) {
              // Partial checkpointing splits evenly over the chunks of a stage.
              if (vpp > 1 && k % vpp != 0 && limits.ckpt_layers.empty()) continue;
              for (AttentionKind attn : attns)
                for (NormKind norm : pick(limits.norm, {NormKind::fused, NormKind::unfused}))
                  for (int64_t zero : pick(limits.zero, zeros))
                    for (GradPrecision grad : grads) {
                    Layout l;
                    l.tp = tp;
                    l.pp = pp;
                    l.dp = dp;
                    l.mb = mb;
                    l.vpp = vpp;
                    l.sp = sp;
                    l.ckpt = ckpt;
                    l.ckpt_layers = k;
                    l.attention = attn;
                    l.norm = norm;
                    l.zero = zero;
                    l.grad = grad;
                    out.push_back(l);
                  }
            }
    }
  }
  return out;
}

SpaceReport evaluate(const ModelSpec& m, const RunSpec& run, const ClusterSpec& cluster,
                     const std::vector<Layout>& layouts, const CostConstants& k,
                     const memory::MemoryOptions& mem, double tie) {
  const auto t0 = std::chrono::steady_clock::now();
  SpaceReport r;
  r.candidates.resize(layouts.size());
  // Each layout is independent: the full space of a large model on a large
  // cluster is hundreds of thousands of them, evaluated on every core.
  // An exception may not leave an OpenMP loop: the first one is kept and
  // thrown after it.
  std::exception_ptr failed;
#pragma omp parallel for schedule(dynamic, 256)
  for (size_t i = 0; i < layouts.size(); ++i) try {
    const Layout& l = layouts[i];
    Candidate& c = r.candidates[i];
    c.layout = l;
    auto bad = l.violations(m, run, cluster.gpus);
    if (l.attention == AttentionKind::cudnn && cluster.device.kind != DeviceKind::gpu)
      bad.push_back(fmt::format("attention cudnn needs a GPU (device {} is a CPU)", cluster.device.name));
    if (!bad.empty()) {
      c.verdict = Verdict::invalid;
      c.reason = bad.front();
      c.prune_class = rule_class(bad.front());
    } else {
      c.memory = memory::estimate(m, run, l, cluster.device, mem);
      c.cost = predict(m, run, l, cluster, k);
      if (c.memory.fits) {
        c.verdict = Verdict::fits;
      } else {
        c.verdict = Verdict::out_of_memory;
        c.reason = c.memory.reason;
        c.prune_class = std::string("oom: ") + memory::to_string(c.memory.binding);
      }
    }
  } catch (const InputError& e) {
    // Sizes past 64 bits or past the schedule's limit: this layout cannot be, others may.
    Candidate& c = r.candidates[i];
    c.verdict = Verdict::invalid;
    c.reason = e.what();
    c.prune_class = "size";
  } catch (...) {
#pragma omp critical(weft_space_failed)
    if (!failed) failed = std::current_exception();
  }
  if (failed) std::rethrow_exception(failed);
  // Sorted through an index: a candidate is a few hundred bytes, and moving
  // each of hundreds of thousands of them through a stable sort costs more
  // than evaluating them.
  struct Key {
    int rank;  // fits, oom, invalid
    double step;
    int64_t peak;
    uint32_t index;
  };
  std::vector<Key> keys(r.candidates.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const Candidate& c = r.candidates[i];
    const int rank = c.verdict == Verdict::fits ? 0 : c.verdict == Verdict::out_of_memory ? 1 : 2;
    // Invalid layouts keep their order: they have no step or memory.
    keys[i] = rank == 2 ? Key{2, 0, 0, uint32_t(i)} : Key{rank, c.cost.step, c.memory.peak(), uint32_t(i)};
  }
  std::stable_sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.step != b.step) return a.step < b.step;
    return a.peak < b.peak;
  });
  std::vector<uint32_t> order(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) order[i] = keys[i].index;
  // Applied in place, cycle by cycle: position i takes candidate order[i].
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == i) continue;
    Candidate held = std::move(r.candidates[i]);
    size_t j = i;
    while (order[j] != i) {
      r.candidates[j] = std::move(r.candidates[order[j]]);
      const size_t next = order[j];
      order[j] = uint32_t(j);
      j = next;
    }
    r.candidates[j] = std::move(held);
    order[j] = uint32_t(j);
  }
  if (!r.candidates.empty() && r.candidates.front().verdict == Verdict::fits) {
    const double limit = r.candidates.front().cost.step * (1.0 + tie);
    size_t best = 0;
    for (size_t i = 1; i < r.candidates.size(); ++i) {
      const auto& c = r.candidates[i];
      if (c.verdict != Verdict::fits || c.cost.step > limit) break;
      if (c.memory.peak() < r.candidates[best].memory.peak()) best = i;
    }
    std::rotate(r.candidates.begin(), r.candidates.begin() + long(best),
                r.candidates.begin() + long(best) + 1);
  }
  r.evaluated = int64_t(layouts.size());
  for (const auto& c : r.candidates) {
    if (c.verdict == Verdict::fits) ++r.fitting;
    else ++r.pruned[c.prune_class];
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace weft::tuner
