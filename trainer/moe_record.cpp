#include "trainer/moe_record.h"

#include <algorithm>

#include <fmt/format.h>

#include "memory/shapes.h"

namespace weft::trainer {

MoeRecord moe_record(const TrainConfig& c, parallel::Comm& world, std::vector<int64_t>& load,
                     std::vector<int64_t>& dropped, std::vector<double>& peaks, double& received_peak) {
  MoeRecord r;
  const bool capped = c.model.moe.capacity_factor > 0;
  const int64_t E = c.model.moe.experts, L = c.model.layers;
  load.resize(size_t(L * E));
  dropped.resize(size_t(L));
  world.all_reduce(load.data(), int64_t(load.size()));
  if (capped) world.all_reduce(dropped.data(), L);
  nlohmann::json layers = nlohmann::json::array(), counts = nlohmann::json::array(),
                 lost_per_layer = nlohmann::json::array();
  int64_t choices = 0, lost = 0;
  for (int64_t i = 0; i < L; ++i) {
    if (!c.model.moe_layer(i)) continue;
    layers.push_back(i);
    counts.push_back(std::vector<int64_t>(load.begin() + i * E, load.begin() + (i + 1) * E));
    for (int64_t j = 0; j < E; ++j) choices += load[size_t(i * E + j)];
    lost_per_layer.push_back(dropped[size_t(i)]);
    lost += dropped[size_t(i)];
  }
  // The most uneven dispatches at each ep degree (an ep rank's experts'
  // rows over the balanced share), beside what the receive buffers hold.
  peaks.resize(size_t(E + 1), 0.0);
  world.all_reduce(peaks.data(), E + 1, parallel::ReduceOp::max);
  nlohmann::json by_degree = nlohmann::json::object();
  for (int64_t d = 2; d <= E; ++d)
    if (E % d == 0) by_degree[std::to_string(d)] = peaks[size_t(d)];
  r.expert_load = {{"layers", layers}, {"counts", counts}, {"dispatch_peaks", by_degree}};
  const int64_t ep = c.layout.ep, rows = memory::moe_routed_rows(c.model, c.run, c.layout);
  if (ep > 1) {  // what the receive buffers were held against (MoeSpec::received_rows)
    world.all_reduce(&received_peak, 1, parallel::ReduceOp::max);
    r.expert_load["received_peak"] = received_peak;
    received_peak = 0;
  }
  if (const double f = c.model.moe.imbalance_for(rows, ep); ep > 1 && f > 0) {
    const double worst = double(c.model.moe.received_rows_worst(rows, ep)) / double(rows * c.model.moe.top_k);
    r.text += fmt::format(" | ep peak {:.2f}x of the buffers' {:g}x", peaks[size_t(ep)], std::min(f, worst));
  }
  std::fill(peaks.begin(), peaks.end(), 0.0);
  if (capped) {
    r.expert_load["dropped"] = lost_per_layer;
    r.text += fmt::format(" | dropped {:.2f}%", choices > 0 ? 100.0 * double(lost) / double(choices) : 0.0);
  }
  std::fill(load.begin(), load.end(), int64_t{0});
  std::fill(dropped.begin(), dropped.end(), int64_t{0});
  return r;
}

}  // namespace weft::trainer
