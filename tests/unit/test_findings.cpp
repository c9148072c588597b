// The cost and memory models against the findings of the public Llama layout
// studies (benchmarks/tuner_findings prints the full table).
#include <map>

#include <fmt/format.h>

#include "test_util.h"
#include "calibration/findings.h"

namespace weft::calibration {
namespace {

using namespace weft::tuner;

TEST(Findings, PublicStudiesReproduced) {
  std::map<std::string, int> yes, total;
  for (const auto& s : study_scenarios()) {
    for (const auto& f : check_findings(s)) {
      ++total[f.claim];
      yes[f.claim] += f.reproduced;
      fmt::print("{} {} seq {}: [{}] {}: {}\n", s.model, s.gpus, s.seq, f.reproduced ? "yes" : " no",
                 f.claim, f.evidence);
    }
  }
  ASSERT_EQ(total.size(), 5u);
  // Reproduced in every scenario.
  EXPECT_EQ(yes["micro-batch 1 wins"], total["micro-batch 1 wins"]);
  EXPECT_EQ(yes["no activation checkpointing when memory allows"],
            total["no activation checkpointing when memory allows"]);
  EXPECT_EQ(yes["flash attention with a fused norm wins"], total["flash attention with a fused norm wins"]);
  // Reproduced in all but one scenario (13B at 8k for pp over tp, where the
  // fitted model puts tp2-pp1 0.5% ahead of tp1-pp2; 30B at 2k for sequence
  // parallelism, which it puts 1.4% behind). tests/unit/test_fidelity.cpp
  // holds the models against the studies' measured runs themselves.
  EXPECT_GE(yes["at equal tp*pp, more pp and less tp wins"], total["at equal tp*pp, more pp and less tp wins"] - 1);
  EXPECT_GE(yes["sequence parallelism matters at 30B from 8k tokens and at 65B"],
            total["sequence parallelism matters at 30B from 8k tokens and at 65B"] - 1);
}

}  // namespace
}  // namespace weft::calibration
