#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/units.h"
#include "memory/arena.h"
#include "test_util.h"

namespace weft::memory {
namespace {

bool all_zero(const void* p, int64_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  return std::all_of(b, b + bytes, [](unsigned char x) { return x == 0; });
}

void expect_same_accounting(const Arena& a, const Arena& b) {
  for (Category c : kAllCategories) {
    EXPECT_EQ(a.in_use(c), b.in_use(c)) << to_string(c);
    EXPECT_EQ(a.peak(c), b.peak(c)) << to_string(c);
  }
  EXPECT_EQ(a.in_use_total(), b.in_use_total());
  EXPECT_EQ(a.peak_total(), b.peak_total());
}

// Random allocate/release traffic through a reserved arena and an unreserved
// one side by side: the reserved one must hand out disjoint, aligned, zeroed
// pieces and account exactly as the unreserved one does.
TEST(Arena, ReservedMatchesUnreservedUnderRandomTraffic) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const int64_t reserve = 4 * MiB, live_cap = reserve / 4;
  Arena reserved, plain;
  reserved.reserve(reserve);
  ASSERT_EQ(reserved.reserved(), reserve);
  ASSERT_EQ(reserved.largest_free(), reserve);

  struct Live {
    unsigned char* p;
    void* q;  // the same tensor in the unreserved arena
    int64_t bytes;
  };
  std::vector<Live> live;
  int64_t live_bytes = 0;
  std::uniform_int_distribution<int64_t> size_dist(0, 64 * KiB);
  for (int step = 0; step < 4000; ++step) {
    const int64_t bytes = rng() % 8 == 0 ? int64_t(rng() % 3) : size_dist(rng);
    const bool grow = live.empty() || (live_bytes + bytes <= live_cap && rng() % 5 < 3);
    if (grow) {
      const Category c = kAllCategories[rng() % kCategories];
      void* raw = nullptr;
      try {
        raw = reserved.allocate(c, bytes, "t" + std::to_string(step));
      } catch (const OutOfMemory&) {
        // Only fragmentation may refuse, since the live bytes stay far below the block.
        EXPECT_LT(reserved.largest_free(), (std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
        continue;
      }
      auto* p = static_cast<unsigned char*>(raw);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
      ASSERT_TRUE(all_zero(p, bytes)) << "step " << step << ", " << bytes << " bytes";
      for (const auto& l : live)
        ASSERT_TRUE(p + std::max<int64_t>(bytes, 1) <= l.p || l.p + std::max<int64_t>(l.bytes, 1) <= p)
            << "step " << step << " overlaps a live piece";
      // Dirty the piece so that reuse without zero-filling would be caught.
      std::memset(p, 0xAB, size_t(bytes));
      live.push_back({p, plain.allocate(c, bytes, "t" + std::to_string(step)), bytes});
      live_bytes += bytes;
    } else {
      const size_t i = rng() % live.size();
      reserved.release(live[i].p);
      plain.release(live[i].q);
      live_bytes -= live[i].bytes;
      live[i] = live.back();
      live.pop_back();
    }
    expect_same_accounting(reserved, plain);
    if (testing::Test::HasFailure()) return;
  }
  for (const auto& l : live) {
    reserved.release(l.p);
    plain.release(l.q);
  }
  expect_same_accounting(reserved, plain);
  EXPECT_EQ(reserved.in_use_total(), 0);
  // Every piece merged back into one.
  EXPECT_EQ(reserved.largest_free(), reserve);
}

TEST(Arena, FreedNeighboursCoalesce) {
  Arena a;
  a.reserve(10 * 64);
  std::vector<char*> piece;
  for (int i = 0; i < 10; ++i) piece.push_back(static_cast<char*>(a.allocate(Category::workspace, 64, "p")));
  for (int i = 1; i < 10; ++i) EXPECT_EQ(piece[i], piece[0] + 64 * i);  // first fit packs them
  EXPECT_EQ(a.largest_free(), 0);

  // Holes at 0 and 2 are 64 bytes each: 128 does not fit although 128 are free.
  a.release(piece[0]);
  a.release(piece[2]);
  EXPECT_EQ(a.largest_free(), 64);
  WEFT_EXPECT_THROW_MSG(a.allocate(Category::activations, 128, "big"), OutOfMemory, "big",
                        "activations", "128 B", "640 B", "largest free piece 64 B");
  // Freeing 1 merges with both neighbours.
  a.release(piece[1]);
  EXPECT_EQ(a.largest_free(), 192);
  EXPECT_EQ(a.allocate(Category::activations, 192, "big"), piece[0]);

  // Merging with the previous piece only, then with the next only.
  a.release(piece[5]);
  a.release(piece[6]);
  EXPECT_EQ(a.largest_free(), 128);
  a.release(piece[8]);
  a.release(piece[7]);
  EXPECT_EQ(a.largest_free(), 256);
  a.release(piece[9]);
  EXPECT_EQ(a.largest_free(), 320);
  // First fit: a small request takes the lowest hole.
  a.release(piece[3]);
  EXPECT_EQ(a.allocate(Category::workspace, 1, "small"), piece[3]);
}

TEST(Arena, ZeroByteAllocationsGetTheirOwnAddress) {
  Arena a;
  a.reserve(4 * 64);
  void* x = a.allocate(Category::workspace, 0, "x");
  void* y = a.allocate(Category::workspace, 0, "y");
  EXPECT_NE(x, y);
  EXPECT_EQ(a.in_use_total(), 0);
  a.release(x);
  a.release(y);
  EXPECT_EQ(a.largest_free(), 4 * 64);
}

TEST(Arena, ReservationTheAllocatorRefusesFailsAtOnce) {
  Arena a(limited_allocator(MiB, host_allocator()));
  WEFT_EXPECT_THROW_MSG(a.reserve(2 * MiB), OutOfMemory, "host", "2.0 MiB", "2097152", "reserving");
  // The arena is as it was: nothing reserved, and a reservation that fits still works.
  EXPECT_EQ(a.reserved(), 0);
  EXPECT_EQ(a.in_use_total(), 0);
  a.reserve(MiB);
  EXPECT_EQ(a.reserved(), MiB);
  EXPECT_NE(a.allocate(Category::weights, MiB, "w"), nullptr);
}

TEST(Arena, LimitedAllocatorRefusesOnlyAboveItsLimit) {
  Arena a(limited_allocator(KiB, host_allocator()));
  void* p = a.allocate(Category::weights, KiB, "ok");
  EXPECT_TRUE(all_zero(p, KiB));
  WEFT_EXPECT_THROW_MSG(a.allocate(Category::grads, KiB + 1, "layers.0.wq.grad"), OutOfMemory,
                        "layers.0.wq.grad", "grads", "failed");
  a.release(p);
}

TEST(Arena, AllocationPastTheReservationNamesTensorCategoryAndSizes) {
  Arena a;
  a.reserve(MiB);
  void* p = a.allocate(Category::weights, 768 * KiB, "layers.0.mlp.up");
  WEFT_EXPECT_THROW_MSG(a.allocate(Category::activations, 512 * KiB, "layers.3.attn.out"), OutOfMemory,
                        "layers.3.attn.out", "activations", "512.0 KiB", "1.0 MiB", "768.0 KiB in use");
  WEFT_EXPECT_THROW_MSG(a.allocate(Category::logits, 4 * GiB, "logits"), OutOfMemory, "logits",
                        "4.00 GiB", "1.0 MiB");
  // A refused allocation changes no accounting.
  EXPECT_EQ(a.in_use_total(), 768 * KiB);
  EXPECT_EQ(a.in_use(Category::activations), 0);
  EXPECT_EQ(a.peak(Category::activations), 0);
  a.release(p);
  EXPECT_NE(a.allocate(Category::activations, MiB, "whole"), nullptr);
}

TEST(Arena, ReserveOnlyOnAnEmptyArena) {
  Arena a;
  void* p = a.allocate(Category::weights, 64, "w");
  EXPECT_THROW(a.reserve(MiB), InternalError);
  a.release(p);
  a.reserve(MiB);
  EXPECT_THROW(a.reserve(MiB), InternalError);
}

}  // namespace
}  // namespace weft::memory
