#include "memory/estimate.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"

namespace weft::memory {

MemoryEstimate estimate(const ModelSpec& m, const RunSpec& run, const Layout& l,
                        const DeviceSpec& device, const MemoryOptions& opt) {
  MemoryEstimate e;
  e.capacity = device.memory_bytes;
  e.margin = opt.margin;
  e.usable = static_cast<int64_t>(double(device.memory_bytes) * (1.0 - opt.margin));

  // An even split's middle stages hold the first stage's layers and fewer
  // micro-batches in flight, and no embedding: the first and last stage
  // bound them. An uneven split that differs only on the first and last
  // virtual stage leaves the middle stages alike, and stage 1 (the most in
  // flight of them) bounds those; any other split is judged stage by stage.
  const bool every = opt.all_stages || l.pp <= 2 || (l.uneven() && !l.edge_split());
  const int64_t n = every ? l.pp : l.uneven() ? 3 : 2;
  e.stages.reserve(size_t(n));
  thread_local std::vector<TensorShape> shapes;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = every ? i : i == n - 1 ? l.pp - 1 : i;
    const StagePlan plan = stage_plan(m, run, l, s);
    StageMemory sm;
    sm.stage = s;
    sm.layers = plan.layers;
    sm.in_flight_chunks = plan.in_flight_chunks;
    stage_shapes(m, run, l, device, plan, shapes);
    sm.bytes = sum_by_category(shapes);
    for (int64_t b : sm.bytes) sm.total += b;
    e.stages.push_back(sm);
  }
  for (size_t i = 1; i < e.stages.size(); ++i)
    if (e.stages[i].total > e.stages[size_t(e.worst)].total) e.worst = int64_t(i);

  const StageMemory& w = e.worst_stage();
  e.binding = Category(std::max_element(w.bytes.begin(), w.bytes.end()) - w.bytes.begin());
  e.fits = w.total <= e.usable;
  if (!e.fits) {
    const int64_t big = w.bytes[size_t(e.binding)];
    std::string detail;
    if (e.binding == Category::activations)
      detail = fmt::format(" ({} chunk-micro-batch{} of mb {} in flight, ckpt {})",
                           w.in_flight_chunks, w.in_flight_chunks == 1 ? "" : "es", l.mb,
                           to_string(l.ckpt));
    e.reason = fmt::format("stage {} needs {} > {} usable ({:.0f}% of {}); largest: {} {}{}",
                           w.stage, format_bytes(double(w.total)), format_bytes(double(e.usable)),
                           100.0 * (1.0 - opt.margin), format_bytes(double(e.capacity)),
                           to_string(e.binding), format_bytes(double(big)), detail);
  }
  return e;
}

int64_t host_staging_bytes(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                           int64_t stage) {
  if (device.kind != DeviceKind::gpu || device.shared_by <= 1 || l.world() <= 1) return 0;
  const StagePlan plan = stage_plan(m, run, l, stage);
  const std::vector<TensorShape> shapes = stage_shapes(m, run, l, device, plan);
  int64_t psi = 0, largest = 0;
  for (const TensorShape& t : shapes) {
    if (t.category == Category::comm) largest = std::max(largest, t.elements * t.element_bytes);
    if (std::string_view(t.name) == "grads.flat" && l.zero_shards() > 1)
      largest = std::max(largest, t.elements * t.element_bytes * (l.zero >= 2 ? l.zero_shards() : 1));
    if (std::string_view(t.name) == "weights.flat") psi = t.elements * (l.zero >= 3 ? l.zero_shards() : 1);
  }
  const int64_t compute_bytes = run.precision == Precision::fp32 ? 4 : 2;
  if (l.zero_shards() > 1 && (l.zero == 1 || l.zero == 2)) largest = std::max(largest, psi * compute_bytes);
  if (l.tp > 1) largest = std::max(largest, l.mb * (run.seq / l.cp) * m.hidden * compute_bytes);
  return 2 * largest;
}

void require_fits(const ModelSpec& m, const RunSpec& run, const Layout& l, const DeviceSpec& device,
                  const std::string& capacity_note) {
  MemoryOptions whole;
  whole.margin = 0;
  whole.all_stages = true;
  const MemoryEstimate e = estimate(m, run, l, device, whole);
  if (e.fits) return;
  const StageMemory& w = e.worst_stage();
  throw InputError(fmt::format(
      "layout {} does not fit: the memory model predicts {} ({} bytes) on stage {} (largest: {} {}), more than "
      "the {} ({} bytes) of {}{}; shrink the model, --vocab, --seq or --mb, or split it over more ranks "
      "(weft tune --dry-run lists the layouts that fit)",
      l.to_string(), format_bytes(double(w.total)), w.total, w.stage, to_string(e.binding),
      format_bytes(double(w.bytes[size_t(e.binding)])), format_bytes(double(e.capacity)), e.capacity, device.name,
      !capacity_note.empty()           ? " (" + capacity_note + ")"
      : device.kind == DeviceKind::cpu ? " (this rank's share of the machine's memory)"
                                       : ""));
}

}  // namespace weft::memory
