// Prints which findings of the public Llama layout studies the cost and
// memory models reproduce, scenario by scenario.
#include <fmt/format.h>

#include "calibration/findings.h"

int main() {
  using namespace weft::calibration;
  int reproduced = 0, total = 0;
  for (const auto& s : study_scenarios()) {
    fmt::print("{} on {} x a100-80gb, seq {}, global batch {}\n", s.model, s.gpus, s.seq,
               s.global_batch);
    for (const auto& f : check_findings(s)) {
      ++total;
      reproduced += f.reproduced;
      fmt::print("  [{}] {}: {}\n", f.reproduced ? "yes" : " no", f.claim, f.evidence);
    }
  }
  fmt::print("reproduced {} of {} checks\n", reproduced, total);
  return 0;
}
