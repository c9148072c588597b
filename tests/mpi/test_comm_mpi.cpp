// The MPI backend under mpirun (4 or 8 ranks): every collective on the world
// and on the tp, pp and dp groups of every (tp, pp, dp) factorization of the
// world, against values computed locally. Each rank contributes fresh random
// data drawn from a seed rank 0 broadcasts (WEFT_TEST_SEED overrides it), so
// every rank can compute any other rank's contribution and the expected result.
//
// Every rank runs the same sequence of collectives whatever its checks find:
// no ASSERT_* that could skip a collective, so one failing rank
// cannot leave the others waiting. The cancel tests break this on purpose, on
// communicators of their own that they then abandon.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/layout.h"
#include "trainer/parallel/comm_mpi.h"
#include "trainer/parallel/rank_grid.h"

namespace weft::parallel {
namespace {

uint64_t shared_seed() {
  static const uint64_t seed = [] {
    ProcessGroups g = mpi_process_groups(1, 1, mpi_world_size());
    uint64_t s = 0;
    if (g.world->rank() == 0) {
      const char* env = std::getenv("WEFT_TEST_SEED");
      s = env ? std::strtoull(env, nullptr, 10)
              : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    }
    int64_t v = int64_t(s);
    g.world->broadcast(&v, 1, 0);
    if (g.world->rank() == 0)
      std::printf("seed %llu (set WEFT_TEST_SEED to repeat)\n", (unsigned long long)v);
    return uint64_t(v);
  }();
  return seed;
}

// What world rank `rank` contributes to the collective numbered `salt`.
template <typename T>
std::vector<T> contribution(uint64_t salt, int64_t rank, int64_t n) {
  std::mt19937_64 rng(shared_seed() ^ (salt * 0x9E3779B97F4A7C15ull) ^ (uint64_t(rank + 1) << 48));
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) {
    if constexpr (std::is_floating_point_v<T>) {
      x = T(std::uniform_real_distribution<double>(-1.0, 1.0)(rng));
    } else if constexpr (sizeof(T) == 8) {
      x = T(std::uniform_int_distribution<int64_t>(-(int64_t(1) << 40), int64_t(1) << 40)(rng));
    } else {
      x = T(std::uniform_int_distribution<int32_t>(-100000, 100000)(rng));
    }
  }
  return v;
}

// One element of a reference sum: the exact sum (in double or int64) and, for
// floats, the sum of magnitudes that bounds a summation's rounding error.
template <typename T>
struct Ref {
  std::conditional_t<std::is_floating_point_v<T>, double, int64_t> sum = 0;
  double magnitude = 0;
};

template <typename T>
std::vector<Ref<T>> reference_sum(uint64_t salt, const std::vector<int64_t>& members, int64_t n) {
  std::vector<Ref<T>> s(static_cast<size_t>(n));
  for (int64_t r : members) {
    const std::vector<T> c = contribution<T>(salt, r, n);
    for (size_t i = 0; i < s.size(); ++i) {
      s[i].sum += c[i];
      s[i].magnitude += std::abs(double(c[i]));
    }
  }
  return s;
}

// Integers: exact. Floats: the error norm within 1e-6 of the norm of the
// summed magnitudes. Summing n values in any order and rounding once more to
// T errs by at most n * eps(T) / 2 times the sum of magnitudes, under 5e-7 for
// f32 and n <= 8; relative to the result itself a sum that cancels could
// legitimately miss any fixed bound.
template <typename T>
void expect_matches(const std::vector<T>& got, const std::vector<Ref<T>>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if constexpr (std::is_floating_point_v<T>) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err += (double(got[i]) - want[i].sum) * (double(got[i]) - want[i].sum);
      norm += want[i].magnitude * want[i].magnitude;
    }
    EXPECT_LE(std::sqrt(err), 1e-6 * std::sqrt(norm)) << what;
  } else {
    for (size_t i = 0; i < got.size(); ++i) {
      if (int64_t(got[i]) != want[i].sum) {
        ADD_FAILURE() << what << ": element " << i << " is " << int64_t(got[i]) << ", expected "
                      << want[i].sum;
        return;
      }
    }
  }
}

std::vector<std::tuple<int64_t, int64_t, int64_t>> factorizations(int64_t world) {
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (int64_t tp = 1; tp <= world; ++tp) {
    for (int64_t pp = 1; tp * pp <= world; ++pp) {
      if (world % (tp * pp) == 0) out.emplace_back(tp, pp, world / (tp * pp));
    }
  }
  return out;
}

// A group under test: its communicator and, from RankGrid, its world ranks.
struct Group {
  Comm* comm;
  std::vector<int64_t> members;
  std::string label;
};

std::vector<Group> groups_under_test(const ProcessGroups& g, const RankGrid& grid, int64_t rank,
                                     const std::string& layout) {
  std::vector<int64_t> everyone(size_t(grid.world()));
  std::iota(everyone.begin(), everyone.end(), 0);
  std::vector<Group> out = {{g.world, everyone, layout + " world"},
                            {g.tp, grid.group(Axis::tp, rank), layout + " tp"},
                            {g.pp, grid.group(Axis::pp, rank), layout + " pp"},
                            {g.dp, grid.group(Axis::dp, rank), layout + " dp"}};
  if (g.tp_side) out.push_back({g.tp_side, grid.group(Axis::tp, rank), layout + " tp-side"});
  return out;
}

template <typename T>
void check_all_reduce(const Group& gr, int64_t me, uint64_t salt) {
  const int64_t n = 37;
  std::vector<T> data = contribution<T>(salt, me, n);
  gr.comm->all_reduce(data.data(), n, ReduceOp::sum);
  expect_matches(data, reference_sum<T>(salt, gr.members, n),
                 gr.label + " all_reduce sum " + to_string(dtype_of<T>()));

  std::vector<T> mx = contribution<T>(salt + 1, me, n);
  gr.comm->all_reduce(mx.data(), n, ReduceOp::max);
  std::vector<T> want = contribution<T>(salt + 1, gr.members[0], n);
  for (int64_t r : gr.members) {
    const std::vector<T> c = contribution<T>(salt + 1, r, n);
    for (size_t i = 0; i < want.size(); ++i) want[i] = std::max(want[i], c[i]);
  }
  EXPECT_EQ(mx, want) << gr.label << " all_reduce max " << to_string(dtype_of<T>());

  // The non-blocking form gives the same sum once waited on.
  std::vector<T> later = contribution<T>(salt + 2, me, n);
  auto req = gr.comm->iall_reduce(later.data(), n, ReduceOp::sum);
  req->wait();
  expect_matches(later, reference_sum<T>(salt + 2, gr.members, n),
                 gr.label + " iall_reduce sum " + to_string(dtype_of<T>()));
}

template <typename T>
void check_all_gather(const Group& gr, int64_t me, uint64_t salt) {
  const int64_t n = 5, size = gr.comm->size();
  const std::vector<T> in = contribution<T>(salt, me, n);
  std::vector<T> out(size_t(n * size));
  gr.comm->all_gather(in.data(), out.data(), n);
  std::vector<T> want;
  for (int64_t r : gr.members) {
    const std::vector<T> c = contribution<T>(salt, r, n);
    want.insert(want.end(), c.begin(), c.end());
  }
  EXPECT_EQ(out, want) << gr.label << " all_gather " << to_string(dtype_of<T>());

  // In place: this rank's block of out already holds its input.
  std::vector<T> inplace(size_t(n * size), T(-7));
  std::copy(in.begin(), in.end(), inplace.begin() + gr.comm->rank() * n);
  gr.comm->all_gather(inplace.data() + gr.comm->rank() * n, inplace.data(), n);
  EXPECT_EQ(inplace, want) << gr.label << " all_gather in place";

  // Non-blocking, out of place and in place, with a blocking collective of
  // the same group run while both are in flight.
  std::vector<T> later(size_t(n * size), T(-5)), later_inplace(size_t(n * size), T(-3));
  std::copy(in.begin(), in.end(), later_inplace.begin() + gr.comm->rank() * n);
  auto a = gr.comm->iall_gather(in.data(), later.data(), n);
  auto b = gr.comm->iall_gather(later_inplace.data() + gr.comm->rank() * n, later_inplace.data(), n);
  int64_t one = 1;
  gr.comm->all_reduce(&one, 1);
  b->wait();
  a->wait();
  EXPECT_EQ(later, want) << gr.label << " iall_gather";
  EXPECT_EQ(later_inplace, want) << gr.label << " iall_gather in place";
  EXPECT_EQ(one, size) << gr.label << " all_reduce beside iall_gather";
}

template <typename T>
void check_reduce_scatter(const Group& gr, int64_t me, uint64_t salt) {
  const int64_t n = 6, size = gr.comm->size(), k = gr.comm->rank();
  const std::vector<T> in = contribution<T>(salt, me, n * size);
  const auto total = reference_sum<T>(salt, gr.members, n * size);
  const std::vector<std::decay_t<decltype(total[0])>> mine(total.begin() + k * n,
                                                           total.begin() + (k + 1) * n);
  std::vector<T> out(static_cast<size_t>(n));
  gr.comm->reduce_scatter(in.data(), out.data(), n);
  expect_matches(out, mine, gr.label + " reduce_scatter " + to_string(dtype_of<T>()));

  std::vector<T> inplace = in;
  gr.comm->reduce_scatter(inplace.data(), inplace.data(), n);
  inplace.resize(size_t(n));
  expect_matches(inplace, mine, gr.label + " reduce_scatter in place");

  // Non-blocking in place (the backward's input gradients), beside a
  // blocking all-gather of the same group.
  std::vector<T> later = in;
  auto req = gr.comm->ireduce_scatter(later.data(), later.data(), n);
  std::vector<int64_t> ranks(static_cast<size_t>(size));
  gr.comm->all_gather(&me, ranks.data(), 1);
  req->wait();
  later.resize(size_t(n));
  expect_matches(later, mine, gr.label + " ireduce_scatter in place");
  EXPECT_EQ(ranks, gr.members) << gr.label << " all_gather beside ireduce_scatter";
}

// Uneven blocks: rank r of the group holds r + 1 elements, the last holds none
// when the group has more than one rank.
template <typename T>
void check_uneven(const Group& gr, int64_t me, uint64_t salt) {
  const int64_t size = gr.comm->size(), k = gr.comm->rank();
  std::vector<int64_t> counts(static_cast<size_t>(size));
  for (int64_t r = 0; r < size; ++r) counts[size_t(r)] = (size > 1 && r == size - 1) ? 0 : r + 1;
  std::vector<int64_t> offsets(size_t(size) + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const int64_t total = offsets.back();

  const std::vector<T> in = contribution<T>(salt, me, counts[size_t(k)]);
  std::vector<T> out(static_cast<size_t>(total));
  gr.comm->all_gather_v(in.data(), out.data(), counts);
  std::vector<T> want;
  for (int64_t r = 0; r < size; ++r) {
    const std::vector<T> c = contribution<T>(salt, gr.members[size_t(r)], counts[size_t(r)]);
    want.insert(want.end(), c.begin(), c.end());
  }
  EXPECT_EQ(out, want) << gr.label << " all_gather_v";

  const std::vector<T> full = contribution<T>(salt + 1, me, total);
  const auto sum = reference_sum<T>(salt + 1, gr.members, total);
  const std::vector<std::decay_t<decltype(sum[0])>> mine(sum.begin() + offsets[size_t(k)],
                                                         sum.begin() + offsets[size_t(k) + 1]);
  std::vector<T> block(static_cast<size_t>(counts[size_t(k)]));
  gr.comm->reduce_scatter_v(full.data(), block.data(), counts);
  expect_matches(block, mine, gr.label + " reduce_scatter_v");

  // In place: the sum lands at the front; into this rank's own block of the
  // input: the sum replaces that block.
  std::vector<T> front(full), own(full);
  gr.comm->reduce_scatter_v(front.data(), front.data(), counts);
  front.resize(block.size());
  expect_matches(front, mine, gr.label + " reduce_scatter_v in place");
  T* own_block = own.data() + offsets[size_t(k)];
  gr.comm->reduce_scatter_v(own.data(), own_block, counts);
  expect_matches(std::vector<T>(own_block, own_block + counts[size_t(k)]), mine,
                 gr.label + " reduce_scatter_v into its own block");

  // The non-blocking form, in flight beside an iall_reduce on the same group
  // and waited for in the opposite order, after its counts are gone: the
  // request keeps what the library reads until it completes.
  std::vector<T> later(block.size()), other = contribution<T>(salt + 2, me, 7);
  std::unique_ptr<CommRequest> scatter;
  {
    const std::vector<int64_t> gone(counts);
    scatter = gr.comm->ireduce_scatter_v(full.data(), later.data(), gone);
  }
  auto reduce = gr.comm->iall_reduce(other.data(), 7, ReduceOp::sum);
  reduce->wait();
  scatter->wait();
  expect_matches(later, mine, gr.label + " ireduce_scatter_v");
  expect_matches(other, reference_sum<T>(salt + 2, gr.members, 7), gr.label + " iall_reduce beside it");

  // Non-blocking into this rank's own block, two in flight on the same group
  // (as ZeRO-2's two gradient buckets are), waited for oldest first.
  std::vector<T> first(full), second = contribution<T>(salt + 3, me, total);
  T* first_own = first.data() + offsets[size_t(k)];
  T* second_own = second.data() + offsets[size_t(k)];
  auto a = gr.comm->ireduce_scatter_v(first.data(), first_own, counts);
  auto b = gr.comm->ireduce_scatter_v(second.data(), second_own, counts);
  a->wait();
  b->wait();
  expect_matches(std::vector<T>(first_own, first_own + counts[size_t(k)]), mine,
                 gr.label + " ireduce_scatter_v into its own block");
  const auto sum2 = reference_sum<T>(salt + 3, gr.members, total);
  expect_matches(std::vector<T>(second_own, second_own + counts[size_t(k)]),
                 std::vector<std::decay_t<decltype(sum2[0])>>(sum2.begin() + offsets[size_t(k)],
                                                              sum2.begin() + offsets[size_t(k) + 1]),
                 gr.label + " second ireduce_scatter_v into its own block");
}

template <typename T>
void check_broadcast(const Group& gr, int64_t me, uint64_t salt) {
  const int64_t n = 11, root = gr.comm->size() - 1;
  std::vector<T> data = contribution<T>(salt, me, n);
  gr.comm->broadcast(data.data(), n, root);
  EXPECT_EQ(data, contribution<T>(salt, gr.members[size_t(root)], n)) << gr.label << " broadcast";
}

// The communicator holds exactly the ranks RankGrid assigns, in group-rank order.
void check_membership(const Group& gr, int64_t me) {
  std::vector<int64_t> ranks(size_t(gr.comm->size()));
  gr.comm->all_gather(&me, ranks.data(), 1);
  EXPECT_EQ(ranks, gr.members) << gr.label << " members";
  EXPECT_EQ(gr.members[size_t(gr.comm->rank())], me) << gr.label;
}

// Around a ring of the group: blocking send/recv ordered by parity, then
// isend/irecv, then two tagged messages received in the opposite order.
void check_ring(const Group& gr, int64_t me, uint64_t salt) {
  Comm& c = *gr.comm;
  const int64_t size = c.size(), k = c.rank();
  const int64_t next = (k + 1) % size, prev = (k + size - 1) % size;
  const int64_t n = 9;
  const int64_t from = gr.members[size_t(prev)];
  const std::vector<float> mine = contribution<float>(salt, me, n);
  std::vector<float> got(static_cast<size_t>(n));
  if (size > 1) {
    if (k % 2 == 0) {
      c.send(mine.data(), n, next, 3);
      c.recv(got.data(), n, prev, 3);
    } else {
      c.recv(got.data(), n, prev, 3);
      c.send(mine.data(), n, next, 3);
    }
    EXPECT_EQ(got, contribution<float>(salt, from, n)) << gr.label << " send/recv ring";
  }

  std::vector<int64_t> got64(static_cast<size_t>(n));
  const std::vector<int64_t> mine64 = contribution<int64_t>(salt + 1, me, n);
  auto r = c.irecv(got64.data(), n, prev, 4);
  auto s = c.isend(mine64.data(), n, next, 4);
  s->wait();
  r->wait();
  EXPECT_EQ(got64, contribution<int64_t>(salt + 1, from, n)) << gr.label << " isend/irecv ring";

  const std::vector<int32_t> a = contribution<int32_t>(salt + 2, me, 3);
  const std::vector<int32_t> b = contribution<int32_t>(salt + 3, me, 4);
  auto sa = c.isend(a.data(), 3, next, 1);
  auto sb = c.isend(b.data(), 4, next, 2);
  std::vector<int32_t> gb(4), ga(3);
  c.recv(gb.data(), 4, prev, 2);
  c.recv(ga.data(), 3, prev, 1);
  sa->wait();
  sb->wait();
  EXPECT_EQ(ga, contribution<int32_t>(salt + 2, from, 3)) << gr.label << " tag 1";
  EXPECT_EQ(gb, contribution<int32_t>(salt + 3, from, 4)) << gr.label << " tag 2";
}

TEST(CommMpi, EveryCollectiveOnEveryGroupOfEveryLayout) {
  const int64_t world = mpi_world_size(), me = mpi_world_rank();
  uint64_t salt = 0;
  int64_t layouts = 0;
  for (auto [tp, pp, dp] : factorizations(world)) {
    const std::string layout = fmt::format("tp{}-pp{}-dp{}", tp, pp, dp);
    ProcessGroups g = mpi_process_groups(tp, pp, dp);
    const RankGrid grid(world, tp, pp, dp);
    EXPECT_EQ(g.tp_rank(), grid.coords(me).tp) << layout;
    EXPECT_EQ(g.pp_rank(), grid.coords(me).pp) << layout;
    EXPECT_EQ(g.dp_rank(), grid.coords(me).dp) << layout;
    EXPECT_EQ(g.tp->name(), "tp");
    for (const Group& gr : groups_under_test(g, grid, me, layout)) {
      check_membership(gr, me);
      check_all_reduce<float>(gr, me, salt += 10);
      check_all_reduce<double>(gr, me, salt += 10);
      check_all_reduce<int32_t>(gr, me, salt += 10);
      check_all_reduce<int64_t>(gr, me, salt += 10);
      check_all_gather<float>(gr, me, salt += 10);
      check_all_gather<int64_t>(gr, me, salt += 10);
      check_reduce_scatter<float>(gr, me, salt += 10);
      check_reduce_scatter<double>(gr, me, salt += 10);
      check_reduce_scatter<int32_t>(gr, me, salt += 10);
      check_uneven<float>(gr, me, salt += 10);
      check_uneven<int64_t>(gr, me, salt += 10);
      check_broadcast<double>(gr, me, salt += 10);
      check_broadcast<int32_t>(gr, me, salt += 10);
      gr.comm->barrier();
    }
    ++layouts;
  }
  EXPECT_GE(layouts, 6);
}

TEST(CommMpi, PointToPointAroundRings) {
  const int64_t world = mpi_world_size(), me = mpi_world_rank();
  uint64_t salt = 1'000'000;
  for (auto [tp, pp, dp] : factorizations(world)) {
    if (tp > 2 && pp > 1) continue;  // enough pipeline shapes; keeps the test short
    const std::string layout = fmt::format("tp{}-pp{}-dp{}", tp, pp, dp);
    ProcessGroups g = mpi_process_groups(tp, pp, dp);
    const RankGrid grid(world, tp, pp, dp);
    const auto groups = groups_under_test(g, grid, me, layout);
    check_ring(groups[2], me, salt += 10);  // the pipeline ring
    // The ring's neighbours are RankGrid's pp_rank +- 1 at the same tp/dp position.
    int64_t from_prev = -1;
    auto r = g.pp->irecv(&from_prev, 1, (g.pp_rank() + pp - 1) % pp, 9);
    g.pp->send(&me, 1, (g.pp_rank() + 1) % pp, 9);
    r->wait();
    EXPECT_EQ(from_prev, grid.shift(Axis::pp, me, -1)) << layout;
  }
  ProcessGroups g = mpi_process_groups(1, 1, world);
  check_ring({g.world,
              [&] {
                std::vector<int64_t> v(static_cast<size_t>(world));
                std::iota(v.begin(), v.end(), 0);
                return v;
              }(),
              "world"},
             me, salt += 10);
  g.world->barrier();
}

TEST(CommMpi, MismatchedWorldIsAnInputError) {
  const int64_t world = mpi_world_size();
  try {
    mpi_process_groups(2, 2, world / 2);  // twice the world
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("layout tp2-pp2-dp{} needs {} ranks, mpirun started {}", world / 2,
                          2 * world, world));
  }
  Layout l;
  l.tp = 1;
  l.pp = world + 1;
  try {
    mpi_process_groups(l);
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("layout tp1-pp{}-dp1 needs {} ranks, mpirun started {}", world + 1,
                          world + 1, world));
  }
  EXPECT_THROW(mpi_process_groups(0, 1, world), InputError);
}

TEST(CommMpi, MpiErrorsBecomeCommErrors) {
  const int64_t world = mpi_world_size(), me = mpi_world_rank();
  ProcessGroups g = mpi_process_groups(1, 1, world);
  const int64_t next = (me + 1) % world, prev = (me + world - 1) % world;
  // A message longer than the receive buffer: MPI reports truncation.
  const std::vector<int32_t> five(5, int32_t(me));
  auto s = g.world->isend(five.data(), 5, next, 11);
  std::vector<int32_t> three(3);
  try {
    g.world->recv(three.data(), 3, prev, 11);
    ADD_FAILURE() << "expected a CommError";
  } catch (const CommError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("rank {}: MPI call MPI_Irecv (recv on the world group from "
                                 "rank {} with tag 11, completed by MPI_Test) failed at ",
                                 me, prev)),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("comm_mpi.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("TRUNCATE"), std::string::npos) << m;
  }
  s->wait();
  // A shorter message than asked for is caught by the length check.
  const std::vector<int32_t> two(2, int32_t(me));
  auto s2 = g.world->isend(two.data(), 2, next, 12);
  std::vector<int32_t> four(4);
  try {
    g.world->recv(four.data(), 4, prev, 12);
    ADD_FAILURE() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("received 2 elements, expected 4"), std::string::npos)
        << e.what();
  }
  s2->wait();
  // A bad peer or tag is a bug in weft, caught before MPI sees it.
  EXPECT_THROW(g.world->send(five.data(), 5, world, 0), InternalError);
  EXPECT_THROW(g.world->send(five.data(), 5, next, -1), InternalError);
  g.world->barrier();
}

// Sets *flag after `delay` on a thread of its own, as the tuner's trial timer
// would; the thread never calls MPI.
std::thread set_after(std::atomic<bool>* flag, std::chrono::milliseconds delay) {
  return std::thread([flag, delay] {
    std::this_thread::sleep_for(delay);
    flag->store(true);
  });
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What an abandoned operation may still write into stays allocated until the
// process exits, as the tuner's graveyard keeps a trial's state: reachable
// from here, so LeakSanitizer counts it as kept rather than lost.
template <typename T>
T* keep_until_exit(T* p) {
  static auto* kept = new std::vector<const void*>();
  kept->push_back(p);
  return p;
}

// A trial whose ranks no longer meet: rank 0 skips an all_reduce that the
// others wait in until their cancel flags are set. The abandoned groups, the
// flag they point to and the buffer of the pending all_reduce are leaked on
// purpose (see comm_mpi.h): MPI may still complete the operation, and freeing
// a communicator with a pending collective is erroneous. A fresh duplicate of
// the world then works.
TEST(CommMpi, CancelAbandonsACollectiveAPeerNeverJoins) {
  const int64_t world = mpi_world_size(), me = mpi_world_rank();
  auto* cancel = keep_until_exit(new std::atomic<bool>(false));
  ProcessGroups g = mpi_process_groups(2, 1, world / 2, {}, cancel);
  const int64_t n = 5;
  auto* pending = keep_until_exit(new std::vector<int64_t>(size_t(n), me + 1));
  if (me != 0) {
    const auto start = std::chrono::steady_clock::now();
    std::thread timer = set_after(cancel, std::chrono::milliseconds(300));
    try {
      g.world->all_reduce(pending->data(), n, ReduceOp::sum);
      ADD_FAILURE() << "expected CommAbandoned";
    } catch (const CommAbandoned& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("rank {}: all_reduce on the world group abandoned: the trial was "
                            "cancelled",
                            me));
    }
    timer.join();
    const double waited = seconds_since(start);
    EXPECT_GE(waited, 0.29) << "the all_reduce returned before the flag was set";
    EXPECT_LT(waited, 10.0) << "the all_reduce noticed the flag late";
  } else {
    cancel->store(true);
  }
  // Every group of the trial carries the flag, and a call on a cancelled
  // communicator starts nothing.
  int64_t x = me;
  EXPECT_THROW(g.tp->all_reduce(&x, 1, ReduceOp::sum), CommAbandoned);
  EXPECT_THROW(g.dp->barrier(), CommAbandoned);
  EXPECT_THROW(g.pp->isend(&x, 1, 0, 1), CommAbandoned);
  for (std::unique_ptr<Comm>& c : g.owned) keep_until_exit(c.release());

  std::unique_ptr<Comm> control = mpi_world_dup("control");
  EXPECT_EQ(control->name(), "control");
  EXPECT_EQ(control->size(), world);
  EXPECT_EQ(control->rank(), me);
  std::vector<int64_t> sum(size_t(n), me + 1);
  control->all_reduce(sum.data(), n, ReduceOp::sum);
  EXPECT_EQ(sum, std::vector<int64_t>(size_t(n), world * (world + 1) / 2));
  control->barrier();
}

// A receive whose sender never sends: wait() returns once the flag is set, by
// throwing, and destroying the request leaves the receive to MPI instead of
// waiting for it forever. The communicator, flag and buffer are leaked as above.
TEST(CommMpi, CancelAbandonsAReceiveThatNeverCompletes) {
  const int64_t world = mpi_world_size(), me = mpi_world_rank();
  auto* cancel = keep_until_exit(new std::atomic<bool>(false));
  std::unique_ptr<Comm> trial = mpi_world_dup("trial", cancel);
  const int64_t from = (me + 1) % world;
  auto* never = keep_until_exit(new std::vector<float>(16));
  std::unique_ptr<CommRequest> r = trial->irecv(never->data(), 16, from, 5);
  const auto start = std::chrono::steady_clock::now();
  std::thread timer = set_after(cancel, std::chrono::milliseconds(200));
  try {
    r->wait();
    ADD_FAILURE() << "expected CommAbandoned";
  } catch (const CommAbandoned& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("rank {}: irecv on the trial group from rank {} with tag 5 abandoned: "
                          "the trial was cancelled",
                          me, from));
  }
  timer.join();
  EXPECT_GE(seconds_since(start), 0.19);
  r.reset();
  EXPECT_LT(seconds_since(start), 10.0);
  keep_until_exit(trial.release());

  std::unique_ptr<Comm> after = mpi_world_dup("after");
  int64_t ranks = 1;
  after->all_reduce(&ranks, 1, ReduceOp::sum);
  EXPECT_EQ(ranks, world);
}

}  // namespace
}  // namespace weft::parallel
