// The weft executable. Library code throws typed errors; this is the one place
// that turns them into a message and an exit code: 2 for bad input (also a
// JSON value of the wrong type and a host allocation that cannot be had), 130 or
// 143 for work stopped by SIGINT or SIGTERM (core/stop.h), 1 for anything
// else.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <new>
#include <cstdio>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/stop.h"
#include "trainer/build_info.h"

namespace {

// Every number on the command line is checked as text before CLI11 converts
// it, which would otherwise clamp 99999999999999999999 to INT64_MAX and take
// nan and inf: whole numbers must fit 64 bits, real numbers must be finite.
// Ranges are each option's own (the commands check them, naming the option).
void add_number_checks(CLI::App& app) {
  const CLI::Validator whole(
      [](std::string& v) -> std::string {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (ec == std::errc::result_out_of_range)
          return "'" + v + "' is past the 64-bit range of a whole number (at most 9223372036854775807)";
        if (ec != std::errc() || end != v.data() + v.size()) return "'" + v + "' is not a whole number";
        return {};
      },
      "", "whole number");
  const CLI::Validator finite(
      [](std::string& v) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double x = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end != '\0') return "'" + v + "' is not a number";
        if (!std::isfinite(x) || errno == ERANGE) return "'" + v + "' is not a finite number";
        return {};
      },
      "", "finite number");
  for (CLI::App* sub : app.get_subcommands({})) {
    for (CLI::Option* o : sub->get_options()) {
      const std::string type = o->get_type_name();
      if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) o->check(whole);
      else if (type.rfind("FLOAT", 0) == 0) o->check(finite);
    }
    add_number_checks(*sub);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft: trains Llama-family models and tunes their parallel layout"};
  app.set_version_flag("--version", fmt::format("weft {} (commit {})", WEFT_VERSION, weft::build_commit()));
  app.require_subcommand(1);
  // A repeated option takes its last value, as scripts that append overrides expect.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  const std::vector<weft::cli::Command> commands = {
      weft::cli::add_train_command(app),
      weft::cli::add_eval_command(app),
      weft::cli::add_tune_command(app),
      weft::cli::add_recipe_command(app),
      weft::cli::add_presets_command(app),
      weft::cli::add_data_command(app),
      weft::cli::add_export_command(app),
      weft::cli::add_calibrate_command(app),
      weft::cli::add_report_command(app),
  };

  add_number_checks(app);
  const bool known = argc > 1 && std::any_of(commands.begin(), commands.end(), [&](const auto& c) {
    return c.sub->get_name() == argv[1];
  });
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::vector<std::string> names;
    for (const auto& c : commands) names.push_back(c.sub->get_name());
    std::fprintf(stderr, "weft: error: unknown command '%s'; commands: %s (see weft --help)\n",
                 argv[1], fmt::format("{}", fmt::join(names, ", ")).c_str());
    return 2;
  }
  // An empty argument is never a value weft takes, and CLI11 does not return
  // from one: refused before parsing, naming where it stands.
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '\0') continue;
    const bool after_option = i > 1 && argv[i - 1][0] == '-' && argv[i - 1][1] == '-';
    std::fprintf(stderr, "weft: error: argument %d is empty%s; give %s or leave it out\n", i,
                 after_option ? (std::string(" (the value of ") + argv[i - 1] + ")").c_str() : "",
                 after_option ? "a value" : "something");
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // An option the subcommand lacks is most often a slip: name the nearest.
    std::string hint;
    for (const auto& c : commands)
      if (argc > 1 && c.sub->get_name() == argv[1])
        hint = weft::cli::option_suggestions(*c.sub, std::vector<std::string>(argv + 2, argv + argc));
    std::fprintf(stderr, "weft: error: %s%s (see weft %s--help)\n", e.what(), hint.empty() ? "" : ("; " + hint).c_str(),
                 known ? (std::string(argv[1]) + " ").c_str() : "");
    return 2;
  }
  weft::stop_handlers_install();
  try {
    for (const auto& c : commands)
      if (c.sub->parsed()) {
        const int code = c.run();
        if (weft::stop_requested() && (code == 0 || code >= 128)) {
          std::fprintf(stderr, "weft: stopped by %s\n", weft::stop_signal_name());
          return weft::stop_exit_code();
        }
        return code;
      }
    return 2;
  } catch (const weft::StopRequested& e) {
    std::fprintf(stderr, "weft: %s\n", e.what());
    return weft::stop_exit_code();
  } catch (const weft::InputError& e) {
    std::fprintf(stderr, "weft: error: %s\n", e.what());
    return 2;
  } catch (const nlohmann::json::exception& e) {
    // A JSON value of the wrong type that a reader did not check by name:
    // still the input's fault, and still one line.
    std::fprintf(stderr, "weft: error: a JSON input has a missing or mistyped value: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "weft: error: out of host memory: the sizes asked for (--global-batch, --seq, --eval-samples, "
                 "the model) need more than this machine has\n");
    return 2;
  } catch (const weft::InternalError& e) {
    std::fprintf(stderr, "weft: %s\n", e.what());
    return 1;
  } catch (const weft::Error& e) {
    // A run that cannot go on (non-finite training, out of memory): not bad input.
    std::fprintf(stderr, "weft: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: internal error: %s\n", e.what());
    return 1;
  }
}
