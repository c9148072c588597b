#include "tuner/space.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <numeric>
#include <tuple>

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

}  // namespace

double vocab_table_blocks(const ModelSpec& m, int64_t tp) {
  const double table = double(m.padded_vocab(tp)) * double(m.hidden) / double(tp);
  const double block = double(2 * m.hidden + (2 * (m.heads / tp) + 2 * (m.kv_heads / tp)) * m.head_dim * m.hidden +
                              3 * (m.intermediate / tp) * m.hidden);
  return table / block;
}

std::vector<int64_t> pipeline_vpps(const ModelSpec& m, int64_t pp) {
  std::vector<int64_t> out;
  if (pp < 1 || m.layers + 2 < pp) return out;
  out.push_back(1);
  if (pp == 1) return out;
  const bool counted = m.layers % pp != 0;
  for (int64_t v = 2; pp * v <= m.layers + 2; ++v)
    if (m.layers % (pp * v) == 0 || (counted && (m.layers + 2) % (pp * v) == 0)) out.push_back(v);
  return out;
}

std::vector<std::vector<int64_t>> pipeline_splits(const ModelSpec& m, int64_t tp, int64_t virtual_stages) {
  const int64_t V = virtual_stages, L = m.layers;
  if (V <= 1) return {{}};
  std::vector<std::vector<int64_t>> out;
  const auto add = [&](std::vector<int64_t> s) {
    if (!s.empty() && std::all_of(s.begin(), s.end(), [&](int64_t n) { return n == s.front(); })) s.clear();
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  };
  const bool divides = L % V == 0;
  if (divides) out.push_back({});
  // The head's GEMMs are x blocks' time; moving r = round(x) layers off the
  // last stage (each stage between taking at most one more) pays where x >= 1.
  const double x = vocab_table_blocks(m, tp);
  const int64_t r = x >= 1 ? std::min<int64_t>(2, std::llround(x)) : 0;
  if (divides && r == 0) return out;
  const int64_t base = L / V;
  // The even (or evenly spread) ends; r off the last; and r off the last with
  // one off the first, which also holds the most micro-batches in flight.
  std::vector<std::pair<int64_t, int64_t>> ends = {{base, base}};
  if (r > 0) {
    ends.push_back({base, base - r});
    ends.push_back({base - 1, base - r});
  }
  if (V == 2) {
    // Both stages are ends: L split near the middle, and r layers off the last.
    for (int64_t first : {base, L - base, base + r})
      if (first >= 0 && first <= L) add({first, L - first});
    return out;
  }
  for (const auto& [first, last] : ends) {
    const int64_t rest = L - first - last, between = V - 2;
    if (first < 0 || last < 0 || rest < between) continue;
    std::vector<int64_t> s(size_t(V), rest / between);
    s.front() = first;
    s.back() = last;
    for (int64_t i = 0; i < rest % between; ++i) ++s[size_t(V - 2 - i)];
    add(std::move(s));
  }
  return out;
}

namespace {

// The splits searched, or the even one (pruned with the rule) where none is.
std::vector<std::vector<int64_t>> splits_or_even(const ModelSpec& m, int64_t tp, int64_t virtual_stages) {
  auto s = pipeline_splits(m, tp, virtual_stages);
  if (s.empty()) s.push_back({});
  return s;
}

}  // namespace

// The rule a layout breaks, as a short class for the pruning summary.
std::string rule_class(const std::string& violation) {
  const auto cut = violation.find_first_of("=<>(");
  std::string head = violation.substr(0, cut == std::string::npos ? violation.size() : cut);
  while (!head.empty() && (head.back() == ' ')) head.pop_back();
  return "invalid: " + head;
}

Layout Subspace::at(int64_t i) const {
  Layout l = shape;
  const auto take = [&i](size_t n) {
    const size_t k = size_t(i % int64_t(n));
    i /= int64_t(n);
    return k;
  };
  l.grad = grads[take(grads.size())];
  zeros[take(zeros.size())].apply(l);
  l.norm = norms[take(norms.size())];
  l.attention = attentions[take(attentions.size())];
  const auto& [ckpt, k] = ckpts[take(ckpts.size())];
  l.ckpt = ckpt;
  l.ckpt_layers = k;
  return l;
}

std::vector<Subspace> enumerate_subspaces(const ModelSpec& m, const RunSpec& run, int64_t world,
                                          const SpaceLimits& limits, SpaceDevice device) {
  // The vocabulary is padded for any tp (ModelSpec::padded_vocab).
  const int64_t model_tp = std::gcd(std::gcd(m.heads, m.kv_heads), m.intermediate);
  std::vector<int64_t> tps;
  for (int64_t d : divisors(world))
    if (model_tp % d == 0) tps.push_back(d);
  std::vector<AttentionKind> attns = {AttentionKind::flash, AttentionKind::materialized};
  if (device.kind == DeviceKind::gpu) attns.push_back(AttentionKind::cudnn);
  std::vector<std::pair<Fp8Recipe, int64_t>> fp8s = {{Fp8Recipe::off, 0}};
  // An MoE model's FP8 layouts only when pinned (--fp8): the GPU trainer
  // does not run them yet (check_trainable), and they double the space.
  if (device.fp8 && !m.moe.enabled()) fp8s.push_back({Fp8Recipe::tensorwise, 0});
  fp8s = pick(limits.fp8, fp8s);
  attns = pick(limits.attention, attns);
  std::vector<GradPrecision> grads = {GradPrecision::fp32};
  if (run.precision == Precision::bf16) grads.push_back(GradPrecision::bf16);
  grads = pick(limits.grad, grads);
  const std::vector<NormKind> norms = pick(limits.norm, {NormKind::fused, NormKind::unfused});
  // The grids (tp, cp and its transport, pp), in the space's order.
  std::vector<std::tuple<int64_t, int64_t, CpComm, int64_t>> grids;
  for (int64_t tp : pick(limits.tp, tps)) {
    if (tp <= 0 || world % tp != 0) continue;
    // cp 1 always; more where T cuts into 2*cp equal chunks (a pinned cp
    // that does not is kept, and pruned with the rule).
    std::vector<int64_t> cps;
    for (int64_t d : divisors(world / tp))
      if (d == 1 || run.seq % (2 * d) == 0) cps.push_back(d);
    for (int64_t cp : pick(limits.cp, cps)) {
      if (cp <= 0 || (world / tp) % cp != 0) continue;
      const std::vector<CpComm> comms =
          cp == 1 ? std::vector<CpComm>{CpComm::ring}
                  : pick(limits.cp_comm, {CpComm::ring, CpComm::allgather, CpComm::a2a});
      for (CpComm comm : comms) {
        std::vector<int64_t> pps;
        for (int64_t d : divisors(world / (tp * cp)))
          if (!pipeline_vpps(m, d).empty()) pps.push_back(d);
        for (int64_t pp : pick(limits.pp, pps)) {
          if (pp <= 0 || (world / (tp * cp)) % pp != 0) continue;
          grids.push_back({tp, cp, comm, pp});
        }
      }
    }
  }
  // Each grid's subspaces on every core, then in the grids' order, each
  // subspace's first index after all before it.
  std::vector<std::vector<Subspace>> of_grid(grids.size());
  std::exception_ptr failed;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t gi = 0; gi < grids.size(); ++gi) try {
    // (Named variables, not a structured binding: the lambdas below capture them.)
    const int64_t tp = std::get<0>(grids[gi]), cp = std::get<1>(grids[gi]), pp = std::get<3>(grids[gi]);
    const CpComm comm = std::get<2>(grids[gi]);
    std::vector<Subspace>& out = of_grid[gi];
    int64_t first = 0;
    {
      {
        {
          const int64_t dp = world / (tp * cp * pp);
          std::vector<int64_t> mbs;
          for (int64_t mb = 1; mb <= limits.max_mb && run.global_batch % (mb * dp) == 0; mb *= 2)
            mbs.push_back(mb);
          // (A pinned pp past L + 2 is kept, and pruned with the rule.)
          std::vector<int64_t> vpps = pipeline_vpps(m, pp);
          if (vpps.empty()) vpps = {1};
          std::vector<bool> sps = {false};
          if (tp > 1) sps.push_back(true);
          // ZeRO shards over the dp x cp ranks a gradient sums over; ZeRO-3
          // also (hybrid sharding: HSDP, MiCS, ZeRO++'s hpZ) within the
          // group of them that fills one NVLink domain with its tp ranks,
          // which keeps its per-layer gathers and reduce-scatters on the
          // fast link. A smaller group is dominated (it holds more and
          // all-reduces more over the network, its gathers on the same
          // link); larger groups, and ZeRO-1 and -2 in groups, are searched
          // when pinned (--zero-group), which keeps the spaces users page
          // through within 1.25 times their size without it. A pinned
          // group of all of them is plain ZeRO; one that does not divide
          // is kept, and pruned with the rule.
          // Expert parallelism (MoE models) folds over the dp x cp ranks:
          // each degree that divides them and the routed experts, its ep
          // group (tp * ep consecutive ranks) within one NVLink domain on a
          // GPU cluster (a soft rule: its all-to-alls every MoE layer would
          // cross the network; past it only when pinned). A pinned degree
          // that does not divide is kept, and pruned with the rule.
          std::vector<int64_t> eps = {1};
          if (m.moe.enabled())
            for (int64_t d : divisors(dp * cp))
              if (d > 1 && m.moe.experts % d == 0 && (device.domain <= 0 || tp * d <= device.domain))
                eps.push_back(d);
          eps = pick(limits.ep, eps);
          // Folded over tp (Megatron's grid at an expert tp degree of 1,
          // under sp): ep = tp x d for each d of dp x cp (d = 1 too) whose
          // ep divides the experts, the same ep group span (tp x d
          // consecutive ranks) within the domain; a pinned ep is folded
          // where tp divides it and ep / tp divides dp x cp.
          std::vector<std::pair<int64_t, bool>> ep_grids;
          const bool fold_free = limits.ep_fold.empty() ||
                                 std::find(limits.ep_fold.begin(), limits.ep_fold.end(), true) != limits.ep_fold.end();
          const bool unfolded = limits.ep_fold.empty() ||
                                std::find(limits.ep_fold.begin(), limits.ep_fold.end(), false) != limits.ep_fold.end();
          for (int64_t ep : eps)
            if (unfolded) ep_grids.push_back({ep, false});
          if (m.moe.enabled() && tp > 1 && fold_free) {
            std::vector<int64_t> folds;
            for (int64_t d : divisors(dp * cp))
              if (m.moe.experts % (tp * d) == 0 && (device.domain <= 0 || tp * d <= device.domain))
                folds.push_back(tp * d);
            if (!limits.ep.empty()) {
              folds.clear();
              for (int64_t ep : limits.ep)
                if (ep > 1 && ep % tp == 0 && (dp * cp) % (ep / tp) == 0) folds.push_back(ep);
            }
            for (int64_t ep : folds) ep_grids.push_back({ep, true});
          }
          // Under expert parallelism ZeRO shards over the expert
          // data-parallel group (dp x cp / ep ranks, folded / (ep / tp)),
          // and takes no shard group of its own. Where that group is one
          // rank, ZeRO-1 still splits the dense state over the ep replicas
          // (memory/dense_split.h); ZeRO-2 and -3 add nothing to it there.
          const auto zeros_of = [&](int64_t ep, bool fold) {
            const int64_t over = fold ? ep / tp : ep;
            const int64_t ways = ep > 1 && (dp * cp) % over == 0 ? dp * cp / over : dp * cp;
            std::vector<int64_t> stages = {0};
            if (ways > 1)
              stages = {0, 1, 2, 3};
            else if (ep > 1 && over > 1)
              stages = {0, 1};
            std::vector<int64_t> groups = {0};
            if (const int64_t g = device.domain > 0 && device.domain % tp == 0 ? device.domain / tp : 0;
                ep == 1 && g > 1 && g < dp * cp && (dp * cp) % g == 0)
              groups.push_back(g);
            const bool pinned = !limits.zero_group.empty();
            groups = pick(limits.zero_group, groups);
            std::vector<ZeroChoice> zeros;
            for (int64_t z : pick(limits.zero, stages))
              for (int64_t g : groups) {
                const ZeroChoice c{z, g == dp * cp ? 0 : g};
                const bool searched = c.group == 0 || z == 3 || (pinned && z > 0);
                if (searched && std::find(zeros.begin(), zeros.end(), c) == zeros.end()) zeros.push_back(c);
              }
            return zeros;
          };
          const int64_t stage = m.layers / pp;
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
          // The lists the loops below take, each built once per grid (not
          // once per subspace): per vpp its splits and checkpointing choices.
          const std::vector<int64_t> picked_mbs = pick(limits.mb, mbs), picked_vpps = pick(limits.vpp, vpps);
          const std::vector<bool> picked_sps = pick(limits.sp, sps);
          // The experts whole on every tp rank, or (MoE models, tp > 1)
          // split over them.
          const std::vector<int64_t> etps =
              pick(limits.etp, m.moe.enabled() && tp > 1 ? std::vector<int64_t>{1, tp} : std::vector<int64_t>{1});
          std::vector<std::vector<std::vector<int64_t>>> splits_of(picked_vpps.size());
          std::vector<std::vector<std::pair<Checkpointing, int64_t>>> ckpts_of(picked_vpps.size());
          for (size_t v = 0; v < picked_vpps.size() && !picked_mbs.empty() && !ep_grids.empty(); ++v) {
            const int64_t vpp = picked_vpps[v];
            splits_of[v] = pick(limits.split, splits_or_even(m, tp, pp * vpp));
            // Partial checkpointing splits evenly over the chunks of a stage.
            for (const auto& [ckpt, k] : ckpts)
              if (!(vpp > 1 && k % vpp != 0 && limits.ckpt_layers.empty())) ckpts_of[v].push_back({ckpt, k});
          }
          for (const auto& [ep, fold] : ep_grids) {
          const std::vector<ZeroChoice> zeros = zeros_of(ep, fold);
          // The all-gather dispatcher moves ep x the routed rows where the
          // all-to-all moves (ep - 1) / ep of them: searched at ep 2, where it
          // costs at most four times as much and needs no per-peer counts
          // (Megatron's advice: small ep); past it only when pinned.
          for (MoeDispatch dispatch : ep == 1 ? std::vector<MoeDispatch>{MoeDispatch::a2a}
                                      : ep == 2 ? pick(limits.dispatch, {MoeDispatch::a2a, MoeDispatch::allgather})
                                                : pick(limits.dispatch, {MoeDispatch::a2a}))
          for (int64_t mb : picked_mbs)
            for (size_t v = 0; v < picked_vpps.size(); ++v)
              for (const auto& split : splits_of[v])
              for (bool sp : picked_sps)
              for (int64_t etp : etps)
                for (const auto& [fp8, fp8_bf16] : fp8s) {
                  const int64_t vpp = picked_vpps[v];
                  if (fold && (!sp || etp != 1)) continue;  // (epfold: sp, etp1)
                  Subspace s;
                  s.shape.split = split;
                  s.shape.tp = tp;
                  s.shape.cp = cp;
                  s.shape.cp_comm = comm;
                  s.shape.pp = pp;
                  s.shape.dp = dp;
                  s.shape.ep = ep;
                  s.shape.ep_fold = fold;
                  s.shape.dispatch = dispatch;
                  s.shape.etp = etp;
                  s.shape.capacity_factor = m.moe.capacity_factor;
                  s.shape.mb = mb;
                  s.shape.vpp = vpp;
                  s.shape.sp = sp;
                  s.shape.fp8 = fp8;
                  s.shape.fp8_bf16_layers = fp8_bf16;
                  s.ckpts = ckpts_of[v];
                  s.attentions = attns;
                  s.norms = norms;
                  s.zeros = zeros;
                  s.grads = grads;
                  s.first = first;
                  first += s.size();
                  if (s.size() > 0) out.push_back(std::move(s));
                }
          }
        }
      }
    }
  } catch (...) {
#pragma omp critical(weft_space_failed)
    if (!failed) failed = std::current_exception();
  }
  if (failed) std::rethrow_exception(failed);
  std::vector<Subspace> out;
  {
    size_t total = 0;
    for (const auto& v : of_grid) total += v.size();
    out.reserve(total);
    int64_t at = 0;
    for (auto& v : of_grid) {
      int64_t size = 0;
      for (Subspace& s : v) {
        s.first += at;
        size += s.size();
        out.push_back(std::move(s));
      }
      at += size;
    }
  }
  // An MoE model's capacity factors (the model's own where none is listed):
  // the space once for each, in the order listed.
  if (m.moe.enabled() && !limits.capacity.empty() &&
      !(limits.capacity.size() == 1 && limits.capacity[0] == m.moe.capacity_factor)) {
    std::vector<Subspace> all;
    all.reserve(out.size() * limits.capacity.size());
    int64_t at = 0;
    for (double capacity : limits.capacity)
      for (const Subspace& s : out) {
        all.push_back(s);
        all.back().shape.capacity_factor = capacity;
        all.back().first = at;
        at += s.size();
      }
    out = std::move(all);
  }
  return out;
}

std::vector<Layout> enumerate(const ModelSpec& m, const RunSpec& run, int64_t world,
                              const SpaceLimits& limits, SpaceDevice device) {
  std::vector<Layout> out;
  for (const Subspace& s : enumerate_subspaces(m, run, world, limits, device))
    for (int64_t i = 0; i < s.size(); ++i) out.push_back(s.at(i));
  return out;
}

Candidate evaluate_one(const ModelSpec& m, const RunSpec& run, const ClusterSpec& cluster, const Layout& l,
                       const CostConstants& k, const memory::MemoryOptions& mem) {
  // A layout of another capacity factor than the model's (a searched one)
  // is judged with the model dropping at it.
  if (m.moe.enabled() && l.capacity_factor != m.moe.capacity_factor)
    return evaluate_one(model_for(m, l), run, cluster, l, k, mem);
  Candidate c;
  c.layout = l;
  try {
    auto bad = l.violations(m, run, cluster.gpus);
    if (auto f8 = fp8_on_device(l, cluster.device); !f8.empty()) bad.insert(bad.begin(), f8);
    if (auto none = memory::fp8_runs_none(m, run, l); !none.empty()) bad.push_back(none);
    if (l.attention == AttentionKind::cudnn && cluster.device.kind != DeviceKind::gpu)
      bad.push_back(cudnn_on_cpu(cluster.device));
    if (!bad.empty()) {
      c.verdict = Verdict::invalid;
      c.reason = bad.front();
      c.prune_class = rule_class(bad.front());
      return c;
    }
    c.memory = memory::estimate(m, run, l, cluster.device, mem);
    c.cost = predict(m, run, l, cluster, k);
    if (c.memory.fits) {
      c.verdict = Verdict::fits;
    } else {
      c.verdict = Verdict::out_of_memory;
      c.reason = c.memory.reason;
      c.prune_class = std::string("oom: ") + memory::to_string(c.memory.binding);
    }
  } catch (const InputError& e) {
    // Sizes past 64 bits or past the schedule's limit: this layout cannot be, others may.
    c = Candidate{};
    c.layout = l;
    c.verdict = Verdict::invalid;
    c.reason = e.what();
    c.prune_class = "size";
  }
  return c;
}

std::string fp8_on_device(const Layout& l, const DeviceSpec& device) {
  if (l.fp8 == Fp8Recipe::off) return "";
  const std::string why = fp8_unsupported_reason(device);
  return why.empty() ? why : fmt::format("{}: {}", gemm_precision_text(l), why);
}

std::string cudnn_on_cpu(const DeviceSpec& device) {
  return fmt::format("attention cudnn needs a GPU (device {} is a CPU)", device.name);
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
    r.candidates[i] = evaluate_one(m, run, cluster, layouts[i], k, mem);
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
  r.visited = r.evaluated;
  for (const auto& c : r.candidates) {
    if (c.verdict == Verdict::fits) ++r.fitting;
    else ++r.pruned[c.prune_class];
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace weft::tuner
