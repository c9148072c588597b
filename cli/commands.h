// The weft subcommands. Each registers its options on the app (one option
// table gives the parser and the help) and returns the exit code when run.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace weft::cli {

struct Command {
  CLI::App* sub;            // the subcommand's parser
  std::function<int()> run; // runs it after parsing; returns the exit code
};

Command add_train_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_tune_command(CLI::App& app);
Command add_recipe_command(CLI::App& app);
Command add_presets_command(CLI::App& app);
Command add_data_command(CLI::App& app);
Command add_export_command(CLI::App& app);
Command add_calibrate_command(CLI::App& app);
Command add_report_command(CLI::App& app);

// Writes <out_dir>/report.html after a training run (finished or stopped)
// and names it on `log`; a page that cannot be written is a warning, never a
// failed run.
void write_run_report(const std::string& out_dir, std::FILE* log);

}  // namespace weft::cli
