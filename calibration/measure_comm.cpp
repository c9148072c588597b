// Collective and point-to-point rates for a measured device profile: each
// collective the trainer calls (all-reduce, all-gather, reduce-scatter) over
// every group size that divides the world, by message size, and a send and
// receive between pairs, fitted to a latency and a bus bandwidth.
#include <algorithm>
#include <utility>
#include <vector>

#include "calibration/device_bench.h"

namespace weft::calibration {

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

template void measure_comm<float>(Bench<float>&, const DeviceCalibration&, parallel::Comm&, const GroupsFor&,
                                  MeasuredRates&);
template void measure_comm<kernels::bf16>(Bench<kernels::bf16>&, const DeviceCalibration&, parallel::Comm&,
                                          const GroupsFor&, MeasuredRates&);

}  // namespace weft::calibration
