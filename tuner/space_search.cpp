// The space's search (space.h): the first rows of evaluate()'s ranking,
// found without predicting every layout. The space is walked as subspaces
// (one parallel shape, the product of the other knobs' lists):
// 1. the rules: core/layout's rules of the shape (T into 2*cp chunks, a2a's
//    heads, L % (pp*vpp), the global batch, ...) all come before those of
//    checkpointing, ZeRO and gradient precision, and the attention's
//    (ring with materialized) among them. So one layout per attention kind
//    tells the first rule every layout of the shape with that kind breaks,
//    and one per checkpointing, ZeRO and gradient choice the rule each
//    breaks on a valid shape: every layout's class without building it.
// 2. step bounds (cost.h's step_bounds): shapes are visited in the order
//    of their least bound, their layouts predicted as evaluate() does; once
//    `top` layouts fit, a shape whose bound lies past the last of them and
//    past the tie window of the fastest cannot reach the rows, nor can any
//    after it. Inside a visited shape a layout whose own step bound lies
//    past them, or whose memory bound (space_bounds.h) past the usable
//    memory, is counted under that bound without being predicted.
// 3. a memory lower bound per shape (below), taken as the shape comes up
//    for its visit: a shape above the usable memory is out of memory
//    whatever its other knobs, and is not visited. It builds the stage's
//    tensor table for each attention kind and norm, dearer than the step
//    bounds, so the shapes the step bounds rule out never take it (on 64
//    GPUs, 3 to 15 thousand of 100 to 120 thousand shapes do), and it is
//    asked only whether it lies past the usable memory, which most shapes
//    answer with a table or two.
// Every bound only drops time or bytes from what predict() and
// memory::estimate() would say, so no layout of the rows is ruled out:
// the rows are evaluate()'s (tests/unit/test_space.cpp holds them equal,
// and every bound under each layout's value).
// The rows are then predicted again one by one (evaluate_one), so that they
// carry exactly evaluate()'s numbers and reasons.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <omp.h>

#include "core/error.h"
#include "memory/shapes.h"
#include "tuner/space.h"
#include "tuner/space_bounds.h"
#include "tuner/space_rules.h"

namespace weft::tuner {

namespace {

// The classes of layouts the bounds rule out unvisited.
constexpr const char* kMemoryBound = "oom: memory lower bound";
constexpr const char* kStepBound = "bound: step lower bound past the listed layouts";

// What the search keeps of a predicted layout.
struct Rec {
  double step = 0;
  int64_t peak = 0;
  int64_t index = 0;
  Layout layout;
};
bool by_step(const Rec& a, const Rec& b) {
  if (a.step != b.step) return a.step < b.step;
  if (a.peak != b.peak) return a.peak < b.peak;
  return a.index < b.index;
}
// nearest_to_fitting's choice: the least memory, then the ranking's order.
bool by_peak(const Rec& a, const Rec& b) {
  if (a.peak != b.peak) return a.peak < b.peak;
  if (a.step != b.step) return a.step < b.step;
  return a.index < b.index;
}

// What visiting subspaces found.
struct Found {
  std::vector<Rec> fits;  // fitting layouts at or under the threshold they were found with
  std::vector<Rec> oom;   // the best `top` out of memory, by step
  std::optional<Rec> nearest;
  std::map<std::string, int64_t> classes;
  int64_t fitting = 0, visited = 0;
  int64_t step_bounded = 0, memory_bounded = 0;  // layouts the bounds ruled out in visited shapes
};

void keep_best(std::vector<Rec>& v, size_t n) {
  if (v.size() <= n) return;
  std::nth_element(v.begin(), v.begin() + long(n), v.end(), by_step);
  v.resize(n);
}

// Predicts every valid layout of subspace s as evaluate() does, keeping the
// fitting ones at or under `threshold`. With a finite threshold (`top`
// layouts fit already), a layout whose step bound lies past it, or whose
// memory bound past the usable memory, is counted under that bound instead.
void visit(const SpaceContext& ctx, const Subspace& s, const Rules& rules, const StepBounds& steps,
           double threshold, size_t top, int64_t usable, Found& f) {
  const bool bounded = threshold < std::numeric_limits<double>::infinity();
  std::optional<MemoryBounds> memory_bounds;
  for (int64_t i = 0; i < s.size(); ++i) {
    const Member x = member_of(s, i);
    if (!rules.of(x.c, x.a, x.z, x.g).empty()) continue;
    if (bounded) {
      if (steps.of(x.c, x.a, x.n, x.z, x.g) > threshold) {
        ++f.step_bounded;
        continue;
      }
      if (!memory_bounds) memory_bounds.emplace(ctx, s);
      if (memory_bounds->of(x, usable) > usable) {
        ++f.memory_bounded;
        continue;
      }
    }
    const Layout l = s.at(i);
    ++f.visited;
    memory::MemoryEstimate mem;
    try {
      mem = memory::estimate(ctx.model, ctx.run, l, ctx.cluster.device, ctx.memory);
    } catch (const InputError&) {
      ++f.classes["size"];
      continue;
    }
    const double step = predict(ctx.model, ctx.run, l, ctx.cluster, ctx.constants).step;
    Rec rec{step, mem.peak(), s.first + i, l};
    if (mem.fits) {
      ++f.fitting;
      if (step <= threshold) f.fits.push_back(std::move(rec));
      continue;
    }
    ++f.classes[std::string("oom: ") + memory::to_string(mem.binding)];
    if (!f.nearest || by_peak(rec, *f.nearest)) f.nearest = rec;
    f.oom.push_back(std::move(rec));
    if (f.oom.size() > 2 * top) keep_best(f.oom, top);
  }
  keep_best(f.oom, top);
}

void merge(Found& into, Found&& from, size_t top) {
  into.fitting += from.fitting;
  into.visited += from.visited;
  into.step_bounded += from.step_bounded;
  into.memory_bounded += from.memory_bounded;
  for (auto& [k, n] : from.classes) into.classes[k] += n;
  for (auto& r : from.fits) into.fits.push_back(std::move(r));
  for (auto& r : from.oom) into.oom.push_back(std::move(r));
  keep_best(into.oom, top);
  if (from.nearest && (!into.nearest || by_peak(*from.nearest, *into.nearest))) into.nearest = from.nearest;
}

// The step past which no layout can reach the rows: the larger of the
// top-th fitting step and the fastest's tie window; infinite until `top`
// fit. Drops the fitting layouts past it.
double threshold_of(std::vector<Rec>& fits, size_t top, double tie) {
  if (fits.size() < top || top == 0) return std::numeric_limits<double>::infinity();
  std::sort(fits.begin(), fits.end(), by_step);
  const double t = std::max(fits[top - 1].step, fits.front().step * (1.0 + tie));
  while (!fits.empty() && fits.back().step > t) fits.pop_back();
  return t;
}

}  // namespace

namespace {

SpaceReport search_one(const SpaceContext& ctx, const SpaceLimits& limits, int64_t top_rows, SpaceDevice device) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t top = size_t(std::max<int64_t>(top_rows, 1));
  const auto subs = enumerate_subspaces(ctx.model, ctx.run, ctx.cluster.gpus, limits, device);
  const size_t n = subs.size();
  SpaceReport r;
  r.exhaustive = false;
  for (const auto& s : subs) r.evaluated += s.size();

  // Rules and bounds of every subspace, on every core.
  std::vector<Rules> rules(n);
  std::vector<StepBounds> steps(n);
  std::vector<double> step_bound(n, std::numeric_limits<double>::infinity());
  std::vector<int64_t> memory_bound(n, 0);
  std::vector<std::string> size_error(n);
  std::exception_ptr failed;
  std::vector<BlockCostCache> caches(static_cast<size_t>(omp_get_max_threads()));
  std::vector<RulePool> pools(static_cast<size_t>(omp_get_max_threads()));
  const int64_t usable = int64_t(double(ctx.cluster.device.memory_bytes) * (1.0 - ctx.memory.margin));
  // The step bounds of subspace i: its shape's, the least of its valid
  // layouts'.
  const auto bound_steps = [&](size_t i) {
    const Subspace& s = subs[i];
    steps[i] = step_bounds(ctx.model, ctx.run, s.shape, ctx.cluster, ctx.constants, s.ckpts, s.attentions, s.norms,
                           s.zeros, s.grads, &caches[size_t(omp_get_thread_num())]);
    double kernels = std::numeric_limits<double>::infinity(), sharding = kernels;
    for (size_t c = 0; c < s.ckpts.size(); ++c)
      for (size_t a : rules[i].valid_attentions)
        for (size_t nk = 0; nk < s.norms.size(); ++nk)
          kernels = std::min(kernels, steps[i].kernels[(c * s.attentions.size() + a) * s.norms.size() + nk]);
    for (double v : steps[i].sharding) sharding = std::min(sharding, v);
    step_bound[i] = (kernels + sharding) * (1 - 1e-9);
  };
  // An MoE model's FP8 shape and its bf16 twin (the same shape with FP8
  // off, enumerated just before it): the FP8 shape's rules follow from the
  // twin's (twin_rules), and since its layouts hold all that the twin's do
  // and more (an MoE model's FP8 blocks keep no inputs as codes:
  // memory::fp8_saved_inputs), the twin's memory bound bounds them too.
  // The twins first, then the FP8 shapes.
  std::vector<size_t> twin(n, n);
  if (ctx.model.moe.enabled())
    for (size_t i = 1; i < n; ++i) {
      if (subs[i].shape.fp8 == Fp8Recipe::off || subs[i].shape.fp8_bf16_layers != 0 ||
          subs[i - 1].shape.fp8 != Fp8Recipe::off || subs[i].attentions != subs[i - 1].attentions)
        continue;
      Layout bf16 = subs[i].shape;
      bf16.fp8 = Fp8Recipe::off;
      if (bf16 == subs[i - 1].shape) twin[i] = i - 1;
    }
  const auto bound = [&](size_t i) {
    const Subspace& s = subs[i];
    const size_t t = twin[i];
    RulePool& pool = pools[size_t(omp_get_thread_num())];
    rules[i] = t < n ? twin_rules(ctx, s, rules[t], pool) : rules_of(ctx, s, pool);
    if (rules[i].valid_attentions.empty()) return;
    try {
      memory::check_sizes(ctx.model, ctx.run, s.shape);
    } catch (const InputError& e) {
      // Sizes past 64 bits: the shape's, so every valid layout of it.
      size_error[i] = e.what();
      return;
    }
    bound_steps(i);
  };
  // The memory bound of a shape, the first time it is asked for; an FP8
  // shape takes its twin's. Asked first only whether it lies past the usable
  // memory (memory_lower_bound's `past`: less work); the nearest-to-fitting
  // fallback below asks the bound itself (exact) of the shapes past it.
  std::vector<char> memory_known(n, 0), memory_exact(n, 0);
  const auto root = [&](size_t i) { return twin[i] < n && size_error[twin[i]].empty() ? twin[i] : i; };
  const auto bound_memory = [&](const std::vector<size_t>& shapes, bool exact) {
    std::vector<size_t> todo;
    for (size_t i : shapes)
      if (!memory_known[root(i)] || (exact && !memory_exact[root(i)])) todo.push_back(root(i));
    std::sort(todo.begin(), todo.end());
    todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
    const int64_t past = exact ? std::numeric_limits<int64_t>::max() : usable;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < todo.size(); ++k) try {
      memory_bound[todo[k]] = memory_lower_bound(ctx, subs[todo[k]], rules[todo[k]].valid_attentions, past);
    } catch (...) {
#pragma omp critical(weft_search_failed)
      if (!failed) failed = std::current_exception();
    }
    if (failed) std::rethrow_exception(failed);
    for (size_t i : todo) {
      memory_known[i] = 1;
      memory_exact[i] = exact;
    }
    for (size_t i : shapes) {
      memory_bound[i] = memory_bound[root(i)];
      memory_known[i] = 1;
      memory_exact[i] = memory_exact[root(i)];
    }
  };
  for (const bool fp8_twins : {false, true}) {
#pragma omp parallel for schedule(dynamic, 8)
    for (size_t i = 0; i < n; ++i) try {
      if ((twin[i] < n) == fp8_twins) bound(i);
    } catch (...) {
#pragma omp critical(weft_search_failed)
      if (!failed) failed = std::current_exception();
    }
    if (failed) std::rethrow_exception(failed);
  }

  // Every layout's class by the rules, and the first invalid ones by index
  // (the rows after the fitting and out-of-memory ones).
  struct Invalid {
    int64_t index;
    Layout layout;
  };
  std::vector<Invalid> invalid;
  std::vector<int64_t> valid(n, 0);
  // The rule text each layout breaks (held by rules[i], or size_error[i]),
  // counted per subspace on every core; the norm is under no rule, so its
  // choices count alike. On a valid attention a layout breaks the first of
  // its checkpointing, ZeRO, gradient and attention rules (Rules::of), so
  // the counts are products of how many choices of each knob pass: every
  // choice of the knobs after a broken one, and the passing ones before it.
  std::vector<std::vector<std::pair<const std::string*, int64_t>>> broken_of(n);
#pragma omp parallel for schedule(dynamic, 64)
  for (size_t i = 0; i < n; ++i) {
    const Subspace& s = subs[i];
    const Rules& ri = rules[i];
    const int64_t norms = int64_t(s.norms.size());
    auto& broken = broken_of[i];
    const auto count = [&broken](const std::string* rule, int64_t k) {
      if (k == 0) return;
      for (auto& [r, c] : broken)
        if (r == rule) {
          c += k;
          return;
        }
      broken.push_back({rule, k});
    };
    const int64_t per_attention = int64_t(s.ckpts.size() * s.zeros.size() * s.grads.size()) * norms;
    for (size_t a = 0; a < s.attentions.size(); ++a)
      if (!ri.shape[a]->empty()) count(ri.shape[a], per_attention);  // the shape's rule first
    if (ri.valid_attentions.empty()) continue;
    const auto passing = [](const std::vector<const std::string*>& rule_of) {
      return int64_t(std::count_if(rule_of.begin(), rule_of.end(), [](const std::string* r) { return r->empty(); }));
    };
    const int64_t attentions = int64_t(ri.valid_attentions.size());
    const int64_t zs = int64_t(s.zeros.size()), gs = int64_t(s.grads.size());
    const int64_t cs_ok = passing(ri.ckpt), zs_ok = passing(ri.zero), gs_ok = passing(ri.grad);
    for (const std::string* rule : ri.ckpt)
      if (!rule->empty()) count(rule, zs * gs * attentions * norms);
    for (const std::string* rule : ri.zero)
      if (!rule->empty()) count(rule, cs_ok * gs * attentions * norms);
    for (const std::string* rule : ri.grad)
      if (!rule->empty()) count(rule, cs_ok * zs_ok * attentions * norms);
    int64_t attentions_ok = 0;
    for (size_t a : ri.valid_attentions)
      if (!ri.attention[a]->empty())
        count(ri.attention[a], cs_ok * zs_ok * gs_ok * norms);
      else
        ++attentions_ok;
    const int64_t passed = cs_ok * zs_ok * gs_ok * attentions_ok * norms;
    if (size_error[i].empty())
      valid[i] += passed;
    else
      count(&size_error[i], passed);
  }
  std::map<std::string, std::string> class_of;  // violation -> its class
  for (size_t i = 0; i < n; ++i) {
    const Subspace& s = subs[i];
    // The first invalid layouts by index, for the rows when too few others.
    for (int64_t j = 0; j < s.size() && invalid.size() < top; ++j) {
      const Member x = member_of(s, j);
      if (!rules[i].of(x.c, x.a, x.z, x.g).empty() || !size_error[i].empty())
        invalid.push_back({s.first + j, s.at(j)});
    }
    for (const auto& [rule, count] : broken_of[i]) {
      if (rule == &size_error[i]) {
        r.pruned["size"] += count;
        continue;
      }
      auto it = class_of.find(*rule);
      if (it == class_of.end()) it = class_of.emplace(*rule, rule_class(*rule)).first;
      r.pruned[it->second] += count;
    }
  }

  // Shapes with valid layouts, by their step bound.
  std::vector<size_t> order, over_memory;
  for (size_t i = 0; i < n; ++i)
    if (valid[i] > 0) order.push_back(i);
  const auto by_bound = [&](size_t a, size_t b) {
    return step_bound[a] != step_bound[b] ? step_bound[a] < step_bound[b] : a < b;
  };
  std::sort(order.begin(), order.end(), by_bound);

  // Visits shapes in batches (a few per core, predicted in parallel, merged
  // in order) while their bound is within the threshold.
  Found found;
  double threshold = std::numeric_limits<double>::infinity();
  auto visit_batch = [&](const std::vector<size_t>& batch, double limit) {
    std::vector<Found> parts(batch.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t b = 0; b < batch.size(); ++b) try {
      visit(ctx, subs[batch[b]], rules[batch[b]], steps[batch[b]], limit, top, usable, parts[b]);
    } catch (...) {
#pragma omp critical(weft_search_failed)
      if (!failed) failed = std::current_exception();
    }
    if (failed) std::rethrow_exception(failed);
    for (auto& p : parts) merge(found, std::move(p), top);
  };
  // Each batch's shapes take their memory bounds first; those over the
  // usable memory are set aside.
  size_t next = 0;
  const size_t batch_size = 16;
  while (next < order.size() && step_bound[order[next]] <= threshold) {
    std::vector<size_t> batch, shapes;
    while (next < order.size() && shapes.size() < batch_size && step_bound[order[next]] <= threshold)
      shapes.push_back(order[next++]);
    bound_memory(shapes, false);
    for (size_t i : shapes) {
      if (memory_bound[i] <= usable) {
        batch.push_back(i);
        continue;
      }
      over_memory.push_back(i);
      r.pruned[kMemoryBound] += valid[i];
    }
    visit_batch(batch, threshold);
    threshold = threshold_of(found.fits, top, ctx.tie);
  }
  for (size_t k = next; k < order.size(); ++k) r.pruned[kStepBound] += valid[order[k]];

  // Fewer than `top` fit: the rows go on with the layouts out of memory by
  // step, and the layout nearest to fitting follows them when none fits.
  // Shapes over the memory bound hold such layouts too: those whose bounds
  // could place one among them are visited now. (With fewer than `top`
  // fitting the threshold stayed infinite, so every shape was bounded, and
  // over_memory holds them in `order`'s order, by their step bound.)
  if (found.fitting < int64_t(top)) {
    const size_t want = top - size_t(found.fitting);
    if (found.fitting == 0) bound_memory(over_memory, true);  // (the nearest's test reads the bounds)
    for (size_t i : over_memory) {
      keep_best(found.oom, want);
      const bool rows = found.oom.size() < want ||
                        step_bound[i] <= std::max_element(found.oom.begin(), found.oom.end(), by_step)->step;
      const bool nearest = found.fitting == 0 && (!found.nearest || memory_bound[i] <= found.nearest->peak);
      if (!rows && !nearest) continue;
      r.pruned[kMemoryBound] -= valid[i];
      visit_batch({i}, threshold);
    }
    keep_best(found.oom, want);
  }
  if (r.pruned.count(kMemoryBound) && r.pruned[kMemoryBound] == 0) r.pruned.erase(kMemoryBound);
  for (auto& [k, v] : found.classes) r.pruned[k] += v;
  if (found.step_bounded > 0) r.pruned[kStepBound] += found.step_bounded;
  if (found.memory_bounded > 0) r.pruned[kMemoryBound] += found.memory_bounded;
  r.fitting = found.fitting;
  r.visited = found.visited;

  // The rows: fitting layouts by step, the least memory within the tie
  // window of the fastest first (evaluate()'s rule), then out of memory by
  // step, then invalid by index; each predicted again as evaluate() does.
  std::vector<Rec>& fits = found.fits;
  std::sort(fits.begin(), fits.end(), by_step);
  if (!fits.empty()) {
    const double limit = fits.front().step * (1.0 + ctx.tie);
    size_t best = 0;
    for (size_t i = 1; i < fits.size() && fits[i].step <= limit; ++i)
      if (fits[i].peak < fits[best].peak) best = i;
    std::rotate(fits.begin(), fits.begin() + long(best), fits.begin() + long(best) + 1);
  }
  std::vector<Layout> rows;
  for (size_t i = 0; i < fits.size() && rows.size() < top; ++i) rows.push_back(fits[i].layout);
  std::sort(found.oom.begin(), found.oom.end(), by_step);
  for (size_t i = 0; i < found.oom.size() && rows.size() < top; ++i) rows.push_back(found.oom[i].layout);
  for (size_t i = 0; i < invalid.size() && rows.size() < top; ++i) rows.push_back(invalid[i].layout);
  if (found.fitting == 0 && found.nearest &&
      std::find(rows.begin(), rows.end(), found.nearest->layout) == rows.end())
    rows.push_back(found.nearest->layout);
  r.candidates.resize(rows.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < rows.size(); ++i)
    r.candidates[i] = evaluate_one(ctx.model, ctx.run, ctx.cluster, rows[i], ctx.constants, ctx.memory);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

SpaceReport search(const SpaceContext& ctx, const SpaceLimits& limits, int64_t top_rows, SpaceDevice device) {
  const auto& caps = limits.capacity;
  if (!ctx.model.moe.enabled() || caps.empty() || (caps.size() == 1 && caps[0] == ctx.model.moe.capacity_factor))
    return search_one(ctx, limits, top_rows, device);
  // Each listed capacity factor's space searched with the model dropping
  // at it, and the rows merged as one search orders them: fitting layouts
  // by step with the least memory within the tie window of the fastest
  // first, then out of memory by step, then invalid ones.
  SpaceReport r;
  r.exhaustive = false;
  std::vector<Candidate> fits, oom, invalid;
  std::optional<Candidate> nearest;  // where none fits: the one listed after the rows
  for (double capacity : caps) {
    SpaceContext one = ctx;
    one.model.moe.capacity_factor = capacity;
    SpaceLimits pinned = limits;
    pinned.capacity = {capacity};
    SpaceReport part = search_one(one, pinned, top_rows, device);
    r.evaluated += part.evaluated;
    r.fitting += part.fitting;
    r.visited += part.visited;
    r.seconds += part.seconds;
    for (auto& [k, v] : part.pruned) r.pruned[k] += v;
    for (auto& c : part.candidates)
      (c.verdict == Verdict::fits ? fits : c.verdict == Verdict::out_of_memory ? oom : invalid).push_back(std::move(c));
  }
  // (evaluate()'s order: by step, then memory, then the space's order, in
  // which the listed factors come one after another)
  const auto by_step = [](const Candidate& a, const Candidate& b) {
    return a.cost.step != b.cost.step ? a.cost.step < b.cost.step : a.memory.peak() < b.memory.peak();
  };
  std::stable_sort(fits.begin(), fits.end(), by_step);
  std::stable_sort(oom.begin(), oom.end(), by_step);
  if (!fits.empty()) {
    const double limit = fits.front().cost.step * (1.0 + ctx.tie);
    size_t best = 0;
    for (size_t i = 1; i < fits.size() && fits[i].cost.step <= limit; ++i)
      if (fits[i].memory.peak() < fits[best].memory.peak()) best = i;
    std::rotate(fits.begin(), fits.begin() + long(best), fits.begin() + long(best) + 1);
  } else if (!oom.empty()) {
    nearest = *std::min_element(oom.begin(), oom.end(), [](const Candidate& a, const Candidate& b) {
      return a.memory.peak() < b.memory.peak();
    });
  }
  const size_t top = size_t(std::max<int64_t>(top_rows, 1));
  for (auto* list : {&fits, &oom, &invalid})
    for (auto& c : *list)
      if (r.candidates.size() < top) r.candidates.push_back(std::move(c));
  if (nearest && std::none_of(r.candidates.begin(), r.candidates.end(),
                              [&](const Candidate& c) { return c.layout == nearest->layout; }))
    r.candidates.push_back(std::move(*nearest));
  return r;
}

}  // namespace weft::tuner
