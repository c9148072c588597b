// `weft calibrate`: device profiles for the cost model.
//   weft calibrate --public [CSV] --out DIR   fits the GPU presets' profiles
//                                             to public measured runs
#include <filesystem>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"
#include "tuner/fidelity.h"

namespace weft::cli {

namespace {

struct CalibrateArgs {
  std::string public_csv;
  bool fit_public = false;
  std::string out = "calibration/profiles";
};

int run_fit_public(const CalibrateArgs& a) {
  const std::string csv = a.public_csv.empty() ? tuner::calibration_dir() + "/public_runs.csv" : a.public_csv;
  const auto set = tuner::public_runs_load(csv);
  for (const char* family : {"a100", "hopper"}) {
    const auto p = tuner::fidelity_profile(set, family, std::filesystem::path(csv).filename().string());
    const std::string path = (std::filesystem::path(a.out) / (std::string(family) + ".json")).string();
    tuner::profile_save(p, path);
    fmt::print("{}: fitted to {} rows, rms error of the step time {:.1f}% -> {:.1f}%; wrote {}\n", family,
               [&] {
                 int64_t n = 0;
                 for (const auto& [s, c] : p.provenance["fitted_rows"].items()) n += c.get<int64_t>();
                 return n;
               }(),
               100 * p.provenance["rms_error_before"].get<double>(),
               100 * p.provenance["rms_error_after"].get<double>(), path);
  }
  return 0;
}

}  // namespace

Command add_calibrate_command(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* sub = app.add_subcommand("calibrate", "Device profiles for the cost model: fit the GPU presets to public "
                                              "measured runs (--public)");
  sub->add_flag("--public", a->fit_public, "Fit the GPU presets' profiles to the public measured runs");
  sub->add_option("--csv", a->public_csv, "The public runs (default: the project's calibration/public_runs.csv)");
  sub->add_option("--out", a->out, "Folder the fitted profiles are written to")->capture_default_str();
  return {sub, [a] {
            if (!a->fit_public) throw InputError("weft calibrate: give --public (fit the GPU presets to public runs)");
            return run_fit_public(*a);
          }};
}

}  // namespace weft::cli
