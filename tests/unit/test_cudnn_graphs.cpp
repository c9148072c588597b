// The cudnn attention kind's graphs as the cuDNN frontend sees them, on a
// machine without a GPU: for compute capabilities 8.0 and 9.0 and the cuDNN
// library loaded, every shape the kind claims (attention_cudnn::shape_handled)
// must validate in both directions, and the shape it refuses for the
// frontend's sake (one query and one key) must be refused by the frontend.
// Building plans and running them needs a device (tests/gpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

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

}  // namespace
}  // namespace weft::kernels
