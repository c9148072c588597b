// The cudnn attention kind's graphs as the cuDNN frontend sees them, on a
// machine without a GPU: for compute capabilities 8.0 and 9.0 and the cuDNN
// library loaded, every shape the kind claims (attention_cudnn::shape_handled)
// must validate in both directions, and the shape it refuses for the
// frontend's sake (one query and one key) must be refused by the frontend.
// Building plans and running them needs a device (tests/gpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "kernels/attention/attention_cudnn.h"

namespace weft::kernels {
namespace {

struct Shape {
  int64_t B, T, H, H_kv, D;
};

std::string name(const Shape& s, bool backward, int sm) {
  return fmt::format("{} sm{} B{} T{} H{} H_kv{} D{}", backward ? "backward" : "forward", sm, s.B, s.T, s.H,
                     s.H_kv, s.D);
}

TEST(CudnnGraphs, EveryClaimedShapeValidates) {
  // Odd lengths, GQA from 1:1 to 8:1, each head size class, and the
  // training shapes of the benchmarks.
  const Shape shapes[] = {{1, 2, 4, 1, 64},    {2, 7, 4, 2, 64},      {1, 257, 4, 2, 128}, {3, 130, 6, 3, 96},
                          {2, 70, 8, 8, 8},    {1, 2048, 32, 8, 64},  {1, 2048, 32, 8, 128},
                          {4, 8192, 32, 8, 128}, {1, 8192, 64, 8, 128}};
  for (const Shape& s : shapes) {
    ASSERT_TRUE(attention_cudnn::shape_handled(s.T, s.D)) << s.T << " " << s.D;
    for (int sm : {80, 90})
      for (bool backward : {false, true})
        EXPECT_EQ(attention_cudnn::validate_graph(s.B, s.T, s.H, s.H_kv, s.D, backward, sm), "")
            << name(s, backward, sm);
  }
}

TEST(CudnnGraphs, TheRefusedShapesAreTheFrontendsToo) {
  // One query and one key: the frontend has no backward for it.
  EXPECT_FALSE(attention_cudnn::shape_handled(1, 64));
  for (int sm : {80, 90})
    EXPECT_NE(attention_cudnn::validate_graph(2, 1, 4, 2, 64, /*backward=*/true, sm), "") << "sm" << sm;
  // Head sizes beyond whole 16-byte rows up to 128 are not claimed.
  EXPECT_FALSE(attention_cudnn::shape_handled(64, 12));
  EXPECT_FALSE(attention_cudnn::shape_handled(64, 256));
}

// The blocks of context parallelism the kind claims (attention_cudnn.h:
// causal to their end, fully visible) validate in both directions, inside
// larger tensors: the ring's diagonal and earlier-key blocks, the
// all-gather's query chunks against their key prefixes (the first, the
// longest); and the blocks it does not claim are refused before the
// frontend sees them.
TEST(CudnnGraphs, TheBlocksOfContextParallelismValidate) {
  struct Block {
    const char* name;
    int64_t T, Tk, qo, ko, q_rows, kv_rows;
  };
  const int64_t c = 512, cp = 4, Tl = 2 * c, Tf = 2 * cp * c;
  const Block claimed[] = {{"ring diagonal", c, c, 5 * c, 5 * c, Tl, Tl},
                           {"ring earlier keys", c, c, 6 * c, 1 * c, Tl, Tl},
                           {"all-gather first chunk", c, c, 0, 0, Tl, Tf},
                           {"all-gather prefix", c, 6 * c, 5 * c, 0, Tl, Tf},
                           {"all-gather whole prefix", c, Tf, Tf - c, 0, Tl, Tf},
                           {"odd lengths", 130, 390, 260, 0, 300, 500}};
  for (const Block& b : claimed) {
    attention_cudnn::Mask mask{};
    EXPECT_TRUE(attention_cudnn::block_mask(b.T, b.Tk, b.qo, b.ko, &mask)) << b.name;
    for (int sm : {80, 90})
      for (bool backward : {false, true})
        for (const auto& [H, H_kv, D] : {std::tuple<int64_t, int64_t, int64_t>{8, 2, 128}, {4, 4, 64}})
          EXPECT_EQ(attention_cudnn::validate_block_graph(2, b.T, b.Tk, H, H_kv, D, b.qo, b.ko, b.q_rows, b.kv_rows,
                                                          backward, sm),
                    "")
              << b.name << (backward ? " backward" : " forward") << " sm" << sm << " H " << H << " D " << D;
  }
  attention_cudnn::Mask mask{};
  ASSERT_TRUE(attention_cudnn::block_mask(c, 4 * c, 3 * c, 0, &mask));
  EXPECT_EQ(mask, attention_cudnn::Mask::causal);
  ASSERT_TRUE(attention_cudnn::block_mask(c, c, 3 * c, 0, &mask));
  EXPECT_EQ(mask, attention_cudnn::Mask::visible);
  // Rows that see no key, keys after the queries, a prefix that ends inside
  // the queries: not claimed.
  const Block refused[] = {{"partly visible", 50, 120, 100, 60, 200, 200},
                           {"keys after queries", 50, 60, 0, 100, 200, 200},
                           {"prefix ending inside the queries", c, 3 * c + c / 2, 3 * c, 0, Tl, Tf}};
  for (const Block& b : refused) {
    EXPECT_FALSE(attention_cudnn::block_mask(b.T, b.Tk, b.qo, b.ko, nullptr)) << b.name;
    EXPECT_NE(attention_cudnn::validate_block_graph(2, b.T, b.Tk, 4, 2, 64, b.qo, b.ko, b.q_rows, b.kv_rows, true, 90),
              "")
        << b.name;
  }
}

}  // namespace
}  // namespace weft::kernels
