// The report of a tuning with real steps: its trials with predicted against
// measured step time and memory, the pruning summary and the winner, as
// Markdown for people and as JSON (tuning.json, which the HTML page reads).
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tuner/tune.h"

namespace weft::report {

// The report: a table of the candidates with predicted vs measured step time
// and memory, the pruning summary and the winner (markdown), and the same as JSON.
std::string tune_report_md(const tuner::TuneResult& r, const tuner::SpaceContext& ctx);
nlohmann::json tune_report_json(const tuner::TuneResult& r, const tuner::SpaceContext& ctx);

}  // namespace weft::report
