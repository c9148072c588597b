// The training loop's text and records (loop.cpp): the metrics file's first
// record of a launch, the note on samples read more than once, and the
// memory table printed at the end of a run.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device_spec.h"
#include "data/loader.h"
#include "trainer/loop.h"
#include "trainer/resume_check.h"

namespace weft::trainer::detail {

// What the CPU's independent memory row counts.
inline constexpr const char* kHostIndependent =
    "growth of the process's peak resident memory (VmHWM) from before the run was built, counted after loading "
    "and without checkpoint saves";

// The first record of each launch in metrics.jsonl: what the records after
// it belong to.
nlohmann::json metrics_header(const TrainConfig& c, int64_t world, int64_t done, const std::string& resumed_from,
                              const std::string& data, const std::vector<RunChange>& changes);
// Whether the run reads its training samples more than once: a warning when
// the data holds fewer windows than one step reads (every step repeats
// samples: the model memorises them), a note when the steps go past one
// epoch (samples repeat from then on); empty otherwise.
std::string data_repeat_note(const data::Loader& loader, const RunSpec& run, int64_t steps);
// Measured peak against the memory model, per category, and the
// independent count of the kernel or the driver.
std::string memory_table(const TrainReport& r, const DeviceSpec& d);

}  // namespace weft::trainer::detail
