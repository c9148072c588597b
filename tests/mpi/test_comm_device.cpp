// The device backends of Comm under mpirun: every collective and the
// point-to-point calls on device buffers, against values computed on the host
// from every rank's contribution (fresh random integers stored as floats, so
// sums are exact; bf16 sums of random reals within one bf16 rounding).
//
//   test_comm_device [--comm nccl|mpi]
//
// nccl (the default) needs a GPU per rank and exits 77 (skipped) on every
// rank otherwise; with a single rank it runs each NCCL call once on a
// communicator of one. mpi (the device communicator over MPI, for ranks that
// share a GPU) runs wherever there is a GPU: rank r takes GPU r mod count.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/layout.h"
#include "trainer/parallel/comm_mpi.h"
#include "trainer/parallel/comm_mpi_device.h"
#ifdef WEFT_HAVE_NCCL
#include "trainer/parallel/comm_nccl.h"
#endif

namespace weft::parallel {
namespace {

// The backend under test (--comm), and its groups for a layout, ordered
// after the legacy default stream (the helpers below copy on it).
bool g_nccl = true;

ProcessGroups groups_for(const std::string& layout) {
  const Layout l = Layout::parse(layout);
#ifdef WEFT_HAVE_NCCL
  if (g_nccl) return nccl_process_groups(l, nullptr);
#endif
  return mpi_device_process_groups(l, nullptr);
}

uint64_t seed() {
  static const uint64_t s = [] {
    auto c = mpi_world_dup("seed");
    int64_t v = c->rank() == 0 ? int64_t(std::random_device{}()) : 0;
    c->broadcast(&v, 1, 0);
    return uint64_t(v);
  }();
  return s;
}

// Rank r's contribution to collective `salt`: integers in [-100, 100].
std::vector<float> part(uint64_t salt, int64_t r, int64_t n) {
  std::mt19937_64 rng(seed() ^ (salt << 20) ^ uint64_t(r + 1));
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(int(rng() % 201) - 100);
  return v;
}

struct Device {
  float* p = nullptr;
  explicit Device(int64_t n) { EXPECT_EQ(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * 4), cudaSuccess); }
  ~Device() { cudaFree(p); }
  void put(const std::vector<float>& v) { cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice); }
  std::vector<float> get(int64_t n) {
    cudaDeviceSynchronize();
    std::vector<float> v(static_cast<size_t>(n));
    cudaMemcpy(v.data(), p, size_t(n) * 4, cudaMemcpyDeviceToHost);
    return v;
  }
};

TEST(CommDevice, EveryCollectiveOnDeviceBuffers) {
  const int64_t world = mpi_world_size();
  ProcessGroups g = groups_for(fmt::format("tp1-pp1-dp{}-mb1", world));
  Comm& c = *g.world;
  const int64_t r = c.rank(), n = 1037;
  // all_reduce
  {
    Device d(n);
    d.put(part(1, r, n));
    c.all_reduce(d.p, n, DType::f32, ReduceOp::sum);
    std::vector<float> want(static_cast<size_t>(n), 0);
    for (int64_t q = 0; q < world; ++q) {
      const auto v = part(1, q, n);
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] += v[size_t(i)];
    }
    EXPECT_EQ(d.get(n), want);
  }
  // all_gather, in place
  {
    Device d(n * world);
    d.put(std::vector<float>(size_t(n * world), NAN));
    cudaMemcpy(d.p + r * n, part(2, r, n).data(), size_t(n) * 4, cudaMemcpyHostToDevice);
    c.all_gather(d.p + r * n, d.p, n, DType::f32);
    const auto got = d.get(n * world);
    for (int64_t q = 0; q < world; ++q)
      EXPECT_EQ(std::vector<float>(got.begin() + q * n, got.begin() + (q + 1) * n), part(2, q, n));
  }
  // reduce_scatter, in place: the result lands in the first n elements
  {
    Device d(n * world);
    d.put(part(3, r, n * world));
    c.reduce_scatter(d.p, d.p, n, DType::f32);
    std::vector<float> want(static_cast<size_t>(n), 0);
    for (int64_t q = 0; q < world; ++q) {
      const auto v = part(3, q, n * world);
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] += v[size_t(r * n + i)];
    }
    EXPECT_EQ(d.get(n), want);
  }
  // uneven all_gather and reduce_scatter
  {
    std::vector<int64_t> counts;
    int64_t total = 0;
    for (int64_t q = 0; q < world; ++q) total += counts.emplace_back(5 + 7 * q);
    Device in(counts[size_t(r)]), out(total);
    in.put(part(4, r, counts[size_t(r)]));
    c.all_gather_v(in.p, out.p, counts, DType::f32);
    const auto got = out.get(total);
    int64_t off = 0;
    for (int64_t q = 0; q < world; ++q) {
      EXPECT_EQ(std::vector<float>(got.begin() + off, got.begin() + off + counts[size_t(q)]),
                part(4, q, counts[size_t(q)]));
      off += counts[size_t(q)];
    }
    Device full(total), mine(counts[size_t(r)]);
    full.put(part(5, r, total));
    c.reduce_scatter_v(full.p, mine.p, counts, DType::f32);
    int64_t start = 0;
    for (int64_t q = 0; q < r; ++q) start += counts[size_t(q)];
    std::vector<float> want(static_cast<size_t>(counts[size_t(r)]), 0);
    for (int64_t q = 0; q < world; ++q) {
      const auto v = part(5, q, total);
      for (size_t i = 0; i < want.size(); ++i) want[i] += v[size_t(start) + i];
    }
    EXPECT_EQ(mine.get(counts[size_t(r)]), want);
    // In place (the sum lands at the front, over part of this rank's own
    // block for every rank but the first), into this rank's own block of the
    // input, and non-blocking.
    full.put(part(5, r, total));
    c.reduce_scatter_v(full.p, full.p, counts, DType::f32);
    EXPECT_EQ(full.get(counts[size_t(r)]), want);
    full.put(part(5, r, total));
    c.reduce_scatter_v(full.p, full.p + start, counts, DType::f32);
    const auto own = full.get(total);
    EXPECT_EQ(std::vector<float>(own.begin() + start, own.begin() + start + counts[size_t(r)]), want);
    full.put(part(5, r, total));
    mine.put(std::vector<float>(size_t(counts[size_t(r)]), NAN));
    c.ireduce_scatter_v(full.p, mine.p, counts, DType::f32)->wait();
    EXPECT_EQ(mine.get(counts[size_t(r)]), want);
  }
  // broadcast from the last rank
  {
    Device d(n);
    d.put(part(6, r, n));
    c.broadcast(d.p, n, DType::f32, world - 1);
    EXPECT_EQ(d.get(n), part(6, world - 1, n));
  }
  // NCCL groups without point-to-point refuse it by name (MPI's have it).
  if (g_nccl && world > 1) {
    EXPECT_THROW(c.send(nullptr, 1, DType::f32, (r + 1) % world, 0), InternalError);
  }
  c.barrier();
}

// grad:bf16 reduces gradients in bf16: the non-blocking all-reduce (ZeRO-0)
// and uneven reduce-scatter into this rank's shard (ZeRO-1 and -2) on bf16
// device buffers. Integers in [-16, 16] and their sums over up to 16 ranks
// are exact in bf16, so the results must be too.
TEST(CommDevice, Bf16GradientReductions) {
  using kernels::bf16;
  const int64_t world = mpi_world_size();
  ASSERT_LE(world, 16);
  ProcessGroups g = groups_for(fmt::format("tp1-pp1-dp{}-mb1", world));
  Comm& c = *g.dp;
  const int64_t r = c.rank(), n = 1037;
  auto values = [&](uint64_t salt, int64_t q, int64_t count) {
    std::vector<float> v = part(salt, q, count);
    for (float& x : v) x = std::round(x / 6.25f);  // [-16, 16]
    return v;
  };
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<bf16> out;
    for (float x : v) out.push_back(kernels::float_to_bf16(x));
    return out;
  };
  auto sum_over_ranks = [&](uint64_t salt, int64_t count, int64_t from, int64_t size) {
    std::vector<float> want(static_cast<size_t>(size), 0);
    for (int64_t q = 0; q < world; ++q)
      for (int64_t i = 0; i < size; ++i) want[size_t(i)] += values(salt, q, count)[size_t(from + i)];
    return want;
  };
  auto download = [](const bf16* p, int64_t count) {
    cudaDeviceSynchronize();
    std::vector<bf16> host(static_cast<size_t>(count));
    cudaMemcpy(host.data(), p, size_t(count) * sizeof(bf16), cudaMemcpyDeviceToHost);
    std::vector<float> out;
    for (bf16 x : host) out.push_back(kernels::bf16_to_float(x));
    return out;
  };
  bf16* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, size_t(n) * sizeof(bf16)), cudaSuccess);
  const std::vector<bf16> mine = to_bf16(values(11, r, n));
  cudaMemcpy(d, mine.data(), size_t(n) * sizeof(bf16), cudaMemcpyHostToDevice);
  c.iall_reduce(d, n)->wait();
  EXPECT_EQ(download(d, n), sum_over_ranks(11, n, 0, n));

  std::vector<int64_t> counts;
  int64_t total = 0, start = 0;
  for (int64_t q = 0; q < world; ++q) {
    if (q == r) start = total;
    total += counts.emplace_back(9 + 5 * q);
  }
  bf16* full = nullptr;
  ASSERT_EQ(cudaMalloc(&full, size_t(total) * sizeof(bf16)), cudaSuccess);
  const std::vector<bf16> all = to_bf16(values(12, r, total));
  cudaMemcpy(full, all.data(), size_t(total) * sizeof(bf16), cudaMemcpyHostToDevice);
  c.ireduce_scatter_v(full, full + start, std::span<const int64_t>(counts))->wait();
  EXPECT_EQ(download(full + start, counts[size_t(r)]), sum_over_ranks(12, total, start, counts[size_t(r)]));

  // The backward's even forms on the communication stream: an in-place
  // reduce-scatter (the sum lands first) and an all-gather.
  bf16* even = nullptr;
  ASSERT_EQ(cudaMalloc(&even, size_t(n * world) * sizeof(bf16)), cudaSuccess);
  const std::vector<bf16> rows = to_bf16(values(13, r, n * world));
  cudaMemcpy(even, rows.data(), size_t(n * world) * sizeof(bf16), cudaMemcpyHostToDevice);
  c.ireduce_scatter(even, even, n)->wait();
  EXPECT_EQ(download(even, n), sum_over_ranks(13, n * world, r * n, n));
  cudaMemcpy(d, mine.data(), size_t(n) * sizeof(bf16), cudaMemcpyHostToDevice);
  c.iall_gather(d, even, n)->wait();
  const std::vector<float> gathered = download(even, n * world);
  for (int64_t q = 0; q < world; ++q)
    EXPECT_EQ(std::vector<float>(gathered.begin() + q * n, gathered.begin() + (q + 1) * n), values(11, q, n));
  cudaFree(even);
  cudaFree(full);
  cudaFree(d);
  c.barrier();
}

// Stream order: a buffer whose producer is still queued when the call is
// made (a host function that sleeps, then a copy of the values, both on the
// stream the groups order after) is reduced only once it is written, and a
// copy queued after the call sees the sum. A backend that read the buffer
// at once would reduce the NaNs it was poisoned with.
TEST(CommDevice, WaitsForTheBufferItsProducerIsStillWriting) {
  const int64_t world = mpi_world_size();
  ProcessGroups g = groups_for(fmt::format("tp1-pp1-dp{}-mb1", world));
  Comm& c = *g.dp;
  const int64_t r = c.rank(), n = 1 << 16;
  Device d(n);
  d.put(std::vector<float>(size_t(n), NAN));
  cudaDeviceSynchronize();
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, size_t(n) * 4), cudaSuccess);
  const auto mine = part(30, r, n);
  std::copy(mine.begin(), mine.end(), pinned);
  ASSERT_EQ(cudaLaunchHostFunc(
                nullptr, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d.p, pinned, size_t(n) * 4, cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  c.all_reduce(d.p, n, DType::f32, ReduceOp::sum);
  std::vector<float> got(static_cast<size_t>(n));
  ASSERT_EQ(cudaMemcpyAsync(got.data(), d.p, size_t(n) * 4, cudaMemcpyDeviceToHost, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  std::vector<float> want(static_cast<size_t>(n), 0);
  for (int64_t q = 0; q < world; ++q) {
    const auto v = part(30, q, n);
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] += v[size_t(i)];
  }
  EXPECT_EQ(got, want);
  cudaFreeHost(pinned);
}

// bf16 sums of random reals (fresh each run) against the fp64 sum: within
// one bf16 rounding of every partial sum a ring may round, world * 2^-8 of
// the sum of magnitudes (the MPI device backend rounds once).
TEST(CommDevice, Bf16SumsOfRandomRealsWithinTheRoundingRule) {
  using kernels::bf16;
  const int64_t world = mpi_world_size();
  ProcessGroups g = groups_for(fmt::format("tp1-pp1-dp{}-mb1", world));
  Comm& c = *g.dp;
  const int64_t r = c.rank(), n = 4099;
  auto reals = [&](uint64_t salt, int64_t q, int64_t count) {
    std::mt19937_64 rng(seed() ^ (salt << 20) ^ uint64_t(q + 1));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<bf16> v(static_cast<size_t>(count));
    for (auto& x : v) x = kernels::float_to_bf16(u(rng) * std::exp2(float(int(rng() % 9) - 4)));
    return v;
  };
  bf16* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, size_t(n * world) * sizeof(bf16)), cudaSuccess);
  auto check = [&](const std::vector<bf16>& got, uint64_t salt, int64_t count, int64_t from) {
    double worst = 0;
    std::vector<std::vector<bf16>> inputs;  // every rank's, generated once
    for (int64_t q = 0; q < world; ++q) inputs.push_back(reals(salt, q, count));
    for (size_t i = 0; i < got.size(); ++i) {
      double sum = 0, mag = 0;
      for (int64_t q = 0; q < world; ++q) {
        const double x = kernels::bf16_to_float(inputs[size_t(q)][size_t(from) + i]);
        sum += x;
        mag += std::abs(x);
      }
      const double err = std::abs(double(kernels::bf16_to_float(got[i])) - sum);
      ASSERT_TRUE(std::isfinite(err)) << "element " << i;
      worst = std::max(worst, err / (double(world) * std::exp2(-8) * mag + 1e-30));
    }
    EXPECT_LE(worst, 1.0) << "worst error as a share of the allowance";
  };
  auto download = [&](int64_t count) {
    cudaDeviceSynchronize();
    std::vector<bf16> h(static_cast<size_t>(count));
    cudaMemcpy(h.data(), d, size_t(count) * sizeof(bf16), cudaMemcpyDeviceToHost);
    return h;
  };
  const auto a = reals(40, r, n);
  cudaMemcpy(d, a.data(), size_t(n) * sizeof(bf16), cudaMemcpyHostToDevice);
  c.all_reduce(d, n);
  check(download(n), 40, n, 0);
  const auto b = reals(41, r, n * world);
  cudaMemcpy(d, b.data(), size_t(n * world) * sizeof(bf16), cudaMemcpyHostToDevice);
  c.reduce_scatter(d, d, n);
  check(download(n), 41, n * world, r * n);
  cudaFree(d);
}

// The pipeline's pattern on the pp group: every stage sends to both ring
// neighbours before it receives from either, with messages far larger than
// NCCL's buffers, then a second round with non-blocking receives. On one
// stream per group this waits forever; each direction has a stream of its
// own here.
TEST(CommDevice, SendsBeforeReceivesOnThePipelineGroup) {
  const int64_t world = mpi_world_size();
  if (world < 2) GTEST_SKIP() << "point-to-point needs two ranks";
  ProcessGroups g = groups_for(fmt::format("tp1-pp{}-dp1-mb1", world));
  Comm& c = *g.pp;
  const int64_t r = c.rank(), n = 8 << 20;  // 32 MiB of fp32
  const int64_t next = (r + 1) % world, prev = (r + world - 1) % world;
  for (int round = 0; round < 2; ++round) {
    Device to_next(n), to_prev(n), from_prev(n), from_next(n);
    to_next.put(part(8 + 4 * round, r, n));
    to_prev.put(part(9 + 4 * round, r, n));
    auto a = c.isend(to_next.p, n, DType::f32, next, 0);
    auto b = c.isend(to_prev.p, n, DType::f32, prev, 1);
    if (round == 0) {
      c.recv(from_prev.p, n, DType::f32, prev, 0);
      c.recv(from_next.p, n, DType::f32, next, 1);
    } else {
      // Posted in the senders' order (with two ranks next and prev are the
      // same peer, and NCCL matches by order, not tag), waited in reverse.
      auto x = c.irecv(from_prev.p, n, DType::f32, prev, 0);
      auto y = c.irecv(from_next.p, n, DType::f32, next, 1);
      y->wait();
      x->wait();
    }
    a->wait();
    b->wait();
    EXPECT_EQ(from_prev.get(n), part(8 + 4 * round, prev, n)) << "round " << round;
    EXPECT_EQ(from_next.get(n), part(9 + 4 * round, next, n)) << "round " << round;
  }
}

// Context parallelism's a2a transport on the cp group: all_to_all reaches
// every rank (the group's point-to-point channels reach ring neighbours only,
// so with 4 or more ranks some pairs have none), and leaves this rank's own
// block of out alone.
TEST(CommDevice, AllToAllOnTheContextParallelGroup) {
  const int64_t world = mpi_world_size();
  ProcessGroups g = groups_for(fmt::format("tp1-cp{}-pp1-dp1-mb1", world));
  Comm& c = *g.cp;
  const int64_t r = c.rank(), n = 3001;
  Device in(n * world), out(n * world);
  in.put(part(20, r, n * world));
  out.put(std::vector<float>(size_t(n * world), NAN));
  c.all_to_all(in.p, out.p, n, DType::f32, 0);
  const auto got = out.get(n * world);
  for (int64_t q = 0; q < world; ++q) {
    const std::vector<float> block(got.begin() + q * n, got.begin() + (q + 1) * n);
    if (q == r) {
      for (float x : block) ASSERT_TRUE(std::isnan(x)) << "own block written";
      continue;
    }
    const auto sent = part(20, q, n * world);
    EXPECT_EQ(block, std::vector<float>(sent.begin() + r * n, sent.begin() + (r + 1) * n)) << "from rank " << q;
  }
}

}  // namespace
}  // namespace weft::parallel

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string comm = "nccl";
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--comm") comm = argv[i + 1];
  if (comm != "nccl" && comm != "mpi") {
    std::fprintf(stderr, "--comm %s: use nccl or mpi\n", comm.c_str());
    return 2;
  }
  weft::parallel::g_nccl = comm == "nccl";
#ifndef WEFT_HAVE_NCCL
  if (weft::parallel::g_nccl) {
    std::printf("skipped: this build has no NCCL\n");
    return 77;
  }
#endif
  weft::parallel::mpi_init();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int local_rank = local ? std::atoi(local) : 0;
  // Every rank must agree, or a rank with a GPU would wait for one without.
  auto c = weft::parallel::mpi_world_dup("probe");
  int32_t ok = (weft::parallel::g_nccl ? local_rank < devices : devices > 0) ? 1 : 0;
  c->all_reduce(&ok, 1, weft::parallel::ReduceOp::sum);
  if (ok < c->size()) {
    if (c->rank() == 0)
      std::printf("skipped: %d of %lld ranks have a GPU%s\n", ok, (long long)c->size(),
                  weft::parallel::g_nccl ? " of their own" : "");
    return 77;
  }
  cudaSetDevice(local_rank % devices);
  return RUN_ALL_TESTS();
}
